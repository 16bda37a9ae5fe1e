"""Who writes each partition, under which fence (SPEC C2, C10): the core's write side.

While this process owns a partition it holds a :class:`PartitionWriter`:
the partition's ID allocator, and the fence every write to the partition
carries (storage/fence.py). The writer is made when the partition is
*taken* from the store, at once when a coordinator says this process gained
it, or on its first write, and forgotten when the partition moves, or when
the store refuses a write (another server took it since).

Taking comes before seeding: once the store has the new epoch, no earlier
owner's write can land, so the allocator, seeded from what is stored then
(the last row, the fence's floor, the ID floor, the timers' high-water
mark), is above every ID any earlier owner gave.

Each partition has one lock: allocation and the write happen under it, so
rows become visible in ID order (subscribers and tailing scanners rely on it).

A writer also knows the lanes' last puts (requests.py): a put sent again
after a broken connection is answered with the IDs it was written under.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .config import Durability, QueueInfo
from .errors import Fenced, HQueueError, NotPartitionOwner
from .ids import IDAllocator
from .keys.timers import high_water_range
from .message import MAX_SEQUENCE, MessageID, decode_rowkey, key_after
from .requests import Request, RequestLog
from .storage import Storage
from .storage.base import read_id_floor
from .storage.fence import Fence

if TYPE_CHECKING:
    from .coordination import Coordinator

logger = logging.getLogger(__name__)

Partition = tuple[str, int]


@dataclass
class PartitionWriter:
    """What this process writes a partition with while it owns it: the ID
    allocator, the fence every write carries, and the lanes' last puts."""

    allocator: IDAllocator
    fence: Fence
    requests: RequestLog = field(default_factory=RequestLog)


class Answer(NamedTuple):
    """A put with a request, and the IDs it is written under: recorded in its write."""

    request: Request
    first: MessageID
    size: int


class PartitionWriters:
    """The writers of the partitions this process owns, over one store.

    Args:
        storage: The store.
        queue_info: A queue's info by name (the engine's cache).
    """

    def __init__(self, storage: Storage, queue_info: Callable[[str], QueueInfo]) -> None:
        self.storage, self._queue_info = storage, queue_info
        self._lock = threading.Lock()
        self._locks: dict[Partition, threading.Lock] = {}
        self._writers: dict[Partition, PartitionWriter] = {}
        self._coordinator: Coordinator | None = None

    # -- ownership ------------------------------------------------------------------

    def follow(self, coordinator: Coordinator) -> None:
        """Write only the partitions ``coordinator`` says this process owns: a gained
        partition is taken from the store (a new fence) at once, a lost one forgotten."""
        with self._lock:
            if self._coordinator is not coordinator:
                coordinator.add_listener(self._ownership_changed)
            self._coordinator = coordinator

    def forget(self, partitions: set[Partition]) -> None:
        """Drop the writers of partitions this process no longer owns (or owns anew).

        Another server may write to them meanwhile; if ownership comes back,
        the partition is taken from the store again and its allocator seeded
        from what is stored.
        """
        for key in partitions:
            with self.lock(*key):
                self._writers.pop(key, None)

    def drop_queue(self, name: str) -> None:
        """The queue was deleted: forget its writers."""
        with self._lock:
            for key in [k for k in self._writers if k[0] == name]:
                del self._writers[key]

    def _ownership_changed(self, gained: set[Partition], lost: set[Partition]) -> None:
        self.forget(gained | lost)
        if gained:  # take them now, so a paused former owner is fenced before our first write
            threading.Thread(target=self._take, args=(gained,), name="hqueue-take", daemon=True).start()

    def _take(self, partitions: set[Partition]) -> None:
        for name, pid in sorted(partitions):
            try:
                self.fence(name, pid)
            except (HQueueError, OSError):  # not ours any more, or the store is away: the first write takes it
                logger.debug("could not take %s partition %d now", name, pid, exc_info=True)

    # -- writers --------------------------------------------------------------------

    def lock(self, name: str, pid: int) -> threading.Lock:
        """The partition's write lock."""
        key = (name, pid)
        lock = self._locks.get(key)
        if lock is None:
            with self._lock:
                lock = self._locks.setdefault(key, threading.Lock())
        return lock

    def _of(self, name: str) -> list[PartitionWriter]:
        """The writers held for the queue's partitions."""
        return [w for (q, _), w in list(self._writers.items()) if q == name]

    def allocators(self, name: str) -> list[IDAllocator]:
        """The allocators held for the queue's partitions."""
        return [w.allocator for w in self._of(name)]

    def truncated(self, name: str) -> None:
        """The queue was truncated (call under its partitions' locks): the lanes' last puts
        held here went with it (their records in the store too), so none answers a put sent
        again. A put waiting for a lock the truncate held was checked against the queue's
        floor as it was before (its definition read first): answered from the record still
        held here, its first copy gone (a review)."""
        for writer in self._of(name):
            writer.requests = RequestLog()

    def held(self, info: QueueInfo, pid: int) -> PartitionWriter:
        """The partition's writer; on first use the partition is taken from the store
        and the allocator seeded above everything stored (call under its lock).

        Raises:
            NotPartitionOwner: the coordinator says another server owns it, or
                the store holds a newer owner's epoch.
        """
        writer = self._writers.get((info.name, pid))
        if writer is None:
            coordinator = self._coordinator
            if coordinator is not None and not coordinator.owns(info.name, pid):
                raise NotPartitionOwner(info.name, pid, coordinator.owner(info.name, pid))
            token = coordinator.token(info.name, pid) if coordinator is not None else None
            try:
                fence = self.storage.take_partition(info.name, pid, token)  # first: every write before it is seen
            except Fenced as e:
                logger.warning("could not take %s partition %d: %s", info.name, pid, e)
                raise
            writer = self._writers[(info.name, pid)] = PartitionWriter(self._seeded(info, pid, fence), fence)
        return writer

    def _seeded(self, info: QueueInfo, pid: int, fence: Fence) -> IDAllocator:
        last = self.storage.last_rowkey(info.name, pid)
        allocator = IDAllocator(decode_rowkey(last)[1] if last else None)
        if fence.floor:  # IDs earlier owners may have given (HBase reserves them ahead)
            allocator.advance_to(MessageID.from_bytes(fence.floor))
        # IDs given before a truncate, or reclaimed by TTL, stay below new ones.
        floor = max(info.id_floor, read_id_floor(self.storage, info.name))
        if floor:
            allocator.advance_to(MessageID(floor, MAX_SEQUENCE))
        # Pending timers took IDs too (timers.py): stay above them.
        high = self.storage.scan(info.name, *high_water_range(pid), None, 1)
        if high:
            allocator.advance_to(MessageID.from_bytes(high[0][1]))
        return allocator

    def fence(self, name: str, pid: int) -> Fence:
        """The partition's fence, taking the partition from the store if this process has not yet.

        Raises:
            NotPartitionOwner: another server owns it.
        """
        writer = self._writers.get((name, pid))
        if writer is None:
            info = self._queue_info(name)
            with self.lock(name, pid):
                writer = self.held(info, pid)
        return writer.fence

    # -- fenced writes ----------------------------------------------------------------

    def answered(self, info: QueueInfo, pid: int, request: Request | None, count: int) -> Answer | None:
        """The answer of ``request``'s put if it was written already (call under the
        partition's lock): by this process, or, for a put marked resent, by any
        earlier owner (the partition is taken first, so their writes are all seen)."""
        if request is None:
            return None
        log = self.held(info, pid).requests
        record = log.answered(functools.partial(self._read, info.name), pid, request, count)
        if record is None or record.first.timestamp <= info.id_floor:
            return None  # (at or below the floor: written before a truncate, which took it away)
        if info.durability == Durability.SYNC_WAL:  # its first write may wait for an event loop's fsync
            self.storage.make_durable()
        return Answer(request, record.first, record.size)

    def _read(self, name: str, key: bytes) -> bytes | None:
        cells = self.storage.scan(name, key, key_after(key), None, 1)
        return cells[0][1] if cells and cells[0][0] == key else None

    def store(
        self,
        info: QueueInfo,
        pid: int,
        writer: PartitionWriter,
        cells: Sequence[tuple[bytes, bytes]],
        deletes: Sequence[bytes] = (),
        high: bytes = b"",
        answer: Answer | None = None,
    ) -> None:
        """A write to the partition under ``writer``'s fence (call under the partition's lock),
        with ``answer``'s record (and expired records deleted now and then).

        Raises:
            Fenced: another server has taken the partition since.
        """
        record = None
        if answer is not None:
            record = writer.requests.record(*answer)
            cells = [*cells, writer.requests.cell(pid, answer.request.lane, record)]
            if writer.requests.sweep_due():
                scan = lambda start, stop, limit: self.storage.scan(info.name, start, stop, None, limit)  # noqa: E731
                deletes = [*deletes, *writer.requests.expired(scan, pid)]
        try:
            self.storage.write(
                info.name, cells, info.durability, deletes, fence=writer.fence, high=high, ttl=info.ttl,
                created=info.created,
            )  # fmt: skip
        except Fenced:
            self._refused(info.name, pid, writer.fence)
            raise
        if answer is not None and record is not None:
            writer.requests.written(answer.request.lane, record)

    def write_meta(
        self,
        name: str,
        pid: int,
        puts: dict[str, bytes],
        deletes: Sequence[str] = (),
        durability: str = Durability.SYNC_WAL,
        entered: Callable[[], object] | None = None,
    ) -> None:
        """Write a partition's metadata (a consumer group's progress) under its fence
        (``entered``: see :meth:`Storage.write_meta`).

        Raises:
            Fenced: another server has taken the partition since.
        """
        fence = self.fence(name, pid)
        try:
            self.storage.write_meta(puts, deletes, durability, fence=fence, entered=entered)
        except Fenced:
            self._refused(name, pid, fence)
            raise

    def check(self, name: str, pid: int) -> None:
        """Raise Fenced (or NotPartitionOwner) unless this process still holds the partition."""
        self.write_meta(name, pid, {})

    def _refused(self, name: str, pid: int, fence: Fence) -> None:
        """Forget a writer the store refused. Its next write takes the partition
        again only if the coordinator still says this process owns it, and only
        with a token at least the stored epoch (storage/fence.py)."""
        writer = self._writers.get((name, pid))
        if writer is not None and writer.fence == fence:
            self._writers.pop((name, pid), None)
        logger.warning("%s partition %d was taken by another server: write refused", name, pid)
