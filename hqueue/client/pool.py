"""Pooled Thrift connections to one hqueue server (the remote client's transport).

A :class:`Pool` hands each caller a :class:`Connection` of its own
(thriftpy2 clients are not thread-safe), checks an idle one before reuse so
that the first call after a server restart or an idle timeout does not
fail, authenticates new ones when a token is set, and speaks TLS when given
an SSL context. :class:`NotSent` says a request never left: no connection
could be made, so a retry cannot write anything twice.

Every wait on the socket (connect, TLS handshake, authenticate, send, each
read of the answer) is bounded by the caller's *deadline*, a
:func:`time.monotonic` instant: a call that one server answers slowly, byte
by byte, or not at all still ends at its deadline (``TimeoutError``).
"""

from __future__ import annotations

import collections
import itertools
import queue as queue_module
import socket
import ssl
import struct
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TClient
from thriftpy2.transport import TFramedTransportFactory, TTransportException

from ..rpc import wire
from ..rpc.bounded import BoundedSocket, readable_now
from ..rpc.spin import DEFAULT_CLIENT_POLL_US
from ..rpc.unix import short_unix_path, widen


class NumberedProtocol:
    """A Thrift protocol whose calls each go with a number of their own, and whose answers
    must name the call they answer (method and number), in the order the calls were sent:
    thriftpy2's client sends every call as number 0 and checks neither, so an answer that came
    late (a broken or hostile peer) would be read as the next call's. One that does not match
    ends the connection (TTransportException). Calls may be sent ahead of their answers (a
    scanner asks for its next batches so); each answer is checked against the oldest call not
    answered yet. Everything else is the wrapped protocol's."""

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self._numbers = itertools.count(1)
        #: The calls sent and not answered yet, oldest first: (method, number).
        self._asked: collections.deque[tuple[str, int]] = collections.deque()

    def write_message_begin(self, name: str, kind: int, seqid: int) -> None:
        asked = name, next(self._numbers) & 0x7FFFFFFF  # (an i32 on the wire: a long-lived connection wraps)
        self._asked.append(asked)
        self._protocol.write_message_begin(name, kind, asked[1])

    @property
    def unanswered(self) -> int:
        """Calls sent whose answers were not read whole (a read cut short anywhere, head or
        body, leaves its call counted)."""
        return len(self._asked)

    def read_message_begin(self) -> tuple[str, int, int]:
        name, kind, seqid = self._protocol.read_message_begin()
        asked = self._asked[0] if self._asked else None
        if (name, seqid) != asked:
            raise TTransportException(
                TTransportException.UNKNOWN, f"an answer to {(name, seqid)!r} where {asked!r} was asked"
            )
        return name, kind, seqid

    def read_message_end(self) -> None:
        self._protocol.read_message_end()
        self._asked.popleft()  # answered: read to its end

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._protocol, name)
        setattr(self, name, value)  # kept: the next look-up is a plain attribute's (thriftpy2 makes five a call)
        return value


class Connection:
    """One Thrift client and its socket (thriftpy2 clients are not thread-safe)."""

    def __init__(self, pool: Pool, deadline: float | None = None) -> None:
        self.socket: BoundedSocket
        if pool.unix_socket is None:
            transport = self._open_tcp(pool, deadline)  # connected already
        else:
            self.socket = BoundedSocket(unix_socket=pool.unix_socket, socket_timeout=_timeout_ms(pool, deadline))
            self.socket.deadline = deadline
            transport = TFramedTransportFactory().get_transport(self.socket)
            with short_unix_path(pool.unix_socket) as path:  # one too long for sun_path: through its directory
                self.socket.unix_socket = path
                transport.open()
            if self.socket.sock is not None:
                widen(self.socket.sock)  # a put's frame in one message (rpc/unix.py)
        self.socket.poll_first(pool.poll_us)
        protocol: Any = NumberedProtocol(TBinaryProtocolFactory().get_protocol(transport))  # (a TProtocolBase's calls)
        self.protocol: NumberedProtocol = protocol
        self.client = TClient(wire.T.HQueueService, protocol)
        if pool.token is not None:
            try:
                self.client.authenticate(pool.token)
            except BaseException:
                self.socket.close()  # refused, or broken: this connection is of no use
                raise

    def _open_tcp(self, pool: Pool, deadline: float | None) -> Any:
        """The transport over a TCP connection (TLS, if the pool speaks it), made within the deadline."""
        timeout_ms = _timeout_ms(pool, deadline)
        sock = dial(pool.host, pool.port, timeout_ms / 1000)
        try:
            if pool.ssl_context is not None:  # the handshake: within what is left
                sock.settimeout(_timeout_ms(pool, deadline) / 1000)
                sock = pool.ssl_context.wrap_socket(sock, server_hostname=pool.host)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(timeout_ms / 1000)  # each read and write (and the deadline's, when there is one)
        self.socket = BoundedSocket(sock=sock, socket_timeout=timeout_ms)
        self.socket.deadline = deadline
        return TFramedTransportFactory().get_transport(self.socket)

    def stale(self) -> bool:
        """Whether this idle connection is of no more use: the server closed it (restart,
        idle timeout), or a call on it was cut short (its answer, still to come, would be
        read as the next call's)."""
        sock = self.socket.sock
        return sock is None or bool(self.protocol.unanswered) or readable_now(sock)  # idle: nothing to read but EOF

    def close(self) -> None:
        self.socket.close()


def _timeout_ms(pool: Pool, deadline: float | None) -> int:
    return pool.timeout_ms if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))


def dial(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port`` within ``timeout`` seconds: each address the host
    resolves to (both families: a name with only IPv6 addresses too) tried in the
    resolver's order, each given an even share of the time left, so that an unreachable
    first address does not take it all. OSError (socket.gaierror for an unknown host,
    TimeoutError) if none answers."""
    end = time.monotonic() + timeout
    infos = list(dict.fromkeys(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
    error: OSError = TimeoutError(f"no answer from {host}:{port} within {timeout:g}s")
    for index, (family, kind, proto, _, address) in enumerate(infos):
        left = end - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left / (len(infos) - index))
            sock.connect(address)
        except OSError as e:
            sock.close()
            error = e
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # thriftpy2's TSocket options
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
        return sock
    raise error


class Pool:
    """Connections to one server."""

    #: A connection that broke (not timed out) takes the idle ones with it: their server
    #: is going away (a shared store's holder handing it on: sharing._TakeoverPool).
    drop_idle_when_broken = False

    def __init__(
        self,
        address: str,
        timeout_ms: int,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        unix_socket: str | None = None,
        poll_us: int = DEFAULT_CLIENT_POLL_US,
    ) -> None:
        #: Microseconds a call polls for its answer before it blocks (rpc/spin.py; 0: never;
        #: a client's comes from its URL or ``$HQUEUE_POLL_US``: client.engine.poll_us_of).
        self.poll_us = poll_us
        #: Connect to this Unix socket (a store another local process serves) instead of host:port.
        self.unix_socket = unix_socket
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port, self.timeout_ms = address, host, 0 if unix_socket else int(port), timeout_ms
        if host.startswith("[") and host.endswith("]"):  # an IPv6 address: [::1]:9700
            self.host = host[1:-1]
        self.token, self.ssl_context = token, ssl_context
        self._idle: queue_module.SimpleQueue = queue_module.SimpleQueue()
        #: Connections handed out and not given back (a cursor's holds one while it scans):
        #: closed by :meth:`release` (they stayed open, and the server's scanners with them,
        #: until the cursors were collected). Weak: a cursor dropped unclosed lets its go.
        self._out: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._released = False
        #: The server answered a call here since its last failure (rpc/failures.spoke_plain).
        self.answered = False
        self._last: Connection | None = None  # the connection given back last (held_since)
        self._lost = 0  # connections found broken, or closed by the server (held_since)

    def take(self, deadline: float | None = None) -> Connection:
        """A connection for the caller alone, its waits bounded by ``deadline``;
        give it back with :meth:`give_back`."""
        while True:
            try:
                connection = self._idle.get_nowait()
            except queue_module.Empty:
                try:
                    connection = Connection(self, deadline)
                except (TTransportException, OSError) as e:
                    raise NotSent(e) from e
                self._out.add(connection)
                return connection
            if not connection.stale():
                connection.socket.deadline = deadline
                connection.socket.share = connection.socket.at_share = None
                self._out.add(connection)
                return connection
            self._lost += 1
            connection.close()

    def give_back(self, connection: Connection, broken: bool = False) -> None:
        """Keep ``connection`` for the next caller, unless it is ``broken`` or holds a call
        not answered (one cut short: an exception raised while it waited, a send that failed
        part-way): then it is closed."""
        self._out.discard(connection)
        if broken or connection.protocol.unanswered or self._released:
            self._lost += broken
            connection.close()
        else:
            self.answered = True
            self._last = connection
            self._idle.put(connection)

    def held_since(self) -> Callable[[], bool]:
        """Whether, from now, no connection here broke or was found closed by the server,
        and the one given back last (idle) is not closed: False once the server may have
        stopped or restarted, and what it handed out in its answers went with it."""
        lost, last = self._lost, self._last
        return lambda: self._lost == lost and not (last is not None and last not in self._out and last.stale())

    @contextmanager
    def client(
        self,
        deadline: float | None = None,
        share: float | None = None,
        at_share: Callable[[], float | None] | None = None,
    ) -> Iterator[Any]:
        """A connection's client for one call by ``deadline``; ``share`` and ``at_share``: see _Bounded."""
        connection = self.take(deadline)
        connection.socket.share, connection.socket.at_share = share, at_share
        try:
            yield connection.client
        except (TTransportException, OSError) as e:
            self.give_back(connection, broken=True)  # the connection is in an unknown state
            if self.drop_idle_when_broken and not isinstance(e, TimeoutError):
                self.close()  # the server closed or reset it: its other idle ones go the same way
            raise
        except BaseException:
            self.give_back(connection)  # an answer came back (a typed error): fine, unless a call was cut short
            raise
        self.give_back(connection)

    def close(self) -> None:
        """Close the idle connections."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue_module.Empty:
                return

    def release(self) -> None:
        """Close every connection, those handed out too (a call under way on one fails), and
        each given back from now on."""
        self._released = True
        while True:
            try:
                out = list(self._out)
                break
            except RuntimeError:  # (another thread took one meanwhile: look again)
                continue
        for connection in out:
            connection.close()
        self.close()


class NotSent(Exception):
    """No connection could be made: the request never left."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause
