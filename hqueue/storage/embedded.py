# rocksdict's stubs type keys as str | int | float | bytes | bool (raw mode only
# ever gives bytes) and declare WriteOptions properties as methods.
# mypy: disable-error-code="union-attr,index,arg-type,return-value,method-assign,assignment"
"""The embedded store: RocksDB on local disk, through rocksdict.

Layout:

* one column family per queue, named ``q.<queue>``, whose keys are cell keys
  (``rowkey + topic``) and whose values are payloads;
* for a queue with the per-topic index, a second one, ``i.<queue>``, holding
  the index entries (keys under ``0xFFFF``, topic_index.py). Both are written
  in one atomic batch. The index's own family has a small memtable: its keys
  arrive in random order (one per topic), and RocksDB inserts them faster
  while the memtable stays in the CPU's cache (bench/topics.py);
* queue metadata as JSON in the default column family under ``queue/<name>``.

Durability maps onto RocksDB's write options: ``SYNC_WAL`` fsyncs the WAL
before a batch is acknowledged (concurrent writers share one write and one
fsync: the commit queue of storage/commits.py; the fsync is hqueue's own, which lets the GIL
go: storage/walsync.py), ``ASYNC_WAL`` writes the WAL without fsync, ``SKIP_WAL`` disables it.

TTL: rows carry their write time in the rowkey, so expired rows are hidden by
starting every scan at ``now - ttl``; space is reclaimed by a range delete of
the expired prefix of each partition, which compaction then drops.

RocksDB allows one process per directory; a second one gets
:class:`~hqueue.errors.StorageLocked` naming the directory and the remedy
(``local://`` URLs opened through the API share the store instead:
hqueue/sharing.py).

A full disk: RocksDB then refuses every write until it is reopened (rocksdict
has no ``DB::Resume``). Writes fail with :class:`~hqueue.errors.StorageError`
("No space left on device"); nothing acknowledged is lost. Once space is
freed, the next call reopens the store (at most one try per second), which
replays the WAL and so needs free space about the size of the unflushed WAL
(at most ``MAX_TOTAL_WAL_BYTES``): it waits for twice that plus 4 MiB, because
a reopen that fails for space would keep RocksDB's lock until the process
exits. Then it goes on, without a restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice

import rocksdict

from .. import forks
from ..config import Durability, QueueInfo, check_routed
from ..errors import QueueExists, QueueNotFound, StorageError, StorageLocked
from ..keys.index import INDEX_PREFIX
from ..keys.timers import pending_range
from ..message import encode_rowkey, partition_prefix
from .base import Cell, Storage, expired, housekeeping, keep_id_floor, released, ttl_cutoff, ttl_start, until_bytes
from .commits import Fill, GroupCommit, cells_filler, meta_filler
from .fence import Fence, LocalFences, Token
from .healing import Healing
from .lockholder import lock_holder
from .walsync import AVAILABLE, WalSync

logger = logging.getLogger(__name__)

_META_PREFIX = b"queue/"
_KV_PREFIX = b"meta/"
#: A queue being truncated (its families dropped and made again: not atomic): a store
#: opened with the mark finishes the truncate first.
_TRUNCATING_PREFIX = b"truncating/"
_CF_PREFIX = "q."
_INDEX_CF_PREFIX = "i."
#: The index family's memtable (RocksDB's default is 64 MiB).
INDEX_WRITE_BUFFER_BYTES = 8 * 1024 * 1024
#: Index entries moved per batch from a queue's family into its index family (stores from before it).
_MOVE_BATCH = 10_000
#: How often expired messages are range-deleted, in seconds.
RECLAIM_INTERVAL = 300.0
#: The WAL kept before memtables are flushed: what a reopen after a full disk must replay.
MAX_TOTAL_WAL_BYTES = 64 * 1024 * 1024


#: The fork generation (forks.generation) of the process that opened a RocksDB store first:
#: RocksDB's background threads are that process's.
_RAN_ROCKSDB: list[int] = []


def forked_from_rocksdb() -> str | None:
    """Why this process may not open an embedded store: it was forked from one that ran
    RocksDB. A fork copies none of RocksDB's background threads, and their pool is its
    parent's: a store opened in the child never flushes, so its writes stall once its
    memtables are full, and its close waits for ever (an attacker's pass). None if it may."""
    if not _RAN_ROCKSDB or _RAN_ROCKSDB[0] == forks.generation():
        return None
    return (
        "this process was forked from one that ran RocksDB, whose background "
        "threads a fork does not copy: a store opened here would stall at its first flush. Start "
        "processes that open stores with multiprocessing's 'spawn' or 'forkserver' method, or fork "
        "them before any store is opened; a store another process serves is used through it"
    )


def _options() -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_max_background_jobs(2)
    options.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES)
    return options


def _family_options(family: str) -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    if family.startswith(_INDEX_CF_PREFIX):
        options.set_write_buffer_size(INDEX_WRITE_BUFFER_BYTES)
    return options


def _write_options(durability: str) -> rocksdict.WriteOptions:
    options = rocksdict.WriteOptions()
    options.sync = durability == Durability.SYNC_WAL
    options.disable_wal = durability == Durability.SKIP_WAL
    return options


class _Deferral(threading.local):
    on = False  # this thread's SYNC_WAL writes wait for settle() (a server's event loop)
    pending = False  # and some do now
    opened = 0  # WalSync.opened when the first of them was made


def _nothing(batch: rocksdict.WriteBatch) -> None:
    """An empty write: with sync=True, RocksDB syncs the WAL for it (and all before it)."""


def _holds_any(family: rocksdict.Rdict, start: bytes, stop: bytes) -> bool:
    """Whether ``family`` has a key in ``[start, stop)``."""
    for key in family.keys(from_key=start):
        return bytes(key) < stop  # (raw mode: keys are bytes)
    return False


def _unlocked_spelling(path: str) -> str:
    """``path`` as this process gives it to RocksDB. RocksDB keeps the LOCK files its process
    holds in a process-wide set, by name, and refuses a name in it ("lock hold by current
    process"); a forked child inherits the set, so a store its parent (or grandparent) had
    open could never be opened there, even once that parent died and its lock with it (a
    ``multiprocessing`` worker never took over the store it used). The lock itself (fcntl)
    is the process's own and is not inherited, so a child names the directory its own way
    (``/.`` once per fork) and is refused only while another process holds the store."""
    return path + "/." * forks.generation()


class EmbeddedStorage(Healing, Storage):
    """RocksDB-backed storage for one process.

    Args:
        path: The data directory; created if missing.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.url = "local://" + self.path
        self._lock = threading.RLock()
        self._wal = WalSync(self.path)
        self._db = self._open()
        self._write_options = {d: _write_options(d) for d in Durability.ALL}
        #: SYNC_WAL writes go through it: concurrent ones share one write and one fsync.
        self._commit = GroupCommit(self._write_synced)
        #: Per thread: whether its SYNC_WAL writes wait for settle(), and whether some do now.
        self._deferral = _Deferral()
        self._infos: dict[str, QueueInfo] = {}
        self._families: dict[str, rocksdict.Rdict] = {}
        self._handles: dict[str, rocksdict.ColumnFamily] = {}
        #: The topic-index families, of the queues that have the index.
        self._index_families: dict[str, rocksdict.Rdict] = {}
        self._index_handles: dict[str, rocksdict.ColumnFamily] = {}
        #: Writes under way with a queue's family handles, by queue: a family is dropped (a
        #: delete, a truncate) only once none is. A write that went out with a dropped
        #: family failed its whole group commit, other queues' writes with it, and RocksDB
        #: refused every write after it until the store was opened again (an attacker's pass).
        self._writing: dict[str, int] = {}
        #: Queues whose families are being dropped (a delete, a truncate): their new writes wait
        #: (a truncate's come back), and a write that ends wakes the drop waiting for it.
        self._held: set[str] = set()
        # (Not self._lock: no write waits on an admin's fsync. Entered by its plain lock on the
        # hot path: a Condition's own enter and exit are Python calls, twice a write.)
        self._writes_lock = threading.Lock()
        self._written = threading.Condition(self._writes_lock)
        #: Whether RocksDB failed in a way only a reopen cures (a full disk).
        self._failed = False
        for key, value in self._db.items(from_key=_META_PREFIX):
            if not key.startswith(_META_PREFIX):
                break
            info = QueueInfo.from_json(value)
            self._infos[info.name] = info
        self._finish_truncates()
        for info in self._infos.values():
            self._bind(info)
        self._last_reopen = 0.0
        self._closed = threading.Event()
        self._fences = LocalFences(self.get_meta, self.put_meta)
        housekeeping(self, self._closed, self._lock, lambda: RECLAIM_INTERVAL)
        logger.debug("opened embedded store %s with %d queues", self.path, len(self._infos))

    def _write_synced(self, batch: rocksdict.WriteBatch) -> None:
        """Write ``batch`` and make it durable, the GIL let go for the fsync (walsync.py), but
        on a thread that defers its syncs (a server's event loop, which every connection
        waits for): that one keeps the GIL through its fsync, as rocksdict does, because a
        thread that lets it go waits for a busy one to give it back, up to the interpreter's
        switch interval (5 ms)."""
        if self._failed:  # (writers queued behind a failed sync: nothing vouches for them now)
            raise StorageError(f"embedded store {self.path} failed; it reopens before its next use")
        if self._deferral.on or not AVAILABLE:
            try:
                self._db.write(batch, self._write_options[Durability.SYNC_WAL])
            except Exception as e:  # an fsync that failed: marked before the next group leads
                self._note_failure(e)
                raise
            return
        opened = self._wal.opened
        if not batch.is_empty():
            self._db.write(batch, self._write_options[Durability.ASYNC_WAL])
        try:
            self._wal.sync(opened)
        except OSError as e:  # what the kernel was to write may be gone: only a reopen tells
            self._failed = True
            raise StorageError(f"embedded store {self.path}: syncing its WAL failed: {e}") from e
        if self._failed:  # another thread's sync (the loop's) failed meanwhile: not vouched for
            raise StorageError(f"embedded store {self.path} failed while this write was synced")

    def _write_durably(self, fill: Fill) -> None:
        """A SYNC_WAL write: through the group commit, or, on a thread that defers its syncs,
        written now and its fsync at settle()."""
        if not self._deferral.on:
            self._commit.commit(fill)
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        fill(batch)
        self._pend()  # (before the write: a reopen after it must be seen at settle())
        self._db.write(batch, self._write_options[Durability.ASYNC_WAL])

    def _pend(self) -> None:
        """This thread's writes wait for its settle(), which must fail if the store failed
        and was opened again since the first of them (a review: what went to the WAL whose
        fsync failed, a sync of the reopened store's does not vouch for)."""
        if not self._deferral.pending:
            self._deferral.pending, self._deferral.opened = True, self._wal.opened

    def defer_syncs(self) -> None:
        self._deferral.on = True

    def deferred(self) -> bool:
        return self._deferral.pending

    def settle(self) -> None:
        if self._deferral.pending:
            self._deferral.pending = False  # a failed fsync fails them all: never retried as if written
            self._sync()
            if self._wal.opened != self._deferral.opened:
                raise StorageError(
                    f"embedded store {self.path} failed and was opened again since these writes: "
                    "they are not acknowledged"
                )

    def make_durable(self) -> None:
        if self._deferral.on:
            self._pend()
        else:
            self._sync()

    def _sync(self) -> None:
        """Sync the WAL (an empty synced write, shared with any group under way). If that
        fails, the store is reopened before its next use: after a failed fsync the kernel
        may have dropped what was written, so only what a reopen reads back from the WAL
        counts (no later fsync may vouch for a write the failed one was for)."""
        try:
            self._guard(self._commit.commit, _nothing)
        except StorageError:
            self._failed = True
            raise

    def _open(self) -> rocksdict.Rdict:
        forked = forked_from_rocksdb()
        if forked is not None:
            raise StorageError(f"cannot open the embedded store {self.path}: {forked}")
        try:
            # A new store is its owner's only (its files hold every message): sharing it with a
            # group is a choice made on the directory (docs/cli.md).
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as e:  # a file there, a tree where none may be made, no permission
            why = "it is not a directory" if os.path.exists(self.path) else (e.strerror or str(e))
            raise StorageError(f"cannot open the embedded store {self.path}: {why}") from e
        options = _options()
        try:
            families = {}
            if os.path.exists(os.path.join(self.path, "CURRENT")):
                names = rocksdict.Rdict.list_cf(self.path, options)
                families = {n: _family_options(n) for n in names if n != "default"}
            db = rocksdict.Rdict(_unlocked_spelling(self.path), options, column_families=families)
        except Exception as e:  # rocksdict raises plain Exception
            if "lock" in str(e).lower():
                raise StorageLocked(self.path, lock_holder(self.path)) from e
            raise StorageError(f"cannot open the embedded store {self.path}: {e}") from e
        if not _RAN_ROCKSDB:
            _RAN_ROCKSDB.append(forks.generation())
        self._wal.reset()  # (opened again after a failed sync: what it read back is what counts)
        return db

    def _bind(self, info: QueueInfo) -> None:
        name, family = info.name, _CF_PREFIX + info.name
        self._families[name] = self._db.get_column_family(family)
        self._handles[name] = self._db.get_column_family_handle(family)
        if info.topic_index:
            index = _INDEX_CF_PREFIX + name
            if index not in rocksdict.Rdict.list_cf(self.path, _options()):
                self._db.create_column_family(index, _family_options(index))
            self._index_families[name] = self._db.get_column_family(index)
            self._index_handles[name] = self._db.get_column_family_handle(index)
            self._move_index_entries(name)

    def _move_index_entries(self, name: str) -> None:
        """Move index entries that an older hqueue kept in the queue's own family into its index family."""
        family, moved, start = self._families[name], 0, INDEX_PREFIX
        while True:
            entries = list(islice(family.items(from_key=start), _MOVE_BATCH))
            if not entries:
                break
            last: bytes = entries[-1][0]
            start = last + b"\x00"  # past the moved ones, not through their tombstones
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in entries:
                batch.put(key, value, self._index_handles[name])
                batch.delete(key, self._handles[name])
            self._db.write(batch, self._write_options[Durability.SYNC_WAL])
            moved += len(entries)
        if moved:
            logger.info("moved %d topic-index entries of %s into their own column family", moved, name)

    def _unbind(self, name: str) -> None:
        for bound in (self._families, self._handles, self._index_families, self._index_handles):
            bound.pop(name, None)

    def _family(self, name: str) -> rocksdict.Rdict:
        try:
            return self._families[name]
        except KeyError:
            raise self._missing(name) from None

    def _missing(self, name: str) -> Exception:
        """Why ``name``'s families are not bound: the store was closed (a scan of a handle
        closed meanwhile read on: not QueueNotFound, which says the queue was deleted), or
        there is no such queue."""
        return released(self.url) if self._closed.is_set() else QueueNotFound(name)

    # -- queues ---------------------------------------------------------------

    def create_queue(self, info: QueueInfo) -> None:
        self._heal()
        with self._lock:
            if info.name in self._infos:
                raise QueueExists(info.name)
            existing = rocksdict.Rdict.list_cf(self.path, _options())
            for family in (_CF_PREFIX + info.name, _INDEX_CF_PREFIX + info.name):
                if family in existing:
                    # Left behind by a crash between creating the family and its metadata.
                    self._db.drop_column_family(family)
            self._db.create_column_family(_CF_PREFIX + info.name, _family_options(_CF_PREFIX + info.name))
            self._bind(info)
            self._put_info(info)

    def _put_info(self, info: QueueInfo) -> None:
        self._heal()
        self._guard(
            self._db.put, _META_PREFIX + info.name.encode(), info.to_json(), self._write_options[Durability.SYNC_WAL]
        )
        self._infos[info.name] = info

    def get_queue(self, name: str) -> QueueInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise QueueNotFound(name) from None

    def list_queues(self) -> list[QueueInfo]:
        return [info for _, info in sorted(self._infos.items())]  # (one read: a delete may run)

    def update_queue(self, info: QueueInfo) -> None:
        with self._lock:
            self.get_queue(info.name)
            self._put_info(info)

    def delete_queue(self, name: str) -> None:
        self._heal()
        with self._lock:
            self.get_queue(name)
            self._guard(self._db.delete, _META_PREFIX + name.encode(), self._write_options[Durability.SYNC_WAL])
            del self._infos[name]
            indexed = name in self._index_families
            with self._writes_held(name):  # (those that waited find it gone: QueueNotFound)
                self._unbind(name)
                self._guard(self._db.drop_column_family, _CF_PREFIX + name)
                if indexed:
                    self._guard(self._db.drop_column_family, _INDEX_CF_PREFIX + name)

    def truncate_queue(self, name: str) -> None:
        self._heal()
        with self._lock:
            info = self.get_queue(name)
            # Dropping and re-creating the families frees the space at once, where a range
            # delete would wait for compaction. Not atomic: a process killed between the steps
            # left a queue without its family (the store could not be opened again, any queue
            # of it) or an index whose entries name messages that are gone (an attacker's
            # pass). The mark makes the next open finish the truncate.
            mark = _TRUNCATING_PREFIX + name.encode()
            self._guard(self._db.put, mark, b"", self._write_options[Durability.SYNC_WAL])
            with self._writes_held(name):
                self._remake_families(name)  # (the handles stay bound meanwhile: a read under way
                self._bind(info)  # sees the dropped families, not QueueNotFound; _bind replaces them)
            self._infos[name] = info
            self._guard(self._db.delete, mark, self._write_options[Durability.SYNC_WAL])

    @contextlib.contextmanager
    def _writes_held(self, name: str) -> Iterator[None]:
        """The block runs once the writes under way with ``name``'s families are done, and
        holds its new ones until it ends (other queues' writes go on meanwhile): a family is
        dropped with no write using it (``_writing``)."""
        with self._writes_lock:
            self._held.add(name)
            self._written.wait_for(lambda: name not in self._writing)
        try:
            yield
        finally:
            with self._writes_lock:
                self._held.discard(name)
                self._written.notify_all()

    def _remake_families(self, name: str) -> None:
        """Drop the queue's families (data and topic index) that exist, and make its data family again, empty
        (:meth:`_bind` makes the index family of a queue that has the index)."""
        existing = rocksdict.Rdict.list_cf(self.path, _options())
        for family in (_CF_PREFIX + name, _INDEX_CF_PREFIX + name):
            if family in existing:
                self._guard(self._db.drop_column_family, family)
        family = _CF_PREFIX + name
        self._guard(self._db.create_column_family, family, _family_options(family))

    def _finish_truncates(self) -> None:
        """At open: finish the truncates a process was killed in (their marks), and make the
        family of a queue that has none (a crash in a truncate before the marks existed)."""
        marks = [key for key, _ in self._db.items(from_key=_TRUNCATING_PREFIX) if key.startswith(_TRUNCATING_PREFIX)]
        existing = set(rocksdict.Rdict.list_cf(self.path, _options()))
        for name in self._infos:
            mark = _TRUNCATING_PREFIX + name.encode()
            if mark in marks or _CF_PREFIX + name not in existing:
                logger.warning(
                    "embedded store %s: finishing the truncate of %s that a crash cut short", self.path, name
                )
                self._remake_families(name)
        for mark in marks:
            self._db.delete(mark, self._write_options[Durability.SYNC_WAL])

    # -- cells ----------------------------------------------------------------

    def take_partition(self, name: str, partition_id: int, token: Token | None = None) -> Fence:
        self._family(name)
        return self._fences.take(name, partition_id, token)

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
        self._heal()
        with self._writes_lock:  # (its families are not dropped until the write is done: _writing)
            while name in self._held:  # (a truncate under way: its families come back)
                self._written.wait()
            handle, info = self._handles.get(name), self._infos.get(name)
            if handle is None or info is None:  # (info None: made again, its definition not stored yet)
                raise self._missing(name)
            check_routed(info, created)
            index = self._index_handles.get(name)
            writing = self._writing
            writing[name] = writing.get(name, 0) + 1
        try:
            if durability == Durability.SYNC_WAL:  # one fsync with the other writers under way
                fill = cells_filler(handle, index, cells, deletes)
                self._fences.write(fence, high, self._guard, self._write_durably, fill)
            else:
                self._write_now(handle, index, cells, durability, deletes, fence, high)
        finally:
            with self._writes_lock:
                left = self._writing[name] - 1
                if left:
                    self._writing[name] = left
                else:
                    del self._writing[name]
                    if name in self._held:  # (a drop waits for it)
                        self._written.notify_all()

    def _write_now(
        self,
        handle: rocksdict.ColumnFamily,
        index: rocksdict.ColumnFamily | None,
        cells: Sequence[Cell],
        durability: str,
        deletes: Sequence[bytes],
        fence: Fence | None,
        high: bytes,
    ) -> None:
        """An ASYNC_WAL or SKIP_WAL write: one batch, now."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.set_default_column_family(handle)
        put = batch.put
        if index is None:
            for key, value in cells:
                put(key, value)
        else:  # index entries (topic_index.py) go to the index family, in the same batch
            for key, value in cells:
                if key[:2] == INDEX_PREFIX:
                    put(key, value, index)
                else:
                    put(key, value)
        for key in deletes:
            batch.delete(key, index if index is not None and key[:2] == INDEX_PREFIX else handle)
        self._fences.write(fence, high, self._guard, self._db.write, batch, self._write_options[durability])

    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None = None,
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> list[Cell]:
        reading = self._reading(name, start_key, stop_key)
        if reading is None:
            return []
        family, start_key, options = reading
        items = self._guard(family.items, from_key=start_key, read_opt=options)
        if topics is not None:
            items = (c for c in items if c[0][12:] in topics)
        if max_bytes is None:
            return list(islice(items, limit))
        return until_bytes(islice(items, limit), max_bytes)

    def scan_keys(self, name: str, start_key: bytes, stop_key: bytes, limit: int) -> list[bytes]:
        reading = self._reading(name, start_key, stop_key)
        if reading is None:
            return []
        family, start_key, options = reading
        return list(islice(self._guard(family.keys, from_key=start_key, read_opt=options), limit))

    def _reading(
        self, name: str, start_key: bytes, stop_key: bytes
    ) -> tuple[rocksdict.Rdict, bytes, rocksdict.ReadOptions] | None:
        """Where a read of ``start_key <= key < stop_key`` goes: the family (the index's for
        index keys), the first key the TTL keeps, and the read's bound; None: nothing there."""
        self._heal()
        family = self._family(name)
        if start_key[:2] == INDEX_PREFIX:
            family = self._index_families.get(name, family)
        start_key = max(start_key, self._ttl_floor(name, start_key))
        if start_key >= stop_key:
            return None
        options = rocksdict.ReadOptions()
        options.set_iterate_upper_bound(stop_key)
        return family, start_key, options

    def _ttl_floor(self, name: str, key: bytes) -> bytes:
        cutoff = ttl_cutoff(self._infos[name]) if name in self._infos else None
        return ttl_start(key, cutoff) if cutoff is not None else b""

    def last_rowkey(self, name: str, partition_id: int) -> bytes | None:
        self._heal()
        family = self._family(name)
        prefix = partition_prefix(partition_id)
        # The next partition's prefix is above every key of this one (pid < 32767).
        for key, _ in family.items(backwards=True, from_key=partition_prefix(partition_id + 1)):
            # The iterator's lower bound is not honoured by seek-for-prev, so check.
            return key[:12] if key.startswith(prefix) else None
        return None

    def estimate_count(self, name: str) -> int:
        return int(self._family(name).property_int_value("rocksdb.estimate-num-keys") or 0)

    def get_meta(self, key: str) -> bytes | None:
        self._heal()
        return self._guard(self._db.get, _KV_PREFIX + key.encode())

    def put_meta(self, key: str, value: bytes) -> None:
        self._heal()
        self._guard(self._db.put, _KV_PREFIX + key.encode(), value, self._write_options[Durability.SYNC_WAL])

    def delete_meta(self, key: str) -> None:
        self._heal()
        self._guard(self._db.delete, _KV_PREFIX + key.encode(), self._write_options[Durability.SYNC_WAL])

    def write_meta(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        fence: Fence | None = None,
        entered: Callable[[], object] | None = None,
    ) -> None:
        self._heal()
        if not puts and not deletes:
            if fence is not None:  # nothing to write: only the check
                self._fences.write(fence, b"", lambda: None)
            return
        if durability == Durability.SYNC_WAL:  # one fsync with the other writers under way
            fill = meta_filler(_KV_PREFIX, puts, deletes)
            self._fences.write(fence, b"", self._guard, self._write_durably, fill, entered=entered)
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        meta_filler(_KV_PREFIX, puts, deletes)(batch)
        self._fences.write(
            fence, b"", self._guard, self._db.write, batch, self._write_options[durability], entered=entered
        )

    def list_meta(self, prefix: str) -> dict[str, bytes]:
        self._heal()
        start = _KV_PREFIX + prefix.encode()
        found = {}
        for key, value in self._db.items(from_key=start):
            if not key.startswith(start):
                break
            found[key[len(_KV_PREFIX) :].decode()] = value
        return found

    def reclaim_expired(self, name: str) -> None:
        self._heal()
        info = self.get_queue(name)
        cutoff = ttl_cutoff(info)
        if cutoff is None:
            return
        family = self._family(name)
        keep_id_floor(self, info, cutoff)
        # Only the ranges that hold something expired are deleted and compacted: compacting the
        # whole queue each pass rewrote all of it (345 MB every 5 minutes for a 330 MB queue
        # with nothing expired).
        messages_expired = False
        for pid in range(info.partitions):
            for start, stop in (
                (partition_prefix(pid), encode_rowkey(pid, cutoff)),
                pending_range(pid, cutoff.timestamp),
            ):
                # (timers overdue by more than the TTL expire as their messages would have: timers.py)
                if _holds_any(family, start, stop):
                    messages_expired |= start == partition_prefix(pid)
                    family.delete_range(start, stop)
                    family.compact_range(start, stop)
        index = self._index_families.get(name)
        # Index entries sort by topic, not time: walk them (topic_index.py), but only when some
        # message expired (an entry and its message are written and removed together): the walk
        # read every entry each pass, 0.41 s a million, with nothing expired (an attacker's pass).
        if index is not None and messages_expired:
            oldest, deleted = cutoff.to_bytes(), False
            for key in index.keys():  # (deleted as they are met: the walk reads a snapshot)
                if expired(key, oldest):
                    index.delete(key)
                    deleted = True
            if deleted:
                index.compact_range(None, None)
        logger.debug("reclaimed expired messages of %s before %s", name, cutoff)

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            for name in list(self._families):
                self._unbind(name)
            try:
                self._db.close()
            except Exception as e:  # a store that failed (a full disk) still closes
                logger.warning("closing embedded store %s: %s", self.path, e)
            self._wal.close()
            logger.debug("closed embedded store %s", self.path)
