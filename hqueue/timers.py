"""Timer messages (SPEC X1): put now, delivered at a chosen time.

A timer is stored in the queue's own table, in the partition's *timer
range*, sorted by due time (keys/timers.py has the layout). Nothing of a pending
timer is held in RAM: the firing loop keeps, per owned partition, only the
earliest due time, read back from the store, and a *floor*: every timer of the
partition still pending is due at the floor or later. Each pass reads from the
floor, so it never steps over the tombstones fired timers leave in RocksDB
until compaction (they made a fire's scan slower the more had fired). A timer
put with a due time below a partition's floor lowers it. A restart, or a
partition gained, starts with no floor: the first pass reads from the head.

One pass fires every partition with timers due, each in one storage write
of all its due timers (up to FIRE_BATCH), then the loop sleeps until the
next due time: a timer is fired as soon as it is due, and under load many go
in each write. When several partitions of SYNC_WAL queues are due together,
their passes run side by side (FIRE_THREADS), so the store's group commit
(storage/commits.py) gives their writes one fsync, not one each: one after
another, eight partitions' fsyncs made a pass 8 ms or more, and timers late
by as much.

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
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .config import Durability
from .errors import QueueDisabled, QueueNotFound
from .ids import wall_clock_ms

if TYPE_CHECKING:
    from .coordination import Coordinator
    from .engine import Engine

logger = logging.getLogger(__name__)

#: Timers fired per storage write.
FIRE_BATCH = 1000
#: How long the loop waits before retrying a partition whose firing failed.
RETRY_MS = 1000
#: Partitions of SYNC_WAL queues fired side by side, sharing fsyncs.
FIRE_THREADS = 8


class TimerService:
    """Fires the timers of the partitions this process owns, on time.

    Memory is one heap entry per owned partition with timers, never one per
    timer. A new timer earlier than its partition's next one wakes the loop.
    """

    def __init__(self, engine: Engine, coordinator: Coordinator, queues: Callable[[], Iterable[tuple[str, int]]]):
        self.engine, self.coordinator, self._queues = engine, coordinator, queues
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}
        #: Per partition: every pending timer is due at this time or later (absent: unknown).
        self._floor: dict[tuple[str, int], int] = {}
        #: Per partition: how many timer puts were heard (a pass's floor holds only if none came meanwhile).
        self._heard: dict[tuple[str, int], int] = {}
        self._heap: list[tuple[int, str, int]] = []
        self._gained: set[tuple[str, int]] = set()  # partitions whose timers are not read yet
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self.coordinator.add_listener(self._ownership_changed)
        self.engine.events.on_schedule(self.scheduled)
        self._thread = threading.Thread(target=self._run, name="hqueue-timers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.engine.events.off(self.scheduled)
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # -- what is due when ------------------------------------------------------------

    def scheduled(self, queue: str, partition_id: int, due: int) -> None:
        """A timer was written: fire the partition at ``due`` if that is sooner."""
        key = (queue, partition_id)
        with self._lock:
            self._heard[key] = self._heard.get(key, 0) + 1
            floor = self._floor.get(key)
            if floor is not None and due < floor:
                self._floor[key] = due
            known = self._next.get(key)
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
        key = (queue, partition_id)
        with self._lock:
            self._floor.pop(key, None)  # read from the head: what is stored now
            heard = self._heard.get(key, 0)
        try:
            due = self.engine.next_timer(queue, partition_id)
        except QueueNotFound:
            due = None
        with self._lock:
            known = self._next.get(key)
            if self._heard.get(key, 0) != heard and known is not None and (due is None or known < due):
                due = known  # a timer put while the store was read (it may not have seen it): its wake-up stands
            self._set_next(queue, partition_id, due)
        self._wake.set()

    def _ownership_changed(self, gained: set[tuple[str, int]], lost: set[tuple[str, int]]) -> None:
        """Called inside the coordinator's rebalance: only note it (the loop reads the store)."""
        with self._lock:
            for key in lost:
                self._next.pop(key, None)
                self._floor.pop(key, None)  # another owner may fire and put meanwhile
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
            if isinstance(due, list):
                self._fire_all(due)
                continue
            self._wake.wait(due)
            self._wake.clear()

    def _take_due(self, now: int) -> list[tuple[str, int]] | float:
        """Every partition with timers due now (taken off the heap), or else seconds to wait."""
        taken: list[tuple[str, int]] = []
        with self._lock:
            while self._heap:
                due, queue, pid = self._heap[0]
                if self._next.get((queue, pid)) != due:
                    heapq.heappop(self._heap)  # stale: moved or gone
                    continue
                if due > now:
                    break
                heapq.heappop(self._heap)
                del self._next[(queue, pid)]
                taken.append((queue, pid))
            if taken:
                return taken
            return min(1.0, (self._heap[0][0] - now) / 1000) if self._heap else 1.0

    def _fire_all(self, partitions: list[tuple[str, int]]) -> None:
        """Fire each partition; those of SYNC_WAL queues side by side, to share fsyncs."""
        synced = [p for p in partitions if self._synced(p[0])]
        if len(synced) < 2:
            synced = []
        for partition in set(partitions).difference(synced):
            self._fire(*partition)
        if synced:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FIRE_THREADS, thread_name_prefix="hqueue-timers-sync")
            for _ in self._pool.map(lambda p: self._fire(*p), synced):
                pass

    def _synced(self, queue: str) -> bool:
        try:
            return self.engine.queue_info(queue).durability == Durability.SYNC_WAL
        except QueueNotFound:
            return False

    def _fire(self, queue: str, pid: int) -> None:
        if not self.coordinator.owns(queue, pid):
            return
        key = (queue, pid)
        with self._lock:
            since, heard = self._floor.get(key, 0), self._heard.get(key, 0)
        try:
            fired = self.engine.fire_timers(queue, pid, wall_clock_ms(), FIRE_BATCH, since)
        except QueueNotFound:
            return
        except QueueDisabled:
            self.scheduled(queue, pid, wall_clock_ms() + RETRY_MS)  # puts are refused: so is firing, until enabled
            return
        except Exception:
            logger.exception("firing timers of %s/%d failed; retrying in %d ms", queue, pid, RETRY_MS)
            self.scheduled(queue, pid, wall_clock_ms() + RETRY_MS)
            return
        with self._lock:
            if self._heard.get(key, 0) == heard and key not in self._gained:  # no put came in meanwhile
                self._floor[key] = fired.floor
        if fired.next_due is not None:
            self.scheduled(queue, pid, fired.next_due)
