"""Storage backends, chosen by URL.

* ``local:///abs/path`` or ``local://./relative`` (or a bare path): the
  embedded RocksDB store, the default.
* ``hbase://host:9090?prefix=hq_&transport=framed&protocol=compact``: HBase
  through its Thrift gateway.
* ``memory://NAME``: in memory, for the life of the process (unit tests).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ..errors import InvalidArgument
from .base import Cell, Storage

__all__ = ["Cell", "Storage", "default_url", "normalize_url", "open_storage"]

DEFAULT_DATA_DIR = "hqueue-data"


def default_url() -> str:
    """``local://`` + ``$HQUEUE_DATA`` (or ``./hqueue-data``)."""
    return normalize_url(os.environ.get("HQUEUE_DATA", DEFAULT_DATA_DIR))


def normalize_url(url: str) -> str:
    """A canonical URL, so that one store opened twice is shared.

    Raises:
        ValueError: an unknown scheme.
    """
    if not isinstance(url, str) or not url:
        raise TypeError("a storage URL must be a non-empty str")
    if "://" not in url:
        return local_url(url)
    parts = urlsplit(url)
    if parts.scheme == "local":
        if "#" in url:
            raise InvalidArgument(f"a local:// URL has no '#' part: {url!r}")
        if parts.query:
            raise InvalidArgument(f"a local:// URL takes no options ('?…'): {url!r}")
        return local_url(url[len("local://") :], url)
    if parts.scheme in ("hbase", "memory"):
        return url
    raise InvalidArgument(
        f"unknown storage URL scheme {parts.scheme!r} in {url!r} "
        "(use local:///path, hbase://host:port, memory://name, or hqueue://host:port for hqueue servers)"
    )


def local_url(path: str, url: str | None = None) -> str:
    """``local://`` and the real path of the directory ``path``: two spellings of one
    directory (a symlink, a leading "//") opened in one process were two stores on one
    RocksDB directory, which corrupted it. A path with "#", "?" or a control character,
    which a URL would read otherwise (a store elsewhere), is refused."""
    if not path:
        raise InvalidArgument(
            f"{url or path!r} names no directory: use local:///absolute/path or local://relative/path "
            "(local://. for this one)"
        )
    if "#" in path or "?" in path or any(ord(c) < 32 for c in path):
        raise InvalidArgument(f"a store directory's path may not hold '#', '?' or control characters: {path!r}")
    return "local://" + os.path.realpath(path)


def open_storage(url: str) -> Storage:
    """Open the backend a (normalized) URL names."""
    url = normalize_url(url)
    if url.startswith("local://"):
        from .embedded import EmbeddedStorage

        return EmbeddedStorage(url[len("local://") :])
    if url.startswith("memory://"):
        from .memory import MemoryStorage

        return MemoryStorage(url[len("memory://") :])
    from .hbase import HBaseStorage  # type: ignore[import-not-found]

    return HBaseStorage.from_url(url)
