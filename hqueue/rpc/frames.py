"""Reading and checking Thrift frames before thriftpy2 decodes them.

thriftpy2's decoder trusts the sizes a frame declares: a list header that
claims 2**31-1 elements of a type that takes no bytes (a 33-byte frame) keeps
it looping for seconds while it holds the GIL, which freezes every
connection; a frame length of 2 GiB makes it allocate 2 GiB. So a server
reads each frame itself, refuses it when it is longer than
``max_frame_bytes``, and walks it once (:func:`check_call`): every element
type must be a real one, every declared size must fit in the bytes left,
nesting is bounded, and at most ``max_items`` container elements per frame
(which bounds the Python objects one call can make). Only then does the
frame reach the decoder, from memory, so a call can never read past its
own frame.

A server reads a frame in steps (:meth:`FrameReader.next_size`, then
:meth:`~FrameReader.call_head`, then :meth:`~FrameReader.body` or
:meth:`~FrameReader.skip`), so it can refuse a call from its head, before
any of its body is held: an oversized frame, or one that would take the
server's requests under way past their memory budget.

The walk costs about 0.2 µs per message of a put, 5–10% of a put's time on
the server.
"""

from __future__ import annotations

import socket
import struct
import time

#: A put at the server's default caps (10,000 messages, 16 MiB of topics and
#: values: ``--max-put-messages``, ``--max-put-bytes``) with room to spare; a
#: frame costs about three times its size in memory while it is decoded and written.
DEFAULT_MAX_FRAME_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_ITEMS = 100_000
MAX_DEPTH = 32

# Thrift binary protocol types, and the bytes the fixed-width ones take.
T_STOP, T_STRING, T_STRUCT, T_MAP, T_SET, T_LIST = 0, 11, 12, 13, 14, 15
_FIXED = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8}
_CONTAINERS = (T_STRUCT, T_MAP, T_SET, T_LIST)
_VERSION_1 = 0x80010000
#: The message types a server takes: CALL and ONEWAY (thriftpy2's TMessageType).
_CALL_TYPES = (1, 4)
#: The message types a client takes: REPLY and EXCEPTION.
_ANSWER_TYPES = (2, 3)

_I32 = struct.Struct(">i").unpack_from
_LIST = struct.Struct(">bi").unpack_from
_MAP = struct.Struct(">bbi").unpack_from
_HEAD = struct.Struct(">I")
#: The largest size a frame's head may declare: Thrift's i32 (one over it is a negative size
#: to every other implementation). Past it, or 0, the connection ends at once: no client
#: sends it, so no answer is waited for (a frame over --max-frame-bytes is answered).
MAX_DECLARED = 2**31 - 1
_CALL_HEAD = struct.Struct(">Ii").unpack_from
_TIMEVAL = struct.Struct("@ll")  # struct timeval


class FrameError(Exception):
    """A frame that is oversized or malformed; its connection is closed."""


class TooManyItems(FrameError):
    """A whole frame whose containers hold more elements than the server takes (a scan
    naming 200,000 topics): refused with a typed error (LimitExceeded), the connection
    going on, where its client saw the connection closed and tried again to its deadline."""


class FrameReader:
    """The frames of one connection, read with as few system calls as the bytes allow.

    A small call (an ack, a receive, a one-message put) arrives in one
    ``recv``, head and body together, where reading the head and then the
    body took two, each behind a ``poll``; and the socket's timeout is set
    only when it changes. Every system call lets go of the GIL and must take
    it back, which costs most when many connections are busy.

    The wait for a frame's first byte uses ``idle_timeout``; once it has
    started, its head (its size and its call's head) must come within
    ``body_timeout`` of that byte, and its body within ``body_timeout`` of
    when it is read (once admitted: a wait for room in the server's budget
    is not counted against the peer), each all told, not per ``recv``.

    On a plain socket the timeouts are the kernel's (``SO_RCVTIMEO``,
    ``SO_SNDTIMEO``) on a blocking socket: a ``recv`` or a ``send`` is one
    system call, where Python's own timeouts ``poll`` before each. A TLS
    socket keeps Python's timeouts (its reads are not one system call each).
    :meth:`send` writes a reply with its head, without joining them.
    """

    #: Bytes asked of one ``recv``: what a burst of small calls or a put's start needs.
    CHUNK = 65536
    #: At most this much is asked at once, so a declared size alone never allocates much.
    MAX_CHUNK = 1024 * 1024
    #: The buffer a refused frame's body is thrown away through: a thread draining a declared
    #: gigabyte held 1 MiB (1 GiB for 1,000 strangers' connections; an attacker's pass).
    SKIP_CHUNK = 4096

    def __init__(
        self,
        sock: socket.socket,
        max_frame_bytes: int,
        idle_timeout: float | None,
        body_timeout: float | None,
        buffer: bytearray | None = None,
    ) -> None:
        """``buffer``: bytes of the connection read already (an event loop's, handing a big frame over)."""
        self.sock, self.max_frame_bytes = sock, max_frame_bytes
        self.idle_timeout, self.body_timeout = idle_timeout, body_timeout
        self._buffer = bytearray() if buffer is None else buffer
        self._size = 0  # the size the current frame's head declares
        #: When the current frame's head (its size and its call's head) must be in, all told:
        #: ``body_timeout`` after its first byte.
        self._frame_deadline: float | None = None
        self._timeout: object = None
        #: Kernel timeouts on a blocking socket (plain sockets), else Python's.
        self._kernel = type(sock) is socket.socket
        if self._kernel:
            sock.settimeout(None)
            self._sndtimeo(body_timeout)
        self._set_timeout(idle_timeout)

    def read(self) -> bytes | bytearray | None:
        """The next frame's bytes; None when the peer closed between frames.

        Raises:
            FrameError: a frame of 0 bytes, or over ``max_frame_bytes``.
            TimeoutError: idle past ``idle_timeout``, or a frame not done
                within ``body_timeout`` of its first byte.
            ConnectionResetError: the peer closed in the middle of a frame.
        """
        size = self.next_size()
        if size is None:
            return None
        if size > self.max_frame_bytes:
            raise FrameError(f"frame of {size} bytes (the limit is {self.max_frame_bytes})")
        return self.body()

    def next_size(self) -> int | None:
        """Wait for the next frame's head: the size it declares (None: the peer
        closed between frames). Nothing of the body is read beyond what came
        with the head; :meth:`body` reads it, or :meth:`skip` throws it away."""
        buffer = self._buffer
        if not buffer:
            self._set_timeout(self.idle_timeout)
            if not self._fill(1, allow_eof=True):
                return None
        self._frame_deadline = self._deadline()
        if len(buffer) < 4:
            self._fill(4, allow_eof=False, deadline=self._frame_deadline)
        self._size = _HEAD.unpack_from(buffer)[0]
        if not 0 < self._size <= MAX_DECLARED:
            raise FrameError(f"frame of {self._size} bytes")
        return self._size

    @property
    def complete(self) -> bool:
        """Whether the whole frame came with its head (a small call: nothing more to read)."""
        return len(self._buffer) >= 4 + self._size

    def call_head(self) -> tuple[str, int]:
        """The frame's method name and sequence id (what a reply needs), from
        its first bytes, read if they have not come yet.

        Raises:
            FrameError: the frame does not start as a strict binary-protocol call.
        """
        self._peek(8)
        name_size = _name_size(self._buffer)
        self._peek(12 + name_size)
        return _name_and_seqid(self._buffer, name_size)

    def body(self) -> bytes | bytearray:
        """The frame whose head :meth:`next_size` read: the bytes after its head.

        A frame that did not come whole is read into one buffer of its size,
        straight from the socket: no growing buffer, no second copy.
        """
        buffer, size = self._buffer, self._size
        if len(buffer) >= 4 + size:  # the usual small call came whole
            with memoryview(buffer) as view:  # one copy of the frame, not two (a slice, then bytes)
                frame: bytes | bytearray = bytes(view[4 : 4 + size])
            del buffer[: 4 + size]
            return frame
        frame = bytearray(size)
        have = len(buffer) - 4
        frame[:have] = memoryview(buffer)[4:]
        buffer.clear()
        deadline = self._deadline()  # (from now: the wait for room in the budget is not the peer's)
        with memoryview(frame) as view:
            while have < size:
                got = self._recv_into(view[have:], min(size - have, self.MAX_CHUNK), deadline)
                if not got:
                    raise ConnectionResetError(f"peer closed the connection {have} bytes into a frame")
                have += got
        return frame

    def skip(self) -> None:
        """Read the rest of the frame and throw it away (a call refused unread),
        through one small buffer.

        Raises:
            TimeoutError, ConnectionResetError: the rest did not come within ``body_timeout``.
        """
        buffer, end = self._buffer, 4 + self._size
        if len(buffer) >= end:
            del buffer[:end]
            return
        left = end - len(buffer)
        buffer.clear()
        deadline = self._deadline()
        with memoryview(bytearray(min(left, self.SKIP_CHUNK))) as scratch:
            while left:
                got = self._recv_into(scratch, min(left, len(scratch)), deadline)
                if not got:
                    raise ConnectionResetError(f"peer closed the connection {left} bytes before a frame's end")
                left -= got

    def _deadline(self) -> float | None:
        """``body_timeout`` from now, all told: when a frame begun now must be in, or a reply
        begun now taken (a peer that sends or reads a byte now and then holds no longer)."""
        return None if self.body_timeout is None else time.monotonic() + self.body_timeout

    def _recv_into(self, view: memoryview, size: int, deadline: float | None) -> int:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"a frame's body did not come within {self.body_timeout:g}s")
            self._set_timeout(left)
        try:
            return self.sock.recv_into(view, size)
        except BlockingIOError:  # SO_RCVTIMEO passed
            raise TimeoutError(f"a frame's body did not come within {self.body_timeout:g}s") from None

    def _peek(self, size: int) -> None:
        """Have the frame's first ``size`` bytes in the buffer."""
        if size > self._size:
            raise FrameError(f"a frame of {self._size} bytes ends inside its call's head")
        if len(self._buffer) < 4 + size:
            self._fill(4 + size, allow_eof=False, deadline=self._frame_deadline)

    def send(self, payload: bytes) -> None:
        """Write ``payload`` as one frame: its head and it in one system call,
        without a copy joining them; all of it within ``body_timeout``.

        Raises:
            TimeoutError: the peer did not take it in time.
        """
        head = _HEAD.pack(len(payload))
        if not self._kernel:  # TLS
            self._send_all(memoryview(head + payload), self._deadline())
            return
        try:
            sent = self.sock.sendmsg((head, payload))
        except BlockingIOError:
            sent = 0
        if sent == 4 + len(payload):  # the usual case: the socket's buffer took it all
            return
        deadline = self._deadline()
        if sent < 4:
            self._send_all(memoryview(head)[sent:], deadline)
            sent = 4
        with memoryview(payload) as view:
            self._send_all(view[sent - 4 :], deadline)

    def _send_all(self, view: memoryview, deadline: float | None) -> None:
        """Send ``view`` within ``deadline`` all told (a socket's timeout is per write: a
        peer that takes a little before each one ran out would hold the reply for ever)."""
        while view:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"a reply was not taken within {self.body_timeout:g}s")
                if self._kernel:
                    self._sndtimeo(left)
                else:
                    self._set_timeout(left)
            try:
                view = view[self.sock.send(view[: self.MAX_CHUNK]) :]
            except BlockingIOError:  # SO_SNDTIMEO passed with nothing sent: check the deadline
                continue

    def _sndtimeo(self, timeout: float | None) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))

    def _set_timeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:
            if self._kernel:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
            else:
                self.sock.settimeout(timeout)
            self._timeout = timeout

    def _recv(self, size: int) -> bytes:
        try:
            return self.sock.recv(size)
        except BlockingIOError:  # SO_RCVTIMEO passed
            raise TimeoutError(f"nothing came within {self._timeout}s") from None

    def _fill(self, size: int, allow_eof: bool, deadline: float | None = None) -> bool:
        """Read until the buffer holds ``size`` bytes (by ``deadline``, if given: the frame's);
        False if the peer closed before any."""
        buffer = self._buffer
        while len(buffer) < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"a frame did not come within {self.body_timeout:g}s of its first byte")
                self._set_timeout(left)
            chunk = self._recv(min(max(self.CHUNK, size - len(buffer)), self.MAX_CHUNK))
            if not chunk:
                if allow_eof and not buffer:
                    return False
                raise ConnectionResetError(f"peer closed the connection {len(buffer)} bytes into a frame")
            buffer += chunk
        return True


def _timeval(timeout: float | None) -> bytes:
    """``timeout`` as SO_RCVTIMEO and SO_SNDTIMEO take it (None: for ever, which is 0 there;
    a positive timeout is at least 1 µs, never 0)."""
    if timeout is None:
        return _TIMEVAL.pack(0, 0)
    micros = max(1, int(timeout * 1_000_000))
    return _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)


def head_of_frame(buffer: bytes | bytearray) -> tuple[str, int] | None:
    """The method and sequence id of the call whose frame (with its 4-byte size) ``buffer``
    begins; None until enough of it has come.

    Raises:
        FrameError: it does not start as a strict binary-protocol call.
    """
    if len(buffer) < 12:
        return None
    name_size = _name_size(buffer)
    if len(buffer) < 16 + name_size:
        return None
    return _name_and_seqid(buffer, name_size)


def _name_size(buffer: bytes | bytearray) -> int:
    """The size of the method name of the call whose frame (with its 4-byte size) ``buffer``
    begins, from its first 12 bytes.

    Raises:
        FrameError: it does not start as a strict binary-protocol call.
    """
    version, name_size = _CALL_HEAD(buffer, 4)
    if version & 0xFFFF0000 != _VERSION_1:
        raise FrameError("not a strict binary-protocol message (bad version header)")
    if not 0 < name_size <= 128:
        raise FrameError(f"method name of {name_size} bytes")
    return name_size


def _name_and_seqid(buffer: bytes | bytearray, name_size: int) -> tuple[str, int]:
    """The method name and sequence id of the call ``buffer`` begins (:func:`_name_size`)."""
    return bytes(buffer[12 : 12 + name_size]).decode("ascii", "replace"), _I32(buffer, 12 + name_size)[0]


def call_head(frame: bytes | bytearray) -> tuple[str, int]:
    """The method a call names and its sequence id (a frame :func:`check_call` passed)."""
    size = _I32(frame, 4)[0]
    return bytes(frame[8 : 8 + size]).decode("ascii", "replace"), _I32(frame, 8 + size)[0]


def check_call(frame: bytes | bytearray, max_items: int = DEFAULT_MAX_ITEMS) -> None:
    """Raise FrameError unless ``frame`` is one well-formed binary-protocol call."""
    _check_message(frame, _CALL_TYPES, "a call (a reply or an exception sent to a server)", max_items)


def check_answer(frame: bytes | bytearray | memoryview) -> None:
    """Raise FrameError unless ``frame`` is one well-formed binary-protocol answer (a reply or an
    exception), before thriftpy2 decodes it: an answer of 90 bytes declaring lists of 2**31-1
    elements that take no bytes held a server's pushes to a hostile subscriber, and the whole
    process with them, for minutes (the client's calls too, from a hostile server). Its elements
    are bounded by its bytes (each takes one at least), which the answer's reader bounds."""
    _check_message(frame, _ANSWER_TYPES, "an answer (a call sent to a client)", len(frame))


def _check_message(frame: bytes | bytearray | memoryview, types: tuple[int, ...], kind: str, max_items: int) -> None:
    try:
        version = _I32(frame, 0)[0] & 0xFFFFFFFF
        if version & 0xFFFF0000 != _VERSION_1:
            raise FrameError("not a strict binary-protocol message (bad version header)")
        if version & 0xFF not in types:
            raise FrameError(f"a message of type {version & 0xFF}, not {kind}")
        name_size = _I32(frame, 4)[0]
        if not 0 < name_size <= 128:
            raise FrameError(f"method name of {name_size} bytes")
        walker = _Walker(frame, max_items)
        end = walker.value(12 + name_size, T_STRUCT, 0)
    except (struct.error, IndexError) as e:
        raise FrameError("frame ends inside a value") from e
    if end != len(frame):
        raise FrameError(f"{len(frame) - end} bytes after the message's values")


class _Walker:
    """Walks values without building them; returns where each one ends."""

    def __init__(self, frame: bytes | bytearray | memoryview, max_items: int) -> None:
        self.frame, self.items = frame, max_items

    def _count(self, size: int, pos: int) -> None:
        if size < 0 or size > len(self.frame) - pos:
            raise FrameError(f"a container declares {size} elements with {len(self.frame) - pos} bytes left")
        self.items -= size
        if self.items < 0:
            raise TooManyItems("too many container elements in one frame")

    def value(self, pos: int, ttype: int, depth: int) -> int:
        width = _FIXED.get(ttype)
        if width is not None:
            return pos + width
        if ttype == T_STRING:
            return self._string(pos)
        if ttype not in _CONTAINERS:
            raise FrameError(f"unknown Thrift type {ttype}")
        if depth >= MAX_DEPTH:
            raise FrameError(f"values nested deeper than {MAX_DEPTH}")
        if ttype == T_STRUCT:
            return self._struct(pos, depth)
        if ttype == T_MAP:
            key_type, value_type, size = _MAP(self.frame, pos)
            pos += 6
            self._count(size, pos)
            for _ in range(size):
                pos = self.value(self.value(pos, key_type, depth + 1), value_type, depth + 1)
            return pos
        element_type, size = _LIST(self.frame, pos)
        pos += 5
        self._count(size, pos)
        width = _FIXED.get(element_type)
        if width is not None:
            return pos + size * width
        if element_type == T_STRUCT:  # the common case (a batch of messages), walked inline
            for _ in range(size):
                pos = self._struct(pos, depth + 1)
            return pos
        for _ in range(size):
            pos = self.value(pos, element_type, depth + 1)
        return pos

    def _string(self, pos: int) -> int:
        size = _I32(self.frame, pos)[0]
        if size < 0 or size > len(self.frame) - pos - 4:
            raise FrameError(f"a string declares {size} bytes with {len(self.frame) - pos - 4} left")
        return pos + 4 + size

    def _struct(self, pos: int, depth: int) -> int:
        frame = self.frame
        while True:
            ftype = frame[pos]
            if ftype == T_STOP:
                return pos + 1
            if ftype == T_STRING:
                pos = self._string(pos + 3)
            else:
                pos = self.value(pos + 3, ftype, depth + 1)
