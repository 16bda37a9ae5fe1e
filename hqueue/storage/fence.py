"""Partition fences: a write is accepted only from the partition's current owner (SPEC C10).

ZooKeeper decides who owns a partition, but a server that was paused (GC,
SIGSTOP, a frozen VM) past its session may still hold writes that passed its
ownership check before the pause. The store itself must refuse them, or the
paused server's late writes reuse IDs the new owner already acknowledged and
overwrite them. So every partition has an **epoch** in the store:

* A server that gains a partition *takes* it (:meth:`Storage.take_partition`):
  the store sets the epoch atomically and returns a :class:`Fence` holding
  it and a **floor**, an ID at or above every ID that any earlier holder
  may have written. The new owner allocates IDs above the floor. With
  ZooKeeper the epoch is the owner's fencing token (the czxid of its lock
  node, coordination/zookeeper.py), which only grows from owner to owner:
  a take with a lower token is refused, so a stale server never takes a
  partition back. Without a coordinator's token (one process owns
  everything) a take bumps the epoch.
* Every write the owner makes carries its fence. The store accepts it only
  while the epoch is still the fence's; otherwise it raises
  :class:`~hqueue.errors.Fenced` and keeps none of the write's cells.

How each backend keeps the promise:

* **embedded and memory** (one process writes the store): the epoch check and
  the write happen under one lock per partition (:class:`LocalFences`), so a
  write under an old epoch can never land after a take.
* **HBase** has no conditional write across rows, so a write is three steps
  (hbase.py): (1) *reserve*: ``checkAndPut`` on the partition's fence row,
  expecting the writer's epoch, raises the floor to cover the IDs it is about
  to write (reserved ahead, so this round trip is paid at most every
  ``RESERVE_MS``); (2) write the cells; (3) *verify*: read the epoch back,
  and only then make the write's deletes. A writer that sees another epoch at
  (3) deletes its cells (their IDs are at or below its reservation, so below
  every ID of the new owner; the one shared cell, the timers' high-water
  mark, is left alone) and raises Fenced; until then a reader may see them.
  A write that passed (3) happened before the take, so the new owner sees it
  when it seeds its allocator.

Metadata (consumer groups' acks and cursors) is fenced the same way; on
HBase a refused metadata write may still have landed (a stale owner's acks
or retry counts, never acknowledged to anyone), which can only cause a
redelivery: the new owner keeps its own state in memory and writes it over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Fenced


@dataclass(frozen=True)
class Fence:
    """The right to write one partition, from :meth:`Storage.take_partition`.

    Attributes:
        queue, partition_id: The partition.
        epoch: Bumped by every take; writes carry it.
        floor: A 10-byte ID at or above every ID written under earlier epochs
            (``b""``: none known); the taker's IDs must be above it.
    """

    queue: str
    partition_id: int
    epoch: int
    floor: bytes = b""


def fence_key(queue: str, partition_id: int) -> str:
    """The metadata key under which a partition's epoch is kept."""
    return f"fence/{queue}/{partition_id}"


def encode_epoch(epoch: int) -> bytes:
    return epoch.to_bytes(8, "big")


def decode_epoch(data: bytes | None) -> int:
    return int.from_bytes(data, "big") if data else 0


def next_epoch(queue: str, partition_id: int, stored: int, token: int | None) -> int:
    """The epoch a take sets: a bump without a token; the token if it is not below
    the stored epoch (equal: the same owner takes it again).

    Raises:
        Fenced: the token is below the stored epoch (a newer owner took it).
    """
    if token is None:
        return stored + 1
    if token < stored:
        raise Fenced(queue, partition_id, token)
    return token


class _Partition:
    __slots__ = ("epoch", "floor", "lock")

    def __init__(self, epoch: int) -> None:
        self.lock = threading.Lock()
        self.epoch, self.floor = epoch, b""


class LocalFences:
    """Fences of a store that one process writes (embedded, memory).

    Args:
        load, save: Read and durably write a metadata key (the epochs outlive
            the process, so a take after a restart still bumps).
    """

    def __init__(self, load: Callable[[str], bytes | None], save: Callable[[str, bytes], None]) -> None:
        self._load, self._save = load, save
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._lock = threading.Lock()

    def _partition(self, queue: str, partition_id: int) -> _Partition:
        key = (queue, partition_id)
        found = self._partitions.get(key)
        if found is None:
            with self._lock:
                found = self._partitions.get(key)
                if found is None:
                    found = self._partitions[key] = _Partition(decode_epoch(self._load(fence_key(*key))))
        return found

    def take(self, queue: str, partition_id: int, token: int | None = None) -> Fence:
        partition = self._partition(queue, partition_id)
        with partition.lock:
            epoch = next_epoch(queue, partition_id, partition.epoch, token)
            if epoch != partition.epoch:
                self._save(fence_key(queue, partition_id), encode_epoch(epoch))
                partition.epoch = epoch
            return Fence(queue, partition_id, epoch, partition.floor)

    def write(self, fence: Fence | None, high: bytes, write: Callable[..., object], *args: object) -> None:
        """``write(*args)`` only while ``fence`` is the partition's current one; Fenced if it is not.

        ``high``: the highest ID the write holds, which later takes' floors cover.
        """
        if fence is None:
            write(*args)
            return
        partition = self._partition(fence.queue, fence.partition_id)
        with partition.lock:
            if partition.epoch != fence.epoch:
                raise Fenced(fence.queue, fence.partition_id, fence.epoch)
            write(*args)
            if high > partition.floor:
                partition.floor = high
