"""Which engine an ``HQueue`` or ``HQueueAdmin`` talks to, from its URL."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import forks
from .api import EngineAPI, SubscriptionsAPI, subscriptions_of
from .auth import split_credentials
from .checks import check_timeout
from .errors import InvalidArgument
from .groups.limits import GroupLimits
from .storage import default_url, local_url, normalize_url

#: How an embedded store this process opens is served to other local processes (set by
#: ``hqueue/__init__.py`` from the server layer; None: not served). Kept here, not in
#: sharing.py, so that ``import hqueue`` loads no Thrift until a store is opened.
_serve_store: Callable[[Any, GroupLimits | None], None] | None = None


#: The commands (of the CLI, and the shell) that may make an embedded store where none is:
#: every other one needs a queue, so it fails there, and must not leave an empty store behind.
MAKE_A_STORE = frozenset({"create", "demo"})


def serve_stores_with(serve: Callable[[Any, GroupLimits | None], None]) -> None:
    """Have every ``local://`` store this process opens served with ``serve(engine, limits)``."""
    global _serve_store
    _serve_store = serve


def resolve_url(url: str | None, data_dir: str | os.PathLike[str] | None) -> str:
    """The storage URL for ``url``/``data_dir`` (both None: the default).

    Raises:
        TypeError: both are given, or ``url`` is not a str.
        InvalidArgument: a URL without a scheme (a bare path), with the URL to use.
    """
    if url is not None and data_dir is not None:
        raise TypeError("give 'url' or 'data_dir', not both")
    if data_dir is not None:
        return local_url(os.fspath(data_dir))  # (a path as written, "://" and all; "#" and "?" are refused)
    if url is None:
        return default_url()
    if isinstance(url, os.PathLike):
        raise TypeError(f"'url' must be a str URL, not a path: use data_dir={os.fspath(url)!r}")
    if not isinstance(url, str):
        raise TypeError(f"'url' must be a str (local://DIR, hqueue://host:port, ...), not {type(url).__name__}")
    if "://" not in url:
        where = os.path.abspath(url) if url else "/path"
        raise InvalidArgument(
            f"{url!r} has no scheme: for a store in a directory use url='local://{where}' "
            f"(or data_dir={url!r}); for servers, hqueue://host:port"
        )
    return url


def store_exists(url: str | None) -> bool:
    """Whether the store ``url`` names is there to read, without creating it: an
    embedded store's directory holds one (RocksDB's ``CURRENT`` file; a directory of
    other things is not made one by a read); servers, HBase and memory stores always do."""
    resolved = resolve_url(url, None)
    if resolved.startswith(("hqueue://", "hbase://", "memory://")):
        return True
    path = normalize_url(resolved)[len("local://") :]
    if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
        return True  # not this user's to look in: opening it says so
    return os.path.isfile(os.path.join(path, "CURRENT"))


def store_path(url: str | None) -> str:
    """The directory of the embedded store ``url`` names."""
    return normalize_url(resolve_url(url, None))[len("local://") :]


def missing_store(url: str | None) -> str:
    """What to say when a read finds no store."""
    return f"no hqueue store at {store_path(url)} (pass --url, or create a queue there first)"


def check_options(url: str, token: str | None, timeout: float | None, group_limits: GroupLimits | None) -> None:
    """Refuse the options that do not go with ``url`` (resolved): before anything is opened."""
    if url.startswith("hqueue://"):
        if group_limits is not None:
            raise InvalidArgument(
                "'group_limits' are for a store in this process; hqueue servers have their own "
                "(hqueue server --max-lease, --max-member-in-flight)"
            )
        return
    if token is not None:
        raise InvalidArgument("'token' is for hqueue:// servers, not an in-process store")
    if timeout is not None:
        if not url.startswith("local://"):
            raise InvalidArgument(
                "'timeout' is for hqueue:// servers and a local:// store another process serves, "
                "not a memory:// or hbase:// store"
            )
        check_timeout(timeout)
    if group_limits is not None and not isinstance(group_limits, GroupLimits):
        raise TypeError(f"'group_limits' must be a GroupLimits, not {type(group_limits).__name__}")


def acquire_engine(
    url: str | None,
    data_dir: str | os.PathLike[str] | None,
    token: str | None = None,
    timeout: float | None = None,
    group_limits: GroupLimits | None = None,
) -> EngineAPI:
    """The process's shared engine for that store, or a client of hqueue servers.

    ``token`` and ``timeout`` apply to hqueue servers only, ``group_limits``
    to a store this process serves (a server has its own: ``hqueue server
    --max-lease``…). The client (and thriftpy2 with it) is imported only when
    a URL names servers.
    """
    url = resolve_url(url, data_dir)
    check_options(url, token, timeout, group_limits)
    if url.startswith("hqueue://"):
        from .client import RemoteEngine

        return RemoteEngine(url, token=token, timeout=timeout)
    if url.startswith("local://"):
        from . import sharing

        if _serve_store is not None:
            sharing.serve_with(_serve_store)
        return sharing.open_store(normalize_url(url), group_limits, timeout)
    from .services import open_local

    return open_local(url, group_limits)


class Connected:
    """Holds one reference to a shared engine; ``close()`` drops it."""

    def __init__(
        self,
        url: str | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        timeout: float | None = None,
        group_limits: GroupLimits | None = None,
    ) -> None:
        self._engine: EngineAPI | None = acquire_engine(url, data_dir, token, timeout, group_limits)
        self._fork = forks.generation()  # (not carried across fork(): forks.py)
        # What opened it: handles made from this one (admin.queue, the shell's, splits)
        # reach the same store with the same credentials. Never shown (see url).
        self._opened_with: dict[str, Any] = {"url": resolve_url(url, data_dir), "token": token, "timeout": timeout}

    @property
    def engine(self) -> EngineAPI:
        if self._engine is None:
            raise RuntimeError(f"{type(self).__name__} is closed")
        forks.check(self._fork, type(self).__name__)
        return self._engine

    def subscriptions(self, what: str) -> SubscriptionsAPI:
        """The engine's push subscriptions (both engines serve them: a store in
        this process runs them here, hqueue servers run them there)."""
        return subscriptions_of(self.engine, what)

    @property
    def url(self) -> str:
        return self.engine.url

    def _credentials(self) -> tuple[str, str | None]:
        """(the URL without a token, the token this handle authenticates with, if any)."""
        if not self._opened_with["url"].startswith("hqueue://"):
            return self.engine.url, None
        url, url_token = split_credentials(self._opened_with["url"])
        return url, self._opened_with["token"] or url_token

    def close(self) -> None:
        """Release the store (the last user in the process closes it)."""
        engine, self._engine = self._engine, None
        if engine is not None and self._fork == forks.generation():  # (the parent's is not this process's to close)
            engine.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
