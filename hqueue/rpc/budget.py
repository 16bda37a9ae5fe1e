"""The memory that a server's requests under way may hold, all connections together.

Each request's frame takes its bytes from the budget before its body is
read, and gives them back once its reply is made. A frame that does not fit
waits for room, in turn (first come, first served, so a big frame is not
passed over for ever by smaller ones), for a bounded time; its bytes stay
in the peer's socket meanwhile (TCP's own backpressure), and nothing is
allocated for it. When the wait runs out the call is refused, unread.

A frame that came whole with its head (at most 64 KiB, already in the
connection's read buffer) is counted, but never waits: acks and small puts
keep flowing while big puts queue.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

#: Bytes of frames under way, all connections together (``--max-inflight-bytes``).
DEFAULT_MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
#: Seconds a frame may wait for room before it is refused (``--inflight-wait``).
DEFAULT_INFLIGHT_WAIT = 10.0
#: The part of the budget one client's replies not taken yet may hold (``--inflight-share``).
DEFAULT_INFLIGHT_SHARE = 0.25


class InflightBudget:
    """Bytes held by requests under way, within ``limit``."""

    def __init__(self, limit: int = DEFAULT_MAX_INFLIGHT_BYTES) -> None:
        self.limit = limit
        #: Bytes taken now (may pass ``limit`` by what small frames took without waiting).
        self.used = 0
        self._changed = threading.Condition()
        self._line: deque[object] = deque()
        #: Bytes each owner holds (:meth:`hold`, and answer slots taken for it), and of
        #: those, the answer slots (the rest: replies not taken yet, :meth:`holds`).
        self._held: dict[Hashable, int] = {}
        self._slots: dict[Hashable, int] = {}
        self._waiters = 0

    def reserve(
        self, size: int, wait: float | None, owner: Hashable | None = None, share: int | None = None, slot: bool = False
    ) -> bool:
        """Take ``size`` bytes, waiting up to ``wait`` seconds for room, in turn.

        ``wait`` None: take them now, whatever is taken already (a frame that
        is in memory anyway). False: no room came in time; nothing is taken.
        ``owner``: whose they are; with ``share``, they are taken only while
        the owner holds less than ``share`` bytes (until then the call waits
        out of the line: one owner's calls wait for each other, not the others'
        calls for them). ``slot``: an answer's room or a call's frame, not a reply (:meth:`holds`).
        """
        with self._changed:
            if wait is None:
                self._take(size, owner, slot)
                return True
            deadline = time.monotonic() + wait
            turn: object | None = None
            try:
                while True:
                    if self._fits(owner, share):
                        if turn is None and not self._line and self.used + size <= self.limit:
                            self._take(size, owner, slot)
                            return True
                        if turn is None:
                            turn = object()
                            self._line.append(turn)
                        if self._line[0] is turn and self.used + size <= self.limit:
                            self._take(size, owner, slot)
                            return True
                    elif turn is not None:  # its owner's share filled meanwhile: out of the line
                        self._line.remove(turn)
                        turn = None
                        self._changed.notify_all()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._waiters += 1
                    try:
                        self._changed.wait(left)
                    finally:
                        self._waiters -= 1
            finally:
                if turn is not None:
                    self._line.remove(turn)
                    self._changed.notify_all()  # the next in line may fit now

    def try_reserve(
        self, size: int, owner: Hashable | None = None, share: int | None = None, slot: bool = False
    ) -> bool:
        """Take ``size`` bytes if they fit now (and in ``owner``'s ``share``) and nobody
        waits for room; else take nothing."""
        with self._changed:
            if self._line or self.used + size > self.limit or not self._fits(owner, share):
                return False
            self._take(size, owner, slot)
            return True

    def hold(self, size: int, owner: Hashable) -> None:
        """Count a reply of ``size`` bytes until ``owner``'s peer has taken it (now, never
        waiting: it is made)."""
        self.reserve(size, None, owner)

    def release(self, size: int, owner: Hashable | None = None, slot: bool = False) -> None:
        """Give back what :meth:`reserve` (or :meth:`hold`) took for ``owner``."""
        with self._changed:
            self.used -= size
            if owner is not None:
                _less(self._held, owner, size)
                if slot:
                    _less(self._slots, owner, size)
            if self._waiters:
                self._changed.notify_all()

    def held_by(self, owner: Hashable) -> int:
        """Bytes ``owner`` holds: its frames, answer slots and replies under way."""
        return self._held.get(owner, 0)

    def holds(self, owner: Hashable) -> int:
        """Bytes of ``owner``'s replies not taken yet (its answer slots left out)."""
        return self._held.get(owner, 0) - self._slots.get(owner, 0)

    def _fits(self, owner: Hashable | None, share: int | None) -> bool:
        return owner is None or share is None or self._held.get(owner, 0) < share

    def _take(self, size: int, owner: Hashable | None, slot: bool) -> None:
        self.used += size
        if owner is not None:
            self._held[owner] = self._held.get(owner, 0) + size
            if slot:
                self._slots[owner] = self._slots.get(owner, 0) + size


def _less(counts: dict[Hashable, int], owner: Hashable, size: int) -> None:
    left = counts.pop(owner) - size
    if left:
        counts[owner] = left


class AnswerSlot:
    """The bytes a call's answer may take, held from ``budget`` while the call runs on a
    thread (ThreadedServer's ``answer_slots``, and a loop server's workers), so that calls
    running at once cannot make answers past the budget, nor one owner's past its
    ``share`` (calls of one client running at once were each let in before any answer
    was made: they wait for each other now); ``held`` is 0 when no room came within
    ``wait`` seconds."""

    def __init__(
        self, budget: InflightBudget, size: int, wait: float, owner: Hashable | None = None, share: int | None = None
    ) -> None:
        self.budget, self.size, self.owner, self.share = budget, size, owner, share
        self.held = size if budget.reserve(size, wait, owner, share, slot=True) else 0

    @contextmanager
    def set_aside(self) -> Iterator[AnswerSlot]:
        """Give the bytes back while the call waits (a receive's long poll holds none), and
        take them again after it if there is room now (in its owner's share too), without
        waiting in line behind the calls that wait for room (idle long polls woken by every
        write would hold up the others): see ``held`` after the block (0: none yet, wait again)."""
        self.release()
        yield self
        if self.budget.try_reserve(self.size, self.owner, self.share, slot=True):
            self.held = self.size

    def release(self) -> None:
        """Give back what is held (once)."""
        held, self.held = self.held, 0
        if held:
            self.budget.release(held, self.owner, slot=True)
