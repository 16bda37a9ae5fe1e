"""What a served connection is, and what its server is bound by: shared by the
threaded server (rpc/threaded.py), the event loop (rpc/loop.py) and the handlers.

* :class:`ServerLimits`: the bounds on what connections may cost a server.
* :class:`Connection`: one client connection as its handler sees it, and
  :func:`current_connection`, the one the calling handler serves;
  :func:`answer_slot_aside`, what a call's long wait gives back meanwhile.
* :class:`ListeningSocket`: a TCP socket bound once and never shared with
  another process, or a Unix socket whose file's permissions decide who may
  connect.
* :class:`RateLimitedLog`: a warning at most once per interval.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import logging
import os
import select
import socket
import ssl
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from thriftpy2.transport import TServerSocket

from ..errors import HQueueError, ServerBusy
from .budget import (
    DEFAULT_INFLIGHT_SHARE,
    DEFAULT_INFLIGHT_WAIT,
    DEFAULT_MAX_INFLIGHT_BYTES,
    AnswerSlot,
)
from .frames import DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_ITEMS
from .spin import DEFAULT_SERVER_POLL_US, check_poll_us, env_poll_us
from .unix import unix_listener

logger = logging.getLogger(__name__)

#: The part of the connection places one token's connections may keep (ServerLimits.connection_share).
DEFAULT_CONNECTION_SHARE = 0.25
#: The peer of a Unix-socket connection: a process of this machine (push addresses on loopback are its own).
LOCAL_PEER = ("127.0.0.1", 0)


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what connections may cost a server."""

    max_connections: int = 1024
    #: Seconds a connection may wait between calls before it is closed (None: forever).
    idle_timeout: float | None = 300.0
    #: Seconds a started frame (or a reply, or a TLS handshake) may take.
    body_timeout: float = 30.0
    #: The largest frame (one call); a larger one is refused from its head.
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: Container elements per frame (bounds the objects one call can make).
    max_items: int = DEFAULT_MAX_ITEMS
    #: Bytes of frames under way, all connections together.
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    #: Seconds a frame may wait for room in ``max_inflight_bytes`` before it is refused.
    inflight_wait: float = DEFAULT_INFLIGHT_WAIT
    #: The part of ``max_inflight_bytes`` that one client's calls on their way in and replies not
    #: taken yet may hold: past it, its big calls wait for room and its calls for big answers are
    #: refused (a client: what ``owner_of`` says; 1: no share).
    inflight_share: float = DEFAULT_INFLIGHT_SHARE
    #: The part of ``max_connections`` one client's proven connections may take and still be
    #: kept when all are taken (a client: what ``owner_of`` says; 1: no share). Its others are
    #: closed to make room as connections that proved nothing are.
    connection_share: float = DEFAULT_CONNECTION_SHARE
    #: Raise the process's soft limit on open files to hold ``max_connections`` (``hqueue
    #: server``, which owns its process; rpc/places.py: fit_descriptors). A server inside an
    #: application keeps the places that fit the limit as it is.
    raise_open_files: bool = False
    #: Microseconds the event loop (``io="loop"``) polls for the next call before it sleeps,
    #: while calls come that soon (rpc/spin.py; 0: it never polls).
    idle_poll_us: int = field(default_factory=lambda: env_poll_us("HQUEUE_IDLE_POLL_US", DEFAULT_SERVER_POLL_US))

    def __post_init__(self) -> None:
        check_poll_us(self.idle_poll_us, "idle_poll_us")
        for name in ("inflight_share", "connection_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name!r} must be more than 0 and at most 1, not {getattr(self, name)}")
        if self.max_inflight_bytes < self.max_frame_bytes:
            raise ValueError(
                f"'max_inflight_bytes' ({self.max_inflight_bytes}) must be at least 'max_frame_bytes' "
                f"({self.max_frame_bytes}): a frame the one allows must fit in the other"
            )


#: What a call on a connection that has not authenticated is told, where tokens are needed.
NEEDS_TOKEN = (
    "this server needs a token: connect with hqueue://TOKEN@host:port (or token=); "
    "over Thrift, call authenticate(token) first"
)


@dataclass
class Connection:
    """One client connection, as its handler sees it."""

    id: int
    peer: tuple[str, int]
    #: What the connection authenticated as (set by the handler); None: nothing yet.
    principal: Any = None
    #: A subscriber's push state on this connection (subscriptions/push.py).
    push: Any = None
    #: Called once when the connection ends (frees what it held, such as scanners).
    on_close: list[Callable[[], None]] = field(default_factory=list)
    #: What :meth:`when_closed` has been given a callback for.
    _closing: set[str] = field(default_factory=set)
    #: Failed authentications on this connection (server/logins.py).
    auth_failures: int = 0
    #: Set by a handler: close the connection once this call's answer is sent.
    close_after_reply: bool = False
    #: Proved who it is (the server's ``trusted_after``).
    trusted: bool = False
    #: Trusted and within its owner's share of the places (``connection_share``): never closed
    #: to make room. The owner it counts for (None: not kept).
    kept_as: str | None = None
    #: The principal it was kept as (another ``authenticate`` moves it to its new owner's share).
    kept_by: Any = None
    #: Proven, and past its owner's share: the owner in whose line it waits for a place.
    waits_as: str | None = None
    #: Shut down to make room for a newer one (rpc/threaded.py), and not ended yet.
    evicted: bool = False
    #: Came over a Unix socket: a process of this machine that the socket file's permissions let in.
    local: bool = False
    #: When it was accepted (``time.monotonic``).
    opened: float = field(default_factory=time.monotonic)
    #: Its call runs on the server's event loop now, which it may not keep waiting (rpc/loop.py).
    on_loop: bool = False
    #: Its socket (:meth:`peer_closed`): the one accepted, or its TLS socket once wrapped.
    sock: Any = field(default=None, repr=False)

    def peer_closed(self) -> bool:
        """Whether the client closed the connection and sent nothing more that is unread: an
        answer to the call under way would reach no one. Never waits; False when it cannot
        tell (a TLS peer that sent its close_notify: bytes unread, not a call's)."""
        sock = self.sock
        fd = -1 if sock is None else sock.fileno()
        if fd < 0 or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            return False  # (closed here, or a TLS call decrypted and unread)
        return closed_with_nothing_unread(fd)

    def when_closed(self, what: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the connection ends, unless one was given for ``what``
        already (what a connection holds of one kind is freed by one callback)."""
        if what not in self._closing:
            self._closing.add(what)
            self.on_close.append(callback)

    @property
    def who(self) -> str:
        """Who is at the other end, for the log: the peer's IP, or a local process."""
        return "a local process (Unix socket)" if self.local else self.peer[0]


def each_connection(connection: Connection) -> str:
    """Whose share of the in-flight budget a connection's replies count in, by default: its
    own (a server with tokens names the principal: hqueue.server.app)."""
    return f"connection {connection.id}"


_current = threading.local()


def current_connection() -> Connection | None:
    """The connection the calling handler thread serves (None outside one)."""
    return getattr(_current, "connection", None)


class PeerGone(HQueueError):
    """The client closed its connection while its call waited (it gave up): the call ends
    with nothing done, since its answer would reach no one (a receive leases nothing)."""

    def __init__(self) -> None:
        super().__init__("the client closed the connection while its call waited: nothing was done")


class WouldBlock(BaseException):
    """A call on the event loop was about to wait: it is run on a worker thread instead.

    A BaseException, so that it passes every ``except Exception`` between the
    handler and the loop (the handler's own error mapping among them).
    """


def on_loop() -> bool:
    """Whether the calling handler runs on a server's event loop (and so may not wait)."""
    connection = current_connection()
    return connection is not None and connection.on_loop


def may_block() -> None:
    """Called by a handler before it would wait, and before it has done anything:
    on the event loop, raises :class:`WouldBlock` (the call is run on a worker)."""
    if on_loop():
        raise WouldBlock


#: The peer shut its side (Linux); elsewhere only a full close (POLLHUP) is seen.
_RDHUP = getattr(select, "POLLRDHUP", 0)


def closed_with_nothing_unread(fd: int) -> bool:
    """Whether the peer of socket ``fd`` shut its side (or reset) and nothing it sent is
    left unread, from the kernel: a poll and a count, neither of which waits (a peek
    would, on a socket with a timeout in Python), the same for a TLS connection's socket."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | _RDHUP)
    ready = poller.poll(0)
    mask = ready[0][1] if ready else 0
    if mask & select.POLLNVAL or not mask & (_RDHUP | select.POLLHUP | select.POLLERR):
        return False  # (the client is there)
    if mask & select.POLLERR:
        return True  # reset
    unread = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, unread)
    except OSError:
        return False  # (closed here meanwhile: nothing to tell)
    return unread[0] == 0


def refuse_if_peer_gone() -> None:
    """Raise :class:`PeerGone` if the client of the calling handler's connection closed it."""
    connection = current_connection()
    if connection is not None and connection.peer_closed():
        raise PeerGone()


@contextlib.contextmanager
def answer_slot_aside() -> Iterator[AnswerSlot | None]:
    """Around a wait of the call under way (a receive's long poll): the bytes held for its
    answer (``answer_slots``) are given back meanwhile, and taken again after it if there
    is room (:meth:`AnswerSlot.set_aside <hqueue.rpc.budget.AnswerSlot.set_aside>`: the
    slot, whose ``held`` says so); None where the call holds none (on the event loop).

    Raises:
        ServerBusy: after the wait, if the connection was closed to make room meanwhile
            (rpc/places.py): the call ends, and its connection with it (a long poll held a
            place, and a slot of those being closed, for up to 300 s).
        PeerGone: after the wait, if the client closed the connection meanwhile.
    """
    slot: AnswerSlot | None = getattr(_current, "slot", None)
    with slot.set_aside() if slot is not None else contextlib.nullcontext() as held:
        yield held
    connection = current_connection()
    if connection is not None and connection.evicted:
        raise ServerBusy("max_connections", 0, "this connection was closed to make room for another: connect again")
    refuse_if_peer_gone()


class RateLimitedLog:
    """Logs a message at most once per ``interval`` seconds, counting the rest."""

    def __init__(self, interval: float = 10.0, log: logging.Logger = logger) -> None:
        self.interval, self._logger = interval, log
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, *args: Any) -> None:
        self._log(self._logger.warning, key, message, args)

    def exception(self, key: str, message: str, *args: Any) -> None:
        """As :meth:`warning`, at ERROR with the exception being handled (its traceback)."""
        self._log(self._logger.exception, key, message, args)

    def _log(self, log: Callable[..., None], key: str, message: str, args: tuple[Any, ...]) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self.interval:g}s)"
        log(message, *args)


class ListeningSocket(TServerSocket):
    """A listening TCP socket, bound once, never shared with another process;
    or a listening Unix socket (:meth:`bound_unix`)."""

    #: The permissions a Unix socket's file is made with, and its group (None: the process's).
    unix_mode = 0o600
    unix_group: int | None = None

    @classmethod
    def bound(cls, host: str, port: int) -> ListeningSocket:
        """A socket listening on ``host:port`` now (port 0: a free one).

        Raises:
            OSError: the port is taken (``errno.EADDRINUSE``), or the host is no address
                of this machine; the message names them.
        """
        sock = cls(host=host, port=port, client_timeout=None)
        sock.listen()
        return sock

    @classmethod
    def bound_unix(cls, path: str, mode: int = 0o600, group: int | None = None) -> ListeningSocket:
        """A Unix socket listening at ``path`` now, with permissions ``mode`` and, when
        given, group ``group`` (who may connect: :func:`~hqueue.rpc.unix.unix_listener`).
        The caller owns ``path``: a file already there is an error (a stale one is the
        caller's to remove, while it can tell it is stale)."""
        sock = cls(unix_socket=path, client_timeout=None)
        sock.unix_mode, sock.unix_group = mode, group
        sock.listen()
        return sock

    def listen(self) -> None:
        if self.sock is not None:
            return
        if self.unix_socket:
            self.sock = unix_listener(self.unix_socket, self.backlog, self.unix_mode, self.unix_group)
            return
        family = socket.AF_INET6 if ":" in (self.host or "") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        # SO_REUSEADDR only: restarts may bind over TIME_WAIT, but no second listener may.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise OSError(e.errno, f"port {self.port} on {self.host} is in use (another server?)") from e
            raise OSError(e.errno, f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from e
        sock.listen(self.backlog)
        self.sock = sock

    @property
    def bound_port(self) -> int:
        """The port actually bound (``port`` may be 0; 0 for a Unix socket)."""
        return 0 if self.unix_socket else self.sock.getsockname()[1]

    def close(self) -> None:
        super().close()
        if self.unix_socket:  # ours since we bound it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_socket)
