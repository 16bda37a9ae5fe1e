"""Async Thrift connections to one hqueue server: the same framing, TLS and token
as the blocking client (:mod:`hqueue.client.pool`), on the event loop.

Each call is one frame out and one frame in (TFramedTransport, TBinaryProtocol),
read with ``StreamReader.readexactly`` and decoded by thriftpy2's C binary
protocol from memory: no thread, no socket of its own per call.

Why not ``thriftpy2.contrib.aio`` as it is: its ``TAsyncSocket.open`` connects
in a thread of the default executor (a thread per connect), and its protocol
awaits every field it reads. Its client's message handling is the one used
here (``TClient._send``/``_recv`` are the blocking twins of ``TAsyncClient``'s),
over a memory buffer holding one whole frame.

A call cancelled while its request or answer is on the wire leaves its
connection in an unknown state: the connection is closed, never reused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import struct
from typing import Any

from thriftpy2.protocol import TCyBinaryProtocol
from thriftpy2.thrift import TClient, args_to_kwargs
from thriftpy2.transport import TCyMemoryBuffer, TTransportException

from ...auth import joined
from ...client.pool import readable_now
from ...rpc import wire
from ...rpc.unix import short_unix_path

#: The largest answer frame read (a scan chunk is at most wire.SCAN_REPLY_BYTES and change).
MAX_ANSWER_BYTES = 256 * 1024 * 1024
_SIZE = struct.Struct("!i")


class AsyncConnection:
    """One connection to a server; one call at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        #: The size of the answer frame whose head was read and body not yet (a read cancelled between).
        self._pending: int | None = None
        self._client = TClient(wire.T.HQueueService, TCyBinaryProtocol(TCyMemoryBuffer()))

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        token: str | None,
        unix_socket: str | None = None,
    ) -> AsyncConnection:
        """Connect (TLS when given a context; to ``unix_socket`` instead of host:port when
        given: a store another local process serves) and authenticate when a token is set.
        The caller bounds it (``asyncio.timeout``)."""
        try:
            if unix_socket is not None:
                with short_unix_path(unix_socket) as path:
                    reader, writer = await asyncio.open_unix_connection(path)
            else:
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
                )
        except (OSError, ssl.SSLError) as e:
            where = unix_socket or joined(host, port)
            raise TTransportException(TTransportException.NOT_OPEN, f"could not connect to {where}: {e}") from e
        connection = cls(reader, writer)
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
        client = self._client
        spec = getattr(wire.T.HQueueService, method + "_args").thrift_spec
        out = TCyMemoryBuffer()
        client._oprot = TCyBinaryProtocol(out)
        client._send(method, **args_to_kwargs(spec, *args))
        payload = out.getvalue()
        self.writer.write(_SIZE.pack(len(payload)) + payload)
        await self.writer.drain()

    async def receive(self, method: str) -> Any:
        """The answer to the oldest call sent and not answered yet, a call of ``method``."""
        client = self._client
        try:
            if self._pending is None:  # (a read cancelled after the head goes on from its body)
                (size,) = _SIZE.unpack(await self.reader.readexactly(4))
                if not 0 < size <= MAX_ANSWER_BYTES:
                    raise TTransportException(TTransportException.UNKNOWN, f"an answer frame of {size} bytes")
                self._pending = size
            frame = await self.reader.readexactly(self._pending)
            self._pending = None
        except asyncio.IncompleteReadError as e:
            raise TTransportException(TTransportException.END_OF_FILE, "the server closed the connection") from e
        client._iprot = TCyBinaryProtocol(TCyMemoryBuffer(frame))
        return client._recv(method)

    def stale(self) -> bool:
        """Whether the server closed this idle connection (restart, idle timeout, a kill): as
        the loop saw it, or, not seen yet (no turn of the loop since), as the socket says now:
        an idle connection has nothing to read but its end. (A call sent on a connection whose
        server was gone already would be one that may have been sent: OutcomeUnknown.)"""
        if self.reader.at_eof() or self.writer.is_closing() or self.reader._buffer:  # type: ignore[attr-defined]
            return True
        sock = self.writer.get_extra_info("socket")
        return sock is not None and readable_now(sock)

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
            # A TLS close_notify would wait on the loop: abort the transport (it frees the socket at once).
            self.writer.transport.abort()


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
        self, address: str, token: str | None, ssl_context: ssl.SSLContext | None, unix_socket: str | None = None
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port = address, host.strip("[]"), 0 if unix_socket else int(port)
        self.unix_socket = unix_socket
        self.token, self.ssl_context = token, ssl_context
        self.max_calls, self.max_idle = MAX_CALLS, MAX_IDLE
        self._idle: list[AsyncConnection] = []
        self._open: set[AsyncConnection] = set()
        self._for_calls: set[AsyncConnection] = set()
        self._lent = 0  # for calls, and taking
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False

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
                        self.host, self.port, self.ssl_context, self.token, self.unix_socket
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
