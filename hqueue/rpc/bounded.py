"""A thriftpy2 socket whose every wait ends by a deadline, and whose answers are bounded.

thriftpy2's sockets time each ``recv`` alone: a peer that sends one byte
every few seconds holds a call for as long as it likes, and its framed
transport allocates whatever size a frame's head declares (up to 2 GiB).
:class:`Bounded` ends every wait of a call by the call's *deadline* (a
:func:`time.monotonic` instant) and refuses an answer frame over
``max_answer`` bytes from its head. The remote client's connections use it
(client/pool.py), and so do the server's pushes to subscribers
(subscriptions/loops.py).
"""

from __future__ import annotations

import contextlib
import functools
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from thriftpy2.transport import TSocket, TSSLSocket, TTransportException

from . import wire
from .frames import FrameError, check_answer
from .spin import Spin

#: A socket's timeout set this recently (s) for the same deadline is not set again: the
#: answer's read right after its request's write lets the wait end at most this much past
#: the deadline, and saves a system call (settimeout is an ioctl each time).
ARM_SLACK = 0.005


class Bounded:
    """A thriftpy2 socket whose every wait ends by ``deadline`` (None: ``socket_timeout`` per
    wait), within ARM_SLACK.

    Given a ``share`` (an instant before the deadline) and ``at_share``: while no byte of
    the answer has come, the wait stops at ``share`` to call ``at_share()``, which returns
    the next such instant (None: wait to the deadline) or raises to give the call up (its
    owner moved: :meth:`hqueue.client.groups.RemoteGroups._at`). Nothing of the answer was
    read, so the wait goes on where it was."""

    deadline: float | None = None
    share: float | None = None
    at_share: Callable[[], float | None] | None = None
    sock: socket.socket | None
    #: Polls for an answer before the read blocks, while answers come that soon (rpc/spin.py).
    spin: Spin | None = None
    _readable: Callable[[], list] | None = None
    _armed: tuple[float, float] = (0.0, -1.0)  # (when, for which instant) the timeout was set
    _got = False  # a byte of the answer came since the request went

    def _arm(self, reading: bool) -> None:
        until = self.deadline
        if until is None or self.sock is None:
            return
        share = self.share
        if reading and share is not None and share < until and not self._got:
            until = share  # (the share bounds the wait for an answer only: a send has the deadline)
        now = time.monotonic()
        left = until - now
        if left <= 0:
            if reading and until == self.deadline and readable_now(self.sock):  # (come while an owner look ran)
                left = ARM_SLACK
            else:
                raise TimeoutError("the call's deadline passed")
        armed_at, armed_for = self._armed
        if armed_for == until and now - armed_at < ARM_SLACK:
            return
        self.sock.settimeout(left)  # sendall: the whole send; recv: this read
        self._armed = (now, until)

    def _go_on(self) -> bool:
        """A wait timed out: whether it was at the share, and the caller says wait on."""
        share, deadline, at_share = self.share, self.deadline, self.at_share
        if share is None or at_share is None or self._got or deadline is None or share >= deadline:
            return False
        self.share = at_share()  # (raises to give the call up)
        return True

    #: The largest answer frame taken, in bytes (its head says).
    max_answer: int = wire.MAX_ANSWER_BYTES
    _head = b""  # the part of an answer frame's head read so far
    _left = 0  # the bytes of the answer frame being read still to come
    _body: list[bytes] = []  # (replaced, never appended to here) what came of it so far

    def read(self, sz: int) -> bytes:
        if self.sock is None:  # (closed under a call, or by its pool's release: thriftpy2 asserts)
            raise TTransportException(TTransportException.NOT_OPEN, "the connection was closed")
        spin, started = (self.spin if not self._got else None), 0.0  # (an answer's first read: the rest is coming)
        if spin is not None and self._readable is not None:
            started = time.perf_counter()
            if spin.poll(self._readable):
                spin = None
        while True:
            try:
                self._arm(True)
                data: bytes = super().read(sz)  # type: ignore[misc]
                break
            except TimeoutError:
                if not self._go_on():
                    raise
        if spin is not None:
            spin.blocked(time.perf_counter() - started)
        self._got = True
        self._check_frames(data)
        return data

    def poll_first(self, limit_us: int) -> None:
        """Poll up to ``limit_us`` for each answer before its read blocks (rpc/spin.py): a plain
        socket's (a TLS one may hold what poll cannot see)."""
        sock = self.sock
        if limit_us and sock is not None and not isinstance(sock, ssl.SSLSocket):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            self.spin, self._readable = Spin(limit_us), functools.partial(poller.poll, 0)

    def close(self) -> None:
        """Shut the socket down (a call blocked on it wakes) and close it, once: a pool's release
        and a call's failure may close it at once from two threads (thriftpy2's close read
        ``sock`` twice, and the second time found None)."""
        self.spin = self._readable = None  # (the poller watched this socket's descriptor)
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _check_frames(self, data: bytes) -> None:
        """Refuse an answer frame whose head is 0 or over ``max_answer`` before thriftpy2
        allocates it (it mallocs what a head says, up to 2 GiB), and one that is not a
        well-formed answer before it decodes it (:func:`~hqueue.rpc.frames.check_answer`):
        TTransportException, which ends the connection. Each frame is held here until its
        last byte (thriftpy2 decodes none before then)."""
        at, left = 0, self._left
        if left:
            if left > len(data):
                self._body.append(data)
                self._left -= len(data)
                return
            self._body.append(data[:left])
            at, self._left = left, 0
            body, self._body = b"".join(self._body), []
            check_answer_frame(body)
        while at < len(data):
            head = self._head + data[at : at + 4 - len(self._head)]
            at += len(head) - len(self._head)
            if len(head) < 4:
                self._head = head
                return
            self._head = b""
            size = int.from_bytes(head, "big", signed=True)
            if not 0 < size <= self.max_answer:
                raise TTransportException(TTransportException.UNKNOWN, f"an answer frame of {size} bytes")
            if at + size > len(data):
                self._body, self._left = [data[at:]], at + size - len(data)
                return
            check_answer_frame(memoryview(data)[at : at + size])
            at += size

    def write(self, buf: bytes) -> None:
        if self.sock is None:
            raise TTransportException(TTransportException.NOT_OPEN, "the connection was closed")
        self._got = False
        self._arm(False)
        super().write(buf)  # type: ignore[misc]


class BoundedSocket(Bounded, TSocket):
    pass


class BoundedSSLSocket(Bounded, TSSLSocket):
    pass


def check_answer_frame(answer: bytes | memoryview) -> None:
    """:func:`~hqueue.rpc.frames.check_answer`, failing as a transport does (the connection ends)."""
    try:
        check_answer(answer)
    except FrameError as e:
        raise TTransportException(TTransportException.UNKNOWN, f"a malformed answer: {e}") from None


def readable_now(sock: Any) -> bool:
    """Whether ``sock`` has something to read (or its end) now, without waiting: ``poll``, which
    takes any descriptor (``select`` refuses those past 1023: every idle connection of a
    process with many files open looked stale). True if the socket is gone."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
