"""Builds the per-topic index (topic_index.py) behind the writes.

A put to an indexed queue writes only the message's row, as on any queue;
the owner of each partition then reads the new rows in order and writes
their index entries, with the partition's *indexed-to* mark (the first ID
not yet indexed), in one storage write. A topic read takes the index below
the mark and the rows above it (``Engine._scan_index``), so it is exact
whatever the indexer's lag; the lag only costs the reader the rows not yet
indexed.

Why behind and not in the put: index entries land at random places in the
store (one per topic), and an LSM store's memtable pays for random keys;
with a million topics that halved the put rate. The indexer pays it in its
own thread instead, in batches.

The mark survives restarts (it is in the store); after a failover the new
owner goes on from it. Entries are rewritten identically if two owners
overlap for a moment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .errors import QueueNotFound

if TYPE_CHECKING:
    from .coordination import Coordinator
    from .engine import Engine

logger = logging.getLogger(__name__)

#: Rows indexed per storage write.
INDEX_BATCH = 5000
#: Seconds before a partition whose indexing failed is tried again.
RETRY_SECONDS = 1.0


class Indexer:
    """One thread indexing the owned partitions of indexed queues as they are written."""

    def __init__(self, engine: Engine, coordinator: Coordinator, queues: Callable[[], Iterable[tuple[str, int]]]):
        self.engine, self.coordinator, self._queues = engine, coordinator, queues
        self._dirty: dict[tuple[str, int], None] = {}  # in arrival order
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.indexed = 0

    def start(self) -> None:
        self.coordinator.add_listener(self._ownership_changed)
        self.engine.add_write_listener(self._written)
        self._thread = threading.Thread(target=self._run, name="hqueue-indexer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _mark(self, keys: Iterable[tuple[str, int]]) -> None:
        with self._cond:
            for key in keys:
                self._dirty[key] = None
            self._cond.notify()

    def _written(self, queue: str, partition_id: int) -> None:
        try:
            indexed = self.engine.queue_info(queue).topic_index
        except QueueNotFound:
            return
        if indexed:
            self._mark([(queue, partition_id)])

    def _ownership_changed(self, gained: set[tuple[str, int]], lost: set[tuple[str, int]]) -> None:
        self._mark(gained)

    def idle(self) -> bool:
        """Whether every write seen so far is indexed (tests, benches)."""
        with self._cond:
            return not self._dirty

    def _run(self) -> None:
        try:  # what was written before this process started
            self._mark((q, p) for q, n in self._queues() for p in range(n))
        except Exception:
            logger.exception("listing queues to index failed; indexing follows new writes")
        while True:
            with self._cond:
                while not self._dirty and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                queue, pid = next(iter(self._dirty))
            more = self._index(queue, pid)
            with self._cond:
                if not more:
                    self._dirty.pop((queue, pid), None)
                else:  # to the back: partitions take turns
                    self._dirty.pop((queue, pid), None)
                    self._dirty[(queue, pid)] = None

    def _index(self, queue: str, pid: int) -> bool:
        """Index one batch of the partition; True if more rows wait."""
        if not self.coordinator.owns(queue, pid):
            return False
        try:
            count, more = self.engine.index_partition(queue, pid, INDEX_BATCH)
            self.indexed += count
            return more
        except QueueNotFound:
            return False
        except Exception:
            logger.exception("indexing %s/%d failed; trying again in %gs", queue, pid, RETRY_SECONDS)
            with self._cond:
                self._cond.wait(RETRY_SECONDS)
            return True
