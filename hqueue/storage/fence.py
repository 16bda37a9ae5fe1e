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
  ZooKeeper a take carries the owner's fencing :class:`Token` (the czxid of
  its lock node, coordination/zookeeper.py), which only grows from owner to
  owner: a take with a lower token is refused, so a stale server never
  takes a partition back. Without a token (one process owns everything) a
  take bumps the epoch's counter. No two takes give the same :class:`Epoch`
  (:func:`next_epoch`).
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

Metadata (consumer groups' acks and cursors) is fenced the same way, and a
new owner reads a group's state only after its take (groups/service.py), so
no former owner's ack lands unseen after the read; on
HBase a refused metadata write may still have landed (a stale owner's acks
or retry counts, never acknowledged to anyone), which can only cause a
redelivery: the new owner keeps its own state in memory and writes it over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import Fenced


class Token(NamedTuple):
    """A coordinator's fencing token for one partition (coordination/zookeeper.py).

    Attributes:
        ensemble: 16 bytes naming the ZooKeeper history it comes from (made once
            per ZooKeeper, so a rebuilt one is told apart from the old).
        number: The czxid of the owner's lock node: only grows from one owner
            of the partition to the next within one ensemble.
    """

    ensemble: bytes
    number: int


class Epoch(NamedTuple):
    """What the store keeps per partition, and every fenced write carries.

    ``(ensemble, token, counter)``: the token of the owner that took it, and a
    counter bumped by every take with the same token or with none (one process
    owning everything has no token), so that no two takes ever give the same
    epoch.
    """

    ensemble: bytes = bytes(16)
    token: int = 0
    counter: int = 0

    def to_bytes(self) -> bytes:
        return self.ensemble + self.token.to_bytes(8, "big") + self.counter.to_bytes(8, "big")

    @classmethod
    def from_bytes(cls, data: bytes | None) -> Epoch:
        if not data:
            return cls()
        return cls(data[:16], int.from_bytes(data[16:24], "big"), int.from_bytes(data[24:32], "big"))

    def __str__(self) -> str:
        return f"{self.ensemble.hex()[:8]}/{self.token}/{self.counter}"


def next_epoch(queue: str, partition_id: int, stored: Epoch, token: Token | None) -> Epoch:
    """The epoch a take sets after ``stored``.

    * no token: the counter goes up (the same owner's token stays);
    * a token of another ensemble (or the first one): it wins, counter 0. The
      stored epoch came from a ZooKeeper that is gone (rebuilt: its czxids
      start again), or from takes without a token;
    * a higher token: it wins, counter 0; the same token: the counter goes up.

    Raises:
        Fenced: a lower token of the same ensemble: a newer owner took it.
    """
    if token is None:
        return stored._replace(counter=stored.counter + 1)
    if token.ensemble != stored.ensemble or token.number > stored.token:
        return Epoch(token.ensemble, token.number, 0)
    if token.number == stored.token:
        return stored._replace(counter=stored.counter + 1)
    raise Fenced(queue, partition_id, f"a newer owner holds epoch {stored}; this server's token is {token.number}")


@dataclass(frozen=True)
class Fence:
    """The right to write one partition, from :meth:`Storage.take_partition`.

    Attributes:
        queue, partition_id: The partition.
        epoch: What the take set; writes carry it.
        floor: A 10-byte ID at or above every ID written under earlier epochs
            (``b""``: none known); the taker's IDs must be above it.
    """

    queue: str
    partition_id: int
    epoch: Epoch
    floor: bytes = b""


def fence_key(queue: str, partition_id: int) -> str:
    """The metadata key under which a partition's epoch is kept."""
    return f"fence/{queue}/{partition_id}"


class _Partition:
    __slots__ = ("epoch", "floor", "lock")

    def __init__(self, epoch: Epoch) -> None:
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
                    found = self._partitions[key] = _Partition(Epoch.from_bytes(self._load(fence_key(*key))))
        return found

    def take(self, queue: str, partition_id: int, token: Token | None = None) -> Fence:
        partition = self._partition(queue, partition_id)
        with partition.lock:
            epoch = next_epoch(queue, partition_id, partition.epoch, token)
            self._save(fence_key(queue, partition_id), epoch.to_bytes())
            partition.epoch = epoch
            return Fence(queue, partition_id, epoch, partition.floor)

    def write(
        self,
        fence: Fence | None,
        high: bytes,
        write: Callable[..., object],
        *args: object,
        entered: Callable[[], object] | None = None,
    ) -> None:
        """``write(*args)`` only while ``fence`` is the partition's current one; Fenced if it is not.

        ``high``: the highest ID the write holds, which later takes' floors cover.
        ``entered``: called once the write holds its place (the partition's lock, its
        fence checked), before it is written: writes to the partition after it come
        after it, so a caller may let others go on (a consumer group lets its lock go
        while its ack waits for its fsync). A write without a fence has no such place:
        ``entered`` is not called.
        """
        if fence is None:
            write(*args)
            return
        partition = self._partition(fence.queue, fence.partition_id)
        with partition.lock:
            if partition.epoch != fence.epoch:
                raise Fenced(fence.queue, fence.partition_id, fence.epoch)
            if entered is not None:
                entered()
            write(*args)
            if high > partition.floor:
                partition.floor = high
