"""Server-side MessageID assignment for one partition (SPEC C2).

The allocator hands out ``(timestamp, sequence)`` pairs that strictly
increase, whatever the wall clock does:

* a new millisecond starts the sequence at 0;
* within one millisecond the sequence counts up to 32767 and then the IDs
  continue in the next millisecond (borrowing from the future, as HBase's
  HQueue coprocessor does);
* a clock that steps backwards keeps the last timestamp, so IDs never go
  backwards.

It is seeded with the last ID stored in the partition, so a restart or a new
owner after failover continues above everything already written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import repeat

from .errors import InvalidArgument
from .message import MAX_SEQUENCE, MessageID


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class IDAllocator:
    """Allocates strictly increasing MessageIDs for one partition.

    Not thread-safe by itself: the caller holds the partition's write lock
    across allocation *and* the write, so that rows become visible in ID
    order (a reader never sees ID n+1 before ID n).

    Args:
        last: The highest ID already used in the partition, if any.
        clock: Returns milliseconds since the epoch; tests inject their own.
    """

    def __init__(self, last: MessageID | None = None, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._clock = clock
        self._ts, self._seq = (last.timestamp, last.sequence) if last else (-1, MAX_SEQUENCE)

    @property
    def last(self) -> MessageID | None:
        """The last ID handed out (or seeded), None if there is none."""
        return MessageID(self._ts, self._seq) if self._ts >= 0 else None

    def advance_to(self, last: MessageID) -> None:
        """Never hand out an ID at or below ``last`` (used on re-seeding)."""
        if (last.timestamp, last.sequence) > (self._ts, self._seq):
            self._ts, self._seq = last.timestamp, last.sequence

    def allocate(self, count: int = 1) -> list[MessageID]:
        """``count`` consecutive IDs, each greater than every earlier one."""
        return consecutive(self.reserve(count), count)

    def reserve(self, count: int) -> MessageID:
        """Take ``count`` consecutive IDs (see :func:`consecutive`); return the first."""
        if count < 1:
            raise InvalidArgument(f"'count' must be >= 1, got {count}")
        now = self._clock()
        ts, seq = self._ts, self._seq
        if now > ts:
            ts, seq = now, -1
        seq += 1
        if seq > MAX_SEQUENCE:
            ts, seq = ts + 1, 0
        first = tuple.__new__(MessageID, (ts, seq))
        last = seq + count - 1  # as consecutive() counts: MAX_SEQUENCE + 1 IDs per millisecond
        self._ts, self._seq = ts + last // (MAX_SEQUENCE + 1), last % (MAX_SEQUENCE + 1)
        return first


def runs(first: MessageID, count: int) -> list[tuple[int, range]]:
    """The IDs of a batch as (timestamp, sequences) runs of one millisecond each.

    The sequence counts up from ``first``; past MAX_SEQUENCE it goes on at 0
    in the next millisecond.
    """
    timestamp, sequence = first
    if sequence + count <= MAX_SEQUENCE + 1:
        return [(timestamp, range(sequence, sequence + count))]
    out = []
    while count > 0:
        run = min(count, MAX_SEQUENCE + 1 - sequence)
        out.append((timestamp, range(sequence, sequence + run)))
        count -= run
        timestamp, sequence = timestamp + 1, 0
    return out


def consecutive(first: MessageID, count: int) -> list[MessageID]:
    """``count`` IDs from ``first`` on, as an allocator hands them out in one batch (built in C)."""
    ids: list[MessageID] = []
    new = tuple.__new__
    for timestamp, sequences in runs(first, count):
        ids += map(new, repeat(MessageID), zip(repeat(timestamp), sequences))
    return ids
