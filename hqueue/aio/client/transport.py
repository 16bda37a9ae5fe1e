"""Async Thrift connections to one hqueue server: the same framing, TLS and token
as the blocking client (:mod:`hqueue.client.pool`), on the event loop.

Each call is one frame out and one frame in (TFramedTransport, TBinaryProtocol).
The connection is an ``asyncio.Protocol`` (:class:`~hqueue.aio.client.frames.Frames`) that cuts what
arrives into whole answer frames as it comes and wakes the caller once per
answer, which thriftpy2's C binary protocol decodes from memory: no thread, no
socket of its own per call, and none of a stream's reads and turns of the loop
per frame head and body (with a receive run in its caller's task, 10-20 % less of an
async consumer's CPU, bench/aio_groups.py).

Why not ``thriftpy2.contrib.aio`` as it is: its ``TAsyncSocket.open`` connects
in a thread of the default executor (a thread per connect), and its protocol
awaits every field it reads. Its client's message handling is the one used
here (``TClient._send``/``_recv`` are the blocking twins of ``TAsyncClient``'s),
over a memory buffer holding one whole frame.

A caller cancelled while its answer is on the way loses nothing of the
connection: the answer is kept whole, in order, for whoever reads next (the
engine reads it in the background, then lends the connection again).
Answers read and not taken are bounded, frames out of bounds refused
(aio/client/frames.py). A frame nobody asked for, one of a size out of bounds, or an answer
that names another call than the one owed (each call goes with its own
number: thriftpy2 itself checks neither) ends the connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import socket
import ssl
from collections.abc import Callable
from typing import Any

from thriftpy2.protocol import TCyBinaryProtocol
from thriftpy2.thrift import TClient, args_to_kwargs
from thriftpy2.transport import TCyMemoryBuffer, TTransportException

from ...auth import joined
from ...rpc import wire
from ...rpc.bounded import readable_now
from ...rpc.unix import short_unix_path
from .frames import SIZE, Frames, answered


class AsyncConnection:
    """One connection to a server; one call at a time."""

    def __init__(self, transport: asyncio.Transport, frames: Frames) -> None:
        self.transport, self._frames = transport, frames
        self._loop = asyncio.get_running_loop()
        self._client = TClient(wire.T.HQueueService, TCyBinaryProtocol(TCyMemoryBuffer()))
        self._seqids = itertools.count(1)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        token: str | None,
        unix_socket: str | None = None,
        poll_us: int = 0,
    ) -> AsyncConnection:
        """Connect (TLS when given a context; to ``unix_socket`` instead of host:port when
        given: a store another local process serves) and authenticate when a token is set;
        a wait for an answer polls up to ``poll_us`` first (awake.py). The caller bounds it
        (``asyncio.timeout``)."""
        loop = asyncio.get_running_loop()
        protocol = functools.partial(Frames, poll_us)
        try:
            if unix_socket is not None:
                with short_unix_path(unix_socket) as path:
                    transport, frames = await loop.create_unix_connection(protocol, path)
            else:
                transport, frames = await loop.create_connection(
                    protocol, host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
                )
        except (OSError, ssl.SSLError) as e:
            where = unix_socket or joined(host, port)
            raise TTransportException(TTransportException.NOT_OPEN, f"could not connect to {where}: {e}") from e
        connection = cls(transport, frames)
        if token is not None:
            try:
                await connection.call("authenticate", token)
            except BaseException:
                connection.close()  # refused, or broken: of no use
                raise
        return connection

    async def call(self, method: str, *args: Any) -> Any:
        """Send ``method(*args)`` and read its answer; IDL exceptions are raised as thriftpy2 raises them."""
        await self.send(method, *args)
        return await self.receive(method)

    async def send(self, method: str, *args: Any) -> None:
        """Send ``method(*args)``; its answer is read by :meth:`receive` (after those of the
        calls sent before it: a scan asks for its next batches so)."""
        frames = self._frames
        if frames.error is not None:
            raise frames.error
        client = self._client
        spec = getattr(wire.T.HQueueService, method + "_args").thrift_spec
        out = TCyMemoryBuffer()
        client._oprot = TCyBinaryProtocol(out)
        client._seqid = seqid = next(self._seqids) & 0x7FFFFFFF  # (an i32 on the wire: a long-lived connection wraps)
        client._send(method, **args_to_kwargs(spec, *args))
        payload = out.getvalue()
        frames.sent(method, seqid)
        self.transport.write(SIZE.pack(len(payload)) + payload)
        await frames.drained()

    async def receive(self, method: str) -> Any:
        """The answer to the oldest call sent and not answered yet, a call of ``method``
        (an answer that names another call, or another call's number, ends the connection:
        thriftpy2 would read it as this one's)."""
        frames = self._frames
        answer = await frames.answer()
        asked, named = frames.asked.popleft(), answered(answer)
        if named != asked:
            frames.fail(f"an answer to {named!r} where {asked!r} was asked")
        client = self._client
        client._iprot = TCyBinaryProtocol(TCyMemoryBuffer(answer))
        return client._recv(method)

    def stale(self) -> bool:
        """Whether the server closed this idle connection (restart, idle timeout, a kill): as
        the loop saw it, or, not seen yet (no turn of the loop since), as the socket says now:
        an idle connection has nothing to read but its end. (A call sent on a connection whose
        server was gone already would be one that may have been sent: OutcomeUnknown.)"""
        frames = self._frames
        if frames.error is not None or frames.answers or frames.asked or self.transport.is_closing():
            return True  # (answers still owed: they would be the next call's)
        sock = self.transport.get_extra_info("socket")
        return sock is not None and readable_now(sock)

    def close(self) -> None:
        """Close it, from any event loop or thread: from its own loop at once; from another
        thread while its loop runs, in that loop; once its loop has ended (a handle left open
        when its ``asyncio.run`` returned, closed from the next), here: the server sees its end
        now (a group member's leases go back), and its socket is closed."""
        if self.transport.is_closing():
            return
        loop = self._loop
        if loop.is_closed():
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                # asyncio's wrapper lends no close(): its socket is freed now, not when collected
                raw = getattr(sock, "_sock", None)
                if isinstance(raw, socket.socket):
                    raw.close()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop and loop.is_running():
            loop.call_soon_threadsafe(self._abort)
        else:
            self._abort()

    def _abort(self) -> None:
        # A TLS close_notify would wait on the loop: abort the transport (it frees the socket at once).
        if not self.transport.is_closing():
            self.transport.abort()


#: Connections one server's pool lends for calls at once: a burst of awaited calls (a
#: ``gather`` of 2,000 puts) waits for one instead of opening a socket each (the process's
#: and the server's file descriptors ran out). A scan's cursors are not counted: one holds
#: a connection per partition for the scan's life.
MAX_CALLS = 128
#: Idle connections a pool keeps for reuse; one given back past them is closed.
MAX_IDLE = 16


class AsyncPool:
    """Connections to one server: idle ones are reused (at most MAX_IDLE kept), at most
    MAX_CALLS lent for calls at once, every one closed by :meth:`close`."""

    def __init__(
        self,
        address: str,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        unix_socket: str | None = None,
        poll_us: int = 0,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port = address, host.strip("[]"), 0 if unix_socket else int(port)
        self.unix_socket = unix_socket
        self.token, self.ssl_context = token, ssl_context
        #: Microseconds a wait for an answer polls first (awake.py; 0: never).
        self.poll_us = poll_us
        self.max_calls, self.max_idle = MAX_CALLS, MAX_IDLE
        self._idle: list[AsyncConnection] = []
        self._open: set[AsyncConnection] = set()
        self._for_calls: set[AsyncConnection] = set()
        self._lent = 0  # for calls, and taking
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False
        #: The server answered a call here since its last failure (rpc/failures.spoke_plain).
        self.answered = False
        self._lost = 0  # connections found broken, or closed by the server (held_since)

    def held_since(self) -> Callable[[], bool]:
        """Whether, from now, no connection here broke or was found closed by the server, and
        none of those idle then is closed (as the blocking Pool's): False once the server may
        have stopped or restarted. (Every idle one is looked at, not the last given back: an
        answer read after its call was cut short comes back while other tasks run.)"""
        lost = self._lost
        return lambda: self._lost == lost and not any(connection.stale() for connection in self._idle)

    def take_idle(self, call: bool = False) -> AsyncConnection | None:
        """An idle connection for the caller alone, if there is one (and, for a ``call``,
        room among the calls' connections); no wait."""
        if call and (self._lent >= self.max_calls or self._room):  # (calls waiting go first)
            return None
        while self._idle:
            connection = self._idle.pop()
            if not connection.stale():
                if call:
                    self._lent += 1
                    self._for_calls.add(connection)
                return connection
            self._lost += 1
            self._drop(connection)
        return None

    async def take(self, call: bool = False) -> AsyncConnection:
        """A connection for the caller alone; give it back with :meth:`give_back`. For a
        ``call``, it waits while MAX_CALLS are lent (the caller bounds the wait).

        Raises:
            NotSentError: no connection could be made (the request never left).
        """
        if call:
            if self._lent >= self.max_calls or self._room:
                await self._wait_for_room()  # the connection it waited for is counted for it
            else:
                self._lent += 1
        try:
            connection = self.take_idle()
            if connection is None:
                if self.closed:
                    raise NotSentError(TTransportException(TTransportException.NOT_OPEN, "the client is closed"))
                try:
                    connection = await AsyncConnection.open(
                        self.host, self.port, self.ssl_context, self.token, self.unix_socket, self.poll_us
                    )
                except (TTransportException, OSError) as e:
                    raise NotSentError(e) from e
                self._open.add(connection)
        except BaseException:
            if call:
                self._returned()
            raise
        if call:
            self._for_calls.add(connection)
        return connection

    async def _wait_for_room(self) -> None:
        """Wait, in line, until a call's connection is handed on to this one (first come,
        first served: a task that gives one back and takes one again at once goes behind
        those waiting, which otherwise waited until their deadline).

        Raises:
            NotSentError: the client closed meanwhile.
        """
        room = asyncio.get_running_loop().create_future()
        self._room.append(room)
        try:
            await room
        except BaseException:
            if room.done() and not room.cancelled() and room.exception() is None:
                self._returned()  # handed its room, then cancelled: the room goes on to the next
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._room.remove(room)

    def _returned(self) -> None:
        """A call's connection is given back: its room goes to the first call waiting."""
        while self._room:
            room = self._room.popleft()
            if not room.done():
                room.set_result(None)
                return
        self._lent -= 1

    def give_back(self, connection: AsyncConnection, broken: bool = False) -> None:
        if connection in self._for_calls:
            self._for_calls.discard(connection)
            self._returned()
        if not broken:
            self.answered = True  # (as client/pool.py's Pool.answered)
        self._lost += broken
        if broken or self.closed or len(self._idle) >= self.max_idle:
            self._drop(connection)
        else:
            self._idle.append(connection)

    def _drop(self, connection: AsyncConnection) -> None:
        self._open.discard(connection)
        connection.close()

    @property
    def connections(self) -> int:
        """Connections open now (idle and in use)."""
        return len(self._open)

    def close(self) -> None:
        """Close every connection, in use or idle (a call on one fails as broken)."""
        self.closed = True
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()
        for room in self._room:  # calls waiting for a connection: the client is closed
            if not room.done():
                room.set_exception(
                    NotSentError(TTransportException(TTransportException.NOT_OPEN, "the client is closed"))
                )


class NotSentError(Exception):
    """No connection could be made: the request never left."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause
