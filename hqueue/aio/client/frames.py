"""An asyncio client connection's bytes as whole Thrift answer frames (the protocol
under :class:`~hqueue.aio.client.transport.AsyncConnection`).

:class:`Frames` cuts what arrives into whole answer frames as it comes, keeps them in
order until taken, and wakes the reader once per answer: no stream's reads and turns
of the loop per frame head and body. It bounds what it holds and ends the connection
on what no server of ours sends:

* answers read and not taken past HELD_BYTES: the socket is not read until they are;
* a frame of 0 bytes or over MAX_ANSWER_BYTES, refused when its head arrives;
* any byte past the answers owed (a frame nobody asked for, even part of a head).

:func:`answered` reads the method and call number an answer names, which the
connection checks against the call it owes (thriftpy2 checks neither).
"""

from __future__ import annotations

import asyncio
import collections
import struct

from thriftpy2.transport import TTransportException

from ...rpc.bounded import check_answer_frame
from ...rpc.spin import Spin
from ...rpc.wire import MAX_ANSWER_BYTES
from .awake import Awake, awake

#: Answers read and not taken yet past this many bytes: the socket is not read until they
#: are (answers pipelined ahead of a slow reader wait in the server, as with a stream's limit).
HELD_BYTES = 4 * 1024 * 1024
#: A frame's head: its size.
SIZE = struct.Struct("!i")


_MESSAGE_HEAD = struct.Struct("!Ii")
_SEQID = struct.Struct("!i")
#: A strict binary protocol message's version bits (what hqueue servers write).
_VERSION_MASK, _VERSION_1 = 0xFFFF0000, 0x80010000


def answered(frame: bytes) -> tuple[str, int] | None:
    """The method and call number an answer frame names (None: not a strict message head)."""
    if len(frame) < 12:
        return None
    version, size = _MESSAGE_HEAD.unpack_from(frame)
    if version & _VERSION_MASK != _VERSION_1 or not 0 <= size <= len(frame) - 12:
        return None
    try:
        return frame[8 : 8 + size].decode(), _SEQID.unpack_from(frame, 8 + size)[0]
    except UnicodeDecodeError:
        return None


class Frames(asyncio.Protocol):
    """The connection's bytes as whole answer frames, kept in order until taken: no
    stream's buffer copies and no read call per frame's head and body (each answer
    wakes its caller once)."""

    def __init__(self, poll_us: int = 0) -> None:
        self.transport: asyncio.Transport | None = None
        #: Whether a wait for an answer polls first, and for how long (awake.py); None: never.
        self.spin = Spin(poll_us) if poll_us else None
        self._awake: Awake | None = None  # its loop's, once connected, if it polls
        self.answers: collections.deque[bytes] = collections.deque()
        #: (method, number) of each call sent whose answer was not taken, in order: those past
        #: ``answers`` have no answer read yet (a frame past them all was never asked for).
        self.asked: collections.deque[tuple[str, int]] = collections.deque()
        self.error: TTransportException | None = None  # why the connection ended, once it has
        self._buffer = bytearray()
        self._held = 0  # bytes of the answers not taken
        self._reading = True
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.spin is not None:
            self._awake = awake()  # (looked up once, not at each wait: a connection is its loop's)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while buffer:
            if len(self.answers) >= len(self.asked):  # any byte past the answers asked for, even less than a head
                self._end(TTransportException(TTransportException.UNKNOWN, "an answer to no call"))
                return
            if len(buffer) < 4:
                break
            (size,) = SIZE.unpack_from(buffer)
            if not 0 < size <= MAX_ANSWER_BYTES:
                self._end(TTransportException(TTransportException.UNKNOWN, f"an answer frame of {size} bytes"))
                return
            if len(buffer) < 4 + size:
                break
            answer = bytes(memoryview(buffer)[4 : 4 + size])
            try:  # (before thriftpy2 decodes it: rpc/frames.py)
                check_answer_frame(answer)
            except TTransportException as e:
                self._end(e)
                return
            self.answers.append(answer)
            del buffer[: 4 + size]
            self._held += size
        if self._held > HELD_BYTES and self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()
        if self.answers:  # (a whole answer: a piece of one wakes nobody, nor teaches the spin)
            self._wake()

    def sent(self, method: str, seqid: int) -> None:
        """A call went out: its answer is the next one owed."""
        self.asked.append((method, seqid))

    def fail(self, reason: str) -> None:
        """End the connection for a protocol error of the peer's (raised here too)."""
        self._end(TTransportException(TTransportException.UNKNOWN, reason))
        assert self.error is not None
        raise self.error

    def eof_received(self) -> bool:
        self._end(TTransportException(TTransportException.END_OF_FILE, "the server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"the connection was lost: {exc}" if exc is not None else "the server closed the connection"
        self._end(TTransportException(TTransportException.END_OF_FILE, reason))
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)  # the write fails, as it must, at the next read

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drained(self) -> None:
        """Once the socket took what was written (a big put is not copied in full into memory)."""
        if self._paused and self.error is None:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def answer(self) -> bytes:
        """The oldest answer not taken, once it is in (one reader at a time)."""
        assert self._waiter is None, "two readers of one connection"
        while not self.answers:
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            spin, keeper, came = self.spin, self._awake, False
            began = keeper.begin(spin) if keeper is not None and spin is not None else 0.0  # (it may poll first)
            try:
                await self._waiter
                came = True
            finally:
                self._waiter = None
                if keeper is not None and spin is not None:
                    keeper.end(spin, began, came)
        answer = self.answers.popleft()
        self._held -= len(answer)
        if not self._reading and self._held <= HELD_BYTES and self.transport is not None:
            self._reading = True
            self.transport.resume_reading()
        return answer

    def _end(self, error: TTransportException) -> None:
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.abort()  # (a TLS close_notify would wait on the loop)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
