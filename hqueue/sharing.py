"""An embedded store shared by the local processes that open it.

RocksDB lets one process open a directory. The process that opens a
``local://`` store first also serves it to other local processes, over a
Unix socket in the store's directory (:data:`SOCKET_NAME`), with the same
Thrift calls as ``hqueue server`` (server/shared.py starts it); a process
that opens the same URL while another holds the store becomes its client:
a :class:`StoreClient`, the remote client over that socket. Who may
connect is decided by the socket file's permissions, which follow the
directory's: ``0660`` where the directory's group may write in it, else
``0600`` (and a directory others cannot search hides the socket too).
``hqueue server`` on a ``local://`` store serves its socket as well (beside
its TCP port); in a process, whoever serves a store's socket claims it
here (:func:`claim_socket`), so that one does.

The state machine of one store in a client process:

* *client*: calls go over the socket to the serving process.
* The serving process exits or is killed: a connection is refused (the
  socket file of a killed process stays: nobody listens on it). The client
  then tries to open the store itself (RocksDB's lock is free once the
  holder is gone; the first process to get it wins): it *serves* it (the
  stale socket file is removed only by the lock's holder, then bound again),
  and goes on calling, over the socket, to itself. A client that loses the
  race reconnects to the winner. Calls retry so until their deadline
  (``timeout``, 30 s), as an ``hqueue://`` client's do when its server
  restarts, and with the same guarantees: a put whose connection broke
  after it was sent is sent again and written once (hqueue/requests.py:
  the new holder reads the put's record from the store); one with no
  answer by the deadline raises
  ``OutcomeUnknown``. An open scan opens a new scanner on the new holder
  after the last message it returned (client/cursor.py).
* The last handle on the store closes in that process: it stops serving
  (the next process takes over in the same way).
* A client that makes no call notices too: a thread of its process looks
  every :data:`WATCH_INTERVAL` whether the store's lock is held and its
  socket served, and takes the store over once neither has been so for
  :data:`IDLE_TAKEOVER` (so that timers fire while some process has the
  store open, calling or not, and a restarted ``hqueue server`` gets its
  store back first).

IDs never go back and acknowledged writes stay: the new holder reads each
partition's last ID from the store, and every write was in RocksDB's WAL
(``SKIP_WAL`` queues excepted) before its acknowledgement. A timer fires as
one atomic batch (its message written, its entry removed), so a killed
holder's timers fire once, in whichever process holds the store next.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator

from . import forks
from .client.engine import RemoteEngine
from .client.pool import Connection, NotSent, Pool
from .engine import Engine
from .errors import NotAuthorized, StorageError, StorageLocked
from .groups.limits import GroupLimits
from .rpc.failures import unwrapped
from .rpc.unix import short_unix_path, sweep_private
from .services import open_local
from .storage import normalize_url
from .storage.embedded import forked_from_rocksdb
from .storage.lockholder import lock_pid

logger = logging.getLogger(__name__)

#: The socket the serving process listens on, in the store's directory.
SOCKET_NAME = "hqueue.sock"
#: Seconds a second process waits for the store's holder to start listening, when it opens the
#: store, unless the holder said it will (:func:`starting`): then up to the caller's timeout.
STARTUP_WAIT = 3.0
#: ``hqueue.starting.<pid>``, in a store's directory: process ``pid`` opens the store to serve it.
STARTING = "hqueue.starting."
#: Seconds between two tries to take over a store whose serving process is gone.
TAKEOVER_INTERVAL = 0.05
#: Seconds a look at whether a process serves a store's socket may take.
PROBE_TIMEOUT = 1.0
#: Seconds between two looks, by a process that uses a store through the one serving it,
#: at whether some process still holds it.
WATCH_INTERVAL = 1.0
#: Seconds a store must stay without a holder before such a process takes it over though it
#: makes no call (then its timers fire, and the others reconnect to it): long enough for a
#: restarted ``hqueue server`` to get its store back first. A call takes it over at once.
IDLE_TAKEOVER = 10.0

#: What serves an engine to local processes (set by hqueue/__init__.py: server/shared.py, a layer up).
_serve: Callable[[Engine, GroupLimits | None], None] | None = None
#: Who serves each engine's socket in this process (an hqueue server on the store, or server/shared.py).
_listening: weakref.WeakKeyDictionary[Engine, object] = weakref.WeakKeyDictionary()
_listening_lock = threading.Lock()


def serve_with(serve: Callable[[Engine, GroupLimits | None], None]) -> None:
    """Have :func:`open_store` serve every embedded store it opens with ``serve(engine, limits)``."""
    global _serve
    _serve = serve


def store_directory(url: str) -> str:
    """The directory of the ``local://`` store ``url``."""
    return url[len("local://") :]


def socket_path(url: str) -> str:
    """The Unix socket of the ``local://`` store ``url``."""
    return os.path.join(store_directory(url), SOCKET_NAME)


def _held_elsewhere(directory: str) -> bool:
    """Whether another process holds the store's lock (/proc/locks; False where it cannot tell)."""
    return lock_pid(directory) not in (None, os.getpid())


def socket_access(directory: str) -> tuple[int, int | None]:
    """The store's socket's permissions and group: its user's alone (``0600``), or, where the
    store directory's group may write in it, that group's too (``0660``)."""
    info = os.stat(directory)
    return (0o660, info.st_gid) if info.st_mode & stat.S_IWGRP else (0o600, None)


def claim_socket(engine: Engine, server: object) -> str | None:
    """The path ``server`` may listen on to serve ``engine``'s ``local://`` store to local
    processes (a killed holder's socket file there removed), or None: not a ``local://``
    store, or something in this process serves it already. Give it up with :func:`drop_socket`."""
    if not engine.url.startswith("local://"):
        return None
    with _listening_lock:
        if engine in _listening:
            return None
        _listening[engine] = server
    path = socket_path(engine.url)
    # This process holds the store's lock: a socket file there is a stale one, of a process killed
    # (and so are the private directories one killed while making it left).
    sweep_private(os.path.dirname(path))
    _sweep_starting(os.path.dirname(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        drop_socket(engine, server)
        raise StorageError(f"{path} is a directory: hqueue keeps the store's socket there (remove it)") from None
    return path


def drop_socket(engine: Engine, server: object, reshare: bool = False) -> None:
    """``server`` no longer serves ``engine``'s socket. ``reshare``: the store stays open in this
    process (an ``HQueue`` on it outlives an ``hqueue server``), so serve it on, as opening it would."""
    with _listening_lock:
        if _listening.get(engine) is server:
            del _listening[engine]
    if reshare and _serve is not None:
        _serve(engine, None)


def open_store(url: str, group_limits: GroupLimits | None = None, timeout: float | None = None) -> Engine | StoreClient:
    """The store ``url`` (``local://``, normalized): opened and served here if no
    process holds it, else a client of the process that does, whose calls each have
    ``timeout`` seconds (default 30; calls to a store served here have no deadline)."""
    started = time.monotonic()
    deadline = started + STARTUP_WAIT
    patience = max(deadline, started + (30.0 if timeout is None else timeout))
    while True:
        # Held by another process (/proc/locks) and served: a client, without opening RocksDB
        # first (an open that fails on the lock has set up its log: the holder's LOG renamed away).
        if _held_elsewhere(store_directory(url)) and _served(socket_path(url)):
            return StoreClient(url, timeout)
        try:
            return _open_and_serve(url, group_limits)
        except StorageLocked as locked:
            if _served(socket_path(url)):
                return StoreClient(url, timeout)
            now = time.monotonic()
            if now >= patience or (now >= deadline and not _starting(store_directory(url))):
                # Held by a process that does not serve it (hqueue server --no-local-socket, an
                # older hqueue), or one that said it will and did not within the caller's timeout.
                raise locked
            time.sleep(TAKEOVER_INTERVAL)  # the holder is starting: its socket comes next
        except StorageError as e:
            # A user the store directory's group lets in (its socket is 0660 then) may not
            # write the store's own files, nor a process forked from one that ran RocksDB
            # open it: it uses the store through the serving process.
            if _may_not_open(e) and os.path.exists(socket_path(url)):
                served = _served(socket_path(url))  # (one this user may not connect to: said now)
                if served or forked_from_rocksdb() is None:  # (a user of the directory's group waits for
                    return StoreClient(url, timeout)  # one that may open it; a forked child is told why at once)
            raise


@contextlib.contextmanager
def starting(url: str) -> Iterator[None]:
    """While this process opens the ``local://`` store ``url`` to serve it, a file in its
    directory says so (``hqueue.starting.<pid>``): its lock is taken before its socket
    listens, seconds later for a store of thousands of queues, and a second process opening
    it meanwhile waits for the socket (up to its timeout), not STARTUP_WAIT only, after
    which it took the holder for one that does not share (StorageLocked: an attacker's pass)."""
    path: str | None = None
    if url.startswith("local://"):
        path = os.path.join(store_directory(normalize_url(url)), f"{STARTING}{os.getpid()}")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # (a killed process's of this pid; or a FIFO planted there, whose open would wait)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC, 0o600))
        except OSError:
            path = None  # (a store not made yet: no one waits on it long; or not this user's to write)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _starting(directory: str) -> bool:
    """Whether the process holding the store's lock said it opens it to serve it (:func:`starting`)."""
    pid = lock_pid(directory)
    return pid is not None and os.path.exists(os.path.join(directory, f"{STARTING}{pid}"))


def _sweep_starting(directory: str) -> None:
    """Remove what :func:`starting` left of processes killed while they opened the store."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            pid = name[len(STARTING) :]
            if not (name.startswith(STARTING) and pid.isascii() and pid.isdigit() and len(pid) < 10):
                continue  # (no process's: left alone)
            if int(pid) != os.getpid():
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, name))
                except OSError:
                    pass  # (alive: another user's)


def _served(path: str) -> bool:
    """Whether a process listens on the store's socket at ``path`` (a file left by a killed
    holder, while a process that does not share the store holds it, answers nothing).
    NotAuthorized if one does and this user may not connect to it."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        with short_unix_path(path) as short:
            probe.connect(short)
        return True
    except PermissionError:
        raise NotAuthorized(f"{_REFUSED} ({path})") from None
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        return True  # (busy, or slow to accept: a client of it finds out)
    finally:
        probe.close()


def _may_not_open(error: StorageError) -> bool:
    """The store's own files are not this user's to write (a user of the directory's group),
    or this process may not run RocksDB (forked from one that did): it uses the store
    through a process that serves it."""
    return "Permission denied" in str(error) or forked_from_rocksdb() is not None


def _open_and_serve(url: str, group_limits: GroupLimits | None) -> Engine:
    with starting(url) if _serve is not None else contextlib.nullcontext():
        engine = open_local(url, group_limits)
        if _serve is not None:
            try:
                _serve(engine, group_limits)
            except BaseException:
                engine.release()
                raise
    return engine


#: Why a user the serving process's socket refuses may not use the store.
_REFUSED = (
    "this user may not connect to the store's socket (another user's process holds the store, or held it): "
    "the store's directory must let this user's group write in it (chmod g+w), and the serving process be a "
    "member of that group"
)


class _Store:
    """One store as this process's clients of it see it: the engine it took over, if any."""

    _stores: dict[str, _Store] = {}
    _stores_lock = threading.Lock()

    def __init__(self, url: str) -> None:
        self.url = url
        self.directory = store_directory(url)
        self.users = 0
        self.engine: Engine | None = None
        self._lock = threading.Lock()
        self._last_try = 0.0
        #: Why this process may not open the store itself (None: it may, or has not tried).
        self.denied: str | None = None
        #: Set when the last user leaves: the watching thread ends.
        self._unwatched = threading.Event()
        self._fork = forks.generation()  # a forked child's copy is not this process's to leave

    @classmethod
    def join(cls, url: str) -> _Store:
        with cls._stores_lock:
            store = cls._stores.get(url) or cls._stores.setdefault(url, cls(url))
            store.users += 1
            first = store.users == 1
        if first:
            watcher = threading.Thread(target=store._watch, name="hqueue-store-watch", daemon=True)
            watcher.start()
        return store

    def leave(self) -> None:
        if forks.generation() != self._fork:
            return  # in a forked child: the store (and what serves it) is the parent's
        with self._stores_lock:
            self.users -= 1
            if self.users > 0:
                return
            self._stores.pop(self.url, None)
        self._unwatched.set()
        with self._lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.release()  # the last one: this process stops serving it

    def _watch(self) -> None:
        """Take the store over once it has had no holder for IDLE_TAKEOVER, whether or not
        this process calls (while it does, a call does so at once: _TakeoverPool)."""
        free_since: float | None = None
        while not self._unwatched.wait(WATCH_INTERVAL):
            if self.engine is not None or self.denied is not None or not self._free():
                free_since = None  # it serves the store, or may not open it; or the store is held
                continue
            now = time.monotonic()
            free_since = free_since or now
            if now - free_since < IDLE_TAKEOVER:
                continue
            try:
                self.take_over()
            except Exception as e:  # (the next look, or call, tries again)
                logger.warning("could not take over the embedded store %s: %s", self.url, e)

    def _gone(self) -> bool:
        """Whether the store's directory was removed or moved: it is not made again here."""
        return not os.path.exists(os.path.join(self.directory, "CURRENT"))

    def _free(self) -> bool:
        """Whether no process holds the store: no lock on it listed in /proc/locks, and
        nothing listening on its socket (where /proc/locks is not there to read, or does
        not list the holder, a process that serves the store is seen on its socket)."""
        if self._gone() or lock_pid(self.directory) is not None:
            return False
        try:
            return not _served(socket_path(self.url))
        except NotAuthorized:
            return False

    def take_over(self) -> bool:
        """Open the store and serve it, if its holder is gone; whether this process serves it now."""
        with self._lock:
            if self.engine is not None:
                return True
            if self._unwatched.is_set():  # its last user left: nobody here would release it
                return False
            if self._gone():
                raise StorageError(f"the embedded store {self.url} is gone (its directory was removed or moved)")
            now = time.monotonic()
            if now - self._last_try < TAKEOVER_INTERVAL:
                return False
            self._last_try = now
            if _held_elsewhere(self.directory):  # held (paused, starting): no open to fail
                return False
            try:
                self.engine = _open_and_serve(self.url, None)
            except StorageLocked:
                return False
            except StorageError as e:
                if not _may_not_open(e):
                    raise
                self.denied = str(e)
                return False  # (a user of the directory's group, a forked child): it waits for one that may
        logger.info("took over the embedded store %s (its serving process is gone)", self.url)
        return True


class _TakeoverPool(Pool):
    """Connections to the serving process; when none can be made, take the store over or wait for whoever does."""

    drop_idle_when_broken = True

    def __init__(self, store: _Store, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._store = store

    def take(self, deadline: float | None = None) -> Connection:
        delay = 0.01
        while True:
            try:
                return super().take(deadline)
            except NotSent as e:
                if isinstance(unwrapped(e.cause), PermissionError):  # a holder it may not connect to: no wait helps
                    raise NotAuthorized(f"{_REFUSED} ({self.unix_socket})") from e
                if self._store.take_over():
                    try:
                        return super().take(deadline)  # to ourselves
                    except NotSent:
                        pass
                if deadline is None or time.monotonic() + delay >= deadline:
                    if self._store.denied is None:
                        raise
                    why = f"{e.cause}; no process serves the store, and this one may not open it ({self._store.denied})"
                    raise NotSent(PermissionError(why)) from e
            time.sleep(delay)
            delay = min(delay * 2, 0.25)


class StoreClient(RemoteEngine):
    """The engine API over the Unix socket of the process serving a ``local://`` store.

    Its ``url`` is the store's. Release it with :meth:`release`; the last one
    in a process that took the store over stops serving it.
    """

    #: A holder that hands the store on resets its connections, some just made (those its
    #: listener had not accepted yet): a read tries again, within its deadline, until the
    #: next holder answers (a connection that cannot be made waits for it in _TakeoverPool).
    read_tries = 25

    def __init__(self, url: str, timeout: float | None = None) -> None:
        super().__init__(url, unix_socket=socket_path(url), timeout=timeout)
        self._store: _Store | None = _Store.join(url)
        # Dropped unreleased, it leaves all the same: its process does not go on watching
        # (and taking over) a store it no longer uses.
        self._leave = weakref.finalize(self, self._store.leave)
        self._leave.atexit = False  # (at the process's exit, what it holds is closed as before)

    def _new_pool(self, address: str) -> Pool:
        assert self._store is not None, "released"
        return _TakeoverPool(
            self._store, address, int(self.timeout * 1000), None, None, self.unix_socket, self._poll_us
        )

    def release(self) -> None:
        super().release()
        self._store = None
        self._leave()  # (once: a second release, or the finalizer after, does nothing)


def _forget_stores_in_child() -> list[object]:
    """After a fork, in the child: the parent's clients of stores are not this process's."""
    global _listening_lock
    inherited: list[object] = list(_Store._stores.values())
    _Store._stores, _Store._stores_lock = {}, threading.Lock()
    _listening_lock = threading.Lock()
    return inherited


forks.on_fork(_forget_stores_in_child)
