"""The storage interface every backend implements.

Storage knows about queues (their :class:`~hqueue.config.QueueInfo`) and
cells. A cell is ``(cell_key, value)`` with ``cell_key = rowkey + topic``
(HBase's KeyValue, flattened). Storage knows nothing of IDs, allocators,
partitions' owners or subscribers: that is the engine's and server's job.

The interface is kept narrow on purpose, so that a backend is small and the
contract suite in ``tests/storage/`` can pin down every behaviour.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from ..config import Durability, QueueInfo
from ..ids import wall_clock_ms
from ..keys.index import HEAD_LENGTH, is_index_key
from ..message import MessageID, decode_rowkey
from .fence import Fence, Token

logger = logging.getLogger(__name__)

Cell = tuple[bytes, bytes]
_T = TypeVar("_T")


def released(url: str) -> RuntimeError:
    """The error of a call on a store after its handle released it (``close()``): not
    QueueNotFound, which says a queue was deleted."""
    return RuntimeError(f"closed: the store {url} was released (the handle's close())")


def until_bytes(items: Iterable[_T], max_bytes: int, size: Callable[[_T], int] | None = None) -> list[_T]:
    """``items`` (cells, unless ``size`` measures them) up to the one that brings their bytes
    (a cell's: its key's and value's) to ``max_bytes`` (:meth:`Storage.scan`): the rest are
    never taken from the iterator."""
    out: list[_T] = []
    append = out.append
    for item in items:
        append(item)
        max_bytes -= len(item[0]) + len(item[1]) if size is None else size(item)  # type: ignore[index]
        if max_bytes <= 0:
            break
    return out


class Storage(abc.ABC):
    """A place that keeps queues durably.

    Contract (what ``tests/storage/`` checks for every backend):

    * ``write`` is atomic: all cells of a batch become visible, or none.
    * ``scan`` returns cells in key order, ``start_key <= key < stop_key``,
      only the given topics (all when ``topics`` is None), and exactly
      ``min(limit, remaining)`` cells, so a short answer means the end.
    * Cells older than the queue's TTL are never returned.
    * Queue metadata written by one client is seen by every client of the
      same store.
    * Fences (fence.py, SPEC C10): once ``take_partition`` has returned a
      new epoch, a write (or ``write_meta``) carrying an older fence of that
      partition raises :class:`~hqueue.errors.Fenced`, and none of its cells
      is kept (on HBase they may be seen for the moment between the write and
      its undo; its deletes are never made); the new fence's ``floor`` is at or
      above the ``high`` of every fenced write that succeeded before.
    """

    #: The URL this store was opened with (``local:///path``, ``hbase://…``).
    url: str
    #: Its calls run in this process without a network round trip: a server may make
    #: them from its event loop (rpc/loop.py). False for a store across a network.
    in_process: bool = True

    @abc.abstractmethod
    def create_queue(self, info: QueueInfo) -> None:
        """Create a queue; raises QueueExists if the name is taken."""

    @abc.abstractmethod
    def get_queue(self, name: str) -> QueueInfo:
        """The queue's info; raises QueueNotFound."""

    @abc.abstractmethod
    def list_queues(self) -> list[QueueInfo]:
        """Every queue, sorted by name."""

    @abc.abstractmethod
    def update_queue(self, info: QueueInfo) -> None:
        """Replace the stored info of an existing queue (state, id_floor…)."""

    @abc.abstractmethod
    def delete_queue(self, name: str) -> None:
        """Delete the queue and all its messages."""

    @abc.abstractmethod
    def truncate_queue(self, name: str) -> None:
        """Delete every message, keep the queue, its info and its splits."""

    @abc.abstractmethod
    def write(
        self,
        name: str,
        cells: Sequence[Cell],
        durability: str,
        deletes: Sequence[bytes] = (),
        *,
        fence: Fence | None = None,
        high: bytes = b"",
        ttl: int = 0,
        created: str | None = None,
    ) -> None:
        """Write ``cells`` and delete the cells keyed ``deletes``, atomically, with the given durability.

        ``created``: the ``created`` of the queue definition the write was made by (its
        partition, its topic-index cells): a queue deleted and made again since refuses it
        with QueueNotFound, nothing written (the embedded and memory stores check it, under
        the lock a delete takes; HBase does not: docs/distributed.md's known gaps).

        With ``fence``, only while it is the partition's current one
        (otherwise Fenced, and nothing is kept); ``high`` is the highest
        10-byte ID among the cells, which later fences' floors cover.
        ``ttl`` is the queue's (seconds): a store that expires cells by their
        write time (HBase) stamps a timer's cell with its due time when it is set.

        (HBase applies one ``mutateRows`` row by row: atomic against an hqueue
        server's crash, since the gateway gets the whole call, but not against
        a region server's crash in the middle of it.)
        """

    @abc.abstractmethod
    def take_partition(self, name: str, partition_id: int, token: Token | None = None) -> Fence:
        """Become the partition's only writer and return its new fence.

        With a ``token`` (the coordinator's fencing token, which only grows from
        one owner to the next) the take is refused with Fenced if the stored
        epoch holds a higher token of the same ZooKeeper (a newer owner took
        it); see fence.next_epoch. Every take gives an epoch no take gave
        before. From the moment this returns, writes under any older fence
        raise Fenced.
        """

    @abc.abstractmethod
    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None = None,
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> list[Cell]:
        """Cells with ``start_key <= cell_key < stop_key``, in key order: at most ``limit``,
        and with ``max_bytes``, none after the one that brings their keys and values to
        ``max_bytes`` (what is read of the store stays near it: a receive of big messages)."""

    @abc.abstractmethod
    def last_rowkey(self, name: str, partition_id: int) -> bytes | None:
        """The highest rowkey stored in the partition, or None if empty."""

    def scan_keys(self, name: str, start_key: bytes, stop_key: bytes, limit: int) -> list[bytes]:
        """The keys :meth:`scan` would give (no topic filter), without their values: at most
        ``limit``. A backend that can read keys alone does (a read of many topics through the
        index picks its messages by key first: storage/embedded.py); this one reads the cells."""
        return [key for key, _ in self.scan(name, start_key, stop_key, None, limit)]

    @abc.abstractmethod
    def estimate_count(self, name: str) -> int | None:
        """A cheap estimate of the number of stored messages; None if the backend has none."""

    # -- small metadata (subscriber registrations when there is no ZooKeeper) --

    @abc.abstractmethod
    def get_meta(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None."""

    @abc.abstractmethod
    def put_meta(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` durably."""

    @abc.abstractmethod
    def delete_meta(self, key: str) -> None:
        """Forget ``key`` (no error if absent)."""

    @abc.abstractmethod
    def list_meta(self, prefix: str) -> dict[str, bytes]:
        """Every key starting with ``prefix``, with its value."""

    def write_meta(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        fence: Fence | None = None,
        entered: Callable[[], object] | None = None,
    ) -> None:
        """Several metadata changes in one go (atomic where the backend can batch them).

        ``durability`` is the queue's, for progress kept per message (consumer
        groups' acks); backends without a choice always sync. With ``fence``,
        raise Fenced unless it is the partition's current one (with nothing
        to write, that is all it does). ``entered``: a backend that orders a
        partition's writes itself calls it once this write has its place in
        that order, before it waits for the disk (storage/fence.py); others
        never call it.
        """
        if fence is not None:
            raise NotImplementedError(f"{type(self).__name__} does not fence metadata writes")
        for key, value in puts.items():
            self.put_meta(key, value)
        for key in deletes:
            self.delete_meta(key)

    def reclaim_expired(self, name: str) -> None:  # noqa: B027 - optional hook
        """Free the space of expired cells now (backends may do it anyway)."""

    # -- SYNC_WAL writes that share the fsync of an event loop's turn (rpc/loop.py) ------

    def defer_syncs(self) -> None:  # noqa: B027 - optional hook
        """From now on, a SYNC_WAL write made by the calling thread (a server's event
        loop) returns before its fsync: the thread holds back what it answers until
        :meth:`settle` has made its writes durable, all with one fsync, as Redis does at
        ``appendfsync always``. A store that syncs nothing itself ignores it."""

    def deferred(self) -> bool:
        """Whether the calling thread wrote something :meth:`settle` has not made durable."""
        return False

    def settle(self) -> None:  # noqa: B027 - optional hook
        """Make durable what the calling thread wrote since it last settled.

        Raises:
            StorageError: the fsync failed: none of those writes may be acknowledged.
        """

    def make_durable(self) -> None:  # noqa: B027 - optional hook
        """Before acknowledging what another thread wrote (a put sent again, answered from
        its first write's record): everything written so far is durable once this returns
        or, on a thread that defers its syncs, once it settles."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release files, sockets and locks."""


def _id_floor_key(name: str) -> str:
    return "id-floor/" + name


def read_id_floor(storage: Storage, name: str) -> int:
    """The timestamp every new ID of queue ``name`` must be above (0: none).

    Kept apart from the queue's definition, so housekeeping (TTL reclaim)
    can raise it without racing with admin calls that rewrite the definition.
    """
    value = storage.get_meta(_id_floor_key(name))
    return int(value) if value else 0


def write_id_floor(storage: Storage, name: str, timestamp: int) -> None:
    storage.put_meta(_id_floor_key(name), str(timestamp).encode())


def ttl_cutoff(info: QueueInfo) -> MessageID | None:
    """The oldest ID the queue's TTL still keeps alive now; None without a TTL."""
    if not info.ttl:
        return None
    return MessageID(max(0, wall_clock_ms() - info.ttl * 1000))


def oldest_kept(info: QueueInfo) -> bytes | None:
    """The lowest ID (10 bytes) the queue may still hold: above every one a truncate
    deleted (``id_floor``: later IDs stay above it) and within its TTL; None: any."""
    cutoff = ttl_cutoff(info)
    kept = cutoff.to_bytes() if cutoff is not None else None
    if info.id_floor:
        floor = MessageID(info.id_floor + 1, 0).to_bytes()
        kept = floor if kept is None else max(kept, floor)
    return kept


def ttl_start(key: bytes, cutoff: MessageID) -> bytes:
    """The first key a scan from ``key`` may return under a TTL: the same head
    (a partition's 2 bytes, or a topic-index entry's 12), then ``cutoff``."""
    return key[: HEAD_LENGTH if is_index_key(key) else 2] + cutoff.to_bytes()


def expired(key: bytes, oldest: bytes) -> bool:
    """Whether a stored cell's ID (or a timer's due time) is below ``oldest`` (10 bytes)."""
    at = HEAD_LENGTH if is_index_key(key) else 2
    return key[at : at + 10] < oldest


def keep_id_floor(storage: Storage, info: QueueInfo, cutoff: MessageID | None) -> None:
    """Before TTL reclaim deletes the rows below ``cutoff`` (None: before any row
    may vanish), remember the IDs of any partition's last rows among them: new
    IDs must stay above them even after a restart with a clock that went back."""
    top = 0
    for pid in range(info.partitions):
        last = storage.last_rowkey(info.name, pid)
        if last and (cutoff is None or decode_rowkey(last)[1] < cutoff):
            top = max(top, decode_rowkey(last)[1].timestamp)
    if top > read_id_floor(storage, info.name):
        write_id_floor(storage, info.name, top)


def housekeeping(
    storage: Storage, closed: threading.Event, lock: threading.RLock, interval: Callable[[], float]
) -> threading.Thread:
    """Start a daemon thread that calls ``storage.reclaim_expired`` for every queue
    with a TTL, every ``interval()`` seconds, until ``closed`` is set. ``close()``
    takes ``lock`` too, so it waits for a round under way."""

    def loop() -> None:
        while not closed.wait(interval()):
            try:
                queues = [info.name for info in storage.list_queues() if info.ttl]
            except Exception:
                logger.warning("housekeeping could not list the queues", exc_info=True)
                continue
            for name in queues:
                try:
                    with lock:
                        if not closed.is_set():
                            storage.reclaim_expired(name)
                except Exception:  # one bad queue never stops housekeeping
                    logger.warning("housekeeping of expired messages of %s failed", name, exc_info=True)

    thread = threading.Thread(target=loop, name="hqueue-housekeeping", daemon=True)
    thread.start()
    return thread


def forget_id_floor(storage: Storage, name: str) -> None:
    storage.delete_meta(_id_floor_key(name))
