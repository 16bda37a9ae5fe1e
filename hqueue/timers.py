"""Timer messages (SPEC X1): put now, delivered at a chosen time.

A timer is stored in the queue's own table, in the partition's *timer
range*: rows whose 2-byte prefix is ``pid | 0x8000`` (real partitions are
below 32768, so the two ranges never meet). Its cell key is::

    timer_prefix(pid) + due (8 bytes, ms) + 0x0000 + write ID (10 bytes) + topic

so the store keeps timers sorted by due time, and the write ID (taken from
the partition's ID allocator) makes each one unique. Nothing of a pending
timer is held in RAM: the firing loop keeps, per owned partition, only the
earliest due time, read back from the store.

Firing writes the message into the partition with a fresh ID and deletes the
timer row in one storage write, under the partition's write lock, so a
timer fires once, or (cancelled first) never. ``cancel`` takes the same
lock. The owner of a partition fires its timers (SPEC C10): after a restart
or a failover the new owner reads them from the store.

TTL: a timer counts as a message delivered at its due time, so one still
unfired more than the queue's TTL after its due time (every server down that
long) expires unfired, as its message would have.
"""

from __future__ import annotations

import heapq
import logging
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from .errors import InvalidArgument, QueueDisabled, QueueNotFound
from .ids import wall_clock_ms
from .message import MAX_TIMESTAMP, ROWKEY_LENGTH, MessageID, key_after

if TYPE_CHECKING:
    from .coordination import Coordinator
    from .engine import Engine

logger = logging.getLogger(__name__)

TIMER_FLAG = 0x8000
_TIMER_ROW = struct.Struct(">HQH")
#: Where a timer's write ID starts and its topic starts, in its cell key.
_ID_AT, _TOPIC_AT = ROWKEY_LENGTH, ROWKEY_LENGTH + 10
#: The cell that remembers a partition's highest timer write ID (above every due time).
_HIGH_WATER_DUE = 2**64 - 1
#: Timers fired per storage write.
FIRE_BATCH = 1000
#: How long the loop waits before retrying a partition whose firing failed.
RETRY_MS = 1000


@dataclass(frozen=True, order=True)
class Timer:
    """A pending timer message, as returned by ``put(..., delay=…)``.

    Pass it to :meth:`HQueue.cancel <hqueue.HQueue.cancel>`; ``str(timer)``
    gives a form that :meth:`parse` (and ``hqueue cancel``) reads back.

    Attributes:
        partition_id: Where the message will be written.
        due: Epoch milliseconds at which it is delivered.
        id: Its write ID (unique within the partition).
    """

    partition_id: int
    due: int
    id: MessageID

    def __str__(self) -> str:
        return f"{self.partition_id}/{self.due}/{self.id}"

    @classmethod
    def parse(cls, text: str) -> Timer:
        """Read back ``str(timer)``: ``"pid/due/timestamp:sequence"``."""
        try:
            pid, due, message_id = text.strip().split("/")
            return cls(int(pid), int(due), MessageID.parse(message_id))
        except (ValueError, TypeError):
            raise InvalidArgument(
                f"not a timer handle: {text!r} (expected 'partition/due/timestamp:sequence')"
            ) from None

    @property
    def due_datetime(self) -> datetime:
        return MessageID(self.due).datetime


def timer_prefix(partition_id: int) -> bytes:
    return (partition_id | TIMER_FLAG).to_bytes(2, "big")


def timer_row(partition_id: int, due: int) -> bytes:
    return _TIMER_ROW.pack(partition_id | TIMER_FLAG, due, 0)


def timer_cell_keys(partition_id: int, due: int, ids: Iterable[MessageID], topics: Iterable[bytes]) -> list[bytes]:
    row = timer_row(partition_id, due)
    return [row + i.to_bytes() + t for i, t in zip(ids, topics, strict=True)]


def high_water_key(partition_id: int) -> bytes:
    return _TIMER_ROW.pack(partition_id | TIMER_FLAG, _HIGH_WATER_DUE, 0)


def due_of(key: bytes) -> int:
    return int.from_bytes(key[2:10], "big")


def id_of(key: bytes) -> MessageID:
    return MessageID.from_bytes(key[_ID_AT:_TOPIC_AT])


def topic_of(key: bytes) -> bytes:
    return key[_TOPIC_AT:]


def pending_range(partition_id: int, until: int | None = None) -> tuple[bytes, bytes]:
    """The key range of the partition's timers due before ``until`` (None: all of them)."""
    stop = _TIMER_ROW.pack(
        partition_id | TIMER_FLAG, min(until, MAX_TIMESTAMP) if until is not None else MAX_TIMESTAMP, 0
    )
    return timer_prefix(partition_id), stop


def one_timer_range(timer: Timer) -> tuple[bytes, bytes]:
    """The key range holding exactly ``timer``'s cell (its topic is not in the handle)."""
    prefix = timer_row(timer.partition_id, timer.due) + timer.id.to_bytes()
    return prefix, key_after(prefix)


def due_ms(deliver_at: datetime | int | None, delay: float | None) -> int:
    """The due time in epoch ms from ``deliver_at`` (a datetime or epoch ms) or ``delay`` (seconds)."""
    if (deliver_at is None) == (delay is None):
        raise TypeError("give 'deliver_at' or 'delay', not both")
    if delay is not None:
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not delay >= 0:
            raise InvalidArgument(f"'delay' must be seconds >= 0, got {delay!r}")
        due = wall_clock_ms() + round(delay * 1000)
    elif isinstance(deliver_at, datetime):
        due = MessageID.from_datetime(deliver_at).timestamp
    elif isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
        due = deliver_at
    else:
        raise TypeError(f"'deliver_at' must be a datetime or epoch milliseconds, not {type(deliver_at).__name__}")
    if not 0 <= due <= MAX_TIMESTAMP:
        raise InvalidArgument(f"a due time must be in 0..2**63-1 ms, got {due}")
    return due


class TimerService:
    """Fires the timers of the partitions this process owns, on time.

    Memory is one heap entry per owned partition with timers, never one per
    timer. A new timer earlier than its partition's next one wakes the loop.
    """

    def __init__(self, engine: Engine, coordinator: Coordinator, queues: Callable[[], Iterable[tuple[str, int]]]):
        self.engine, self.coordinator, self._queues = engine, coordinator, queues
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}
        self._heap: list[tuple[int, str, int]] = []
        self._gained: set[tuple[str, int]] = set()  # partitions whose timers are not read yet
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.coordinator.add_listener(self._ownership_changed)
        self._thread = threading.Thread(target=self._run, name="hqueue-timers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # -- what is due when ------------------------------------------------------------

    def scheduled(self, queue: str, partition_id: int, due: int) -> None:
        """A timer was written: fire the partition at ``due`` if that is sooner."""
        with self._lock:
            known = self._next.get((queue, partition_id))
            if known is not None and known <= due:
                return
            self._set_next(queue, partition_id, due)
        self._wake.set()

    def _set_next(self, queue: str, partition_id: int, due: int | None) -> None:
        if due is None:
            self._next.pop((queue, partition_id), None)
        else:
            self._next[(queue, partition_id)] = due
            heapq.heappush(self._heap, (due, queue, partition_id))

    def _refresh(self, queue: str, partition_id: int) -> None:
        try:
            due = self.engine.next_timer(queue, partition_id)
        except QueueNotFound:
            due = None
        with self._lock:
            self._set_next(queue, partition_id, due)
        self._wake.set()

    def _ownership_changed(self, gained: set[tuple[str, int]], lost: set[tuple[str, int]]) -> None:
        """Called inside the coordinator's rebalance: only note it (the loop reads the store)."""
        with self._lock:
            for key in lost:
                self._next.pop(key, None)
                self._gained.discard(key)
            self._gained.update(gained)
        self._wake.set()

    def _refresh_gained(self) -> None:
        with self._lock:
            gained, self._gained = self._gained, set()
        for queue, pid in gained:
            if self.coordinator.owns(queue, pid) and not self._stopped.is_set():
                self._refresh(queue, pid)

    def _scan_owned(self) -> None:
        for queue, partitions in self._queues():
            for pid in range(partitions):
                if self.coordinator.owns(queue, pid) and not self._stopped.is_set():
                    self._refresh(queue, pid)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._scan_owned()
        except Exception:
            logger.exception("reading pending timers failed; they fire as partitions are used")
        while not self._stopped.is_set():
            if self._gained:
                self._refresh_gained()
            due = self._take_due(wall_clock_ms())
            if isinstance(due, tuple):
                self._fire(*due)
                continue
            self._wake.wait(due)
            self._wake.clear()

    def _take_due(self, now: int) -> tuple[str, int] | float:
        """A partition with timers due now (taken off the heap), or else seconds to wait."""
        with self._lock:
            while self._heap:
                due, queue, pid = self._heap[0]
                if self._next.get((queue, pid)) != due:
                    heapq.heappop(self._heap)  # stale: moved or gone
                    continue
                if due > now:
                    return min(1.0, (due - now) / 1000)
                heapq.heappop(self._heap)
                del self._next[(queue, pid)]
                return queue, pid
        return 1.0

    def _fire(self, queue: str, pid: int) -> None:
        if not self.coordinator.owns(queue, pid):
            return
        try:
            _, next_due = self.engine.fire_timers(queue, pid, wall_clock_ms(), FIRE_BATCH)
        except QueueNotFound:
            return
        except QueueDisabled:
            next_due = wall_clock_ms() + RETRY_MS  # puts are refused: so is firing, until enabled
        except Exception:
            logger.exception("firing timers of %s/%d failed; retrying in %d ms", queue, pid, RETRY_MS)
            next_due = wall_clock_ms() + RETRY_MS
        if next_due is not None:
            self.scheduled(queue, pid, next_due)
