"""Group commit: concurrent SYNC_WAL writes share one fsync.

rocksdict holds the GIL through ``write()``, fsync included, so RocksDB's
own group commit (writers inside ``DB::Write`` together share a WAL sync)
never gathers two Python threads: 16 threads writing with ``sync=True``
wrote fewer batches a second than one, and every other thread of the
process (a server's event loop too) stood still through each fsync. But
``flush_wal(sync=True)`` lets the GIL go while it waits for the disk. So a
durable write here is two steps:

    writer: write its batch to the WAL, not synced (a few µs, GIL held)
            then wait until an fsync that began after its write has ended:
              none under way? it runs one itself, flush_wal(True), for
              every write that ended before it began (GIL let go)
              one under way? it waits for it, then looks again

Writers that come while an fsync runs write at once and share the next
one; a lone writer never waits for company. The acknowledgement (the
return) comes only once the write is on disk, as with ``sync=True``.

What differs from ``sync=True``: a write is in the memtable, readable,
from its (unsynced) write on, a few hundred µs before it is durable (see
RocksDB's ``SyncWAL``). It is on the OS's page cache by then, so it
survives a crash of the process; only a crash of the machine (power, the
kernel) in that window loses it, and then its writer was never
acknowledged: a reader may have seen a message that is gone after a power
loss, and its ID may be given again; an acknowledged message is never
lost. If an fsync fails, every write that ended before it failed fails
(StorageError), not only those it was run for: after a failed fsync the
kernel may have dropped the dirty pages, so a later fsync's success proves
nothing for them (they may yet be on disk: at least once, never
acknowledged and lost).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import rocksdict

from ..errors import StorageError
from ..keys.index import INDEX_PREFIX

#: A writer's part of a write: it puts its cells into the batch.
Fill = Callable[[rocksdict.WriteBatch], None]


class GroupCommit:
    """Durable writes that share fsyncs.

    Args:
        write: Writes one batch to the WAL without syncing it (``db.write(batch, options)``
            with ``sync=False``).
        sync: Syncs the WAL to disk, letting the GIL go while it waits
            (``db.flush_wal(True)``).
    """

    def __init__(self, write: Callable[[rocksdict.WriteBatch], object], sync: Callable[[], object]) -> None:
        self._write, self._sync = write, sync
        self._cond = threading.Condition()
        self._written = 0  # writes ended, counted in order: the n-th ended n-th
        self._synced = 0  # every write up to this count is on disk
        self._failed = 0  # an fsync covering the writes up to this count failed
        self._failure: BaseException | None = None
        self._syncing = False
        #: Writes made, and fsyncs they shared (``bench/producer.py`` reads them).
        self.writes = self.syncs = 0

    def commit(self, fill: Fill) -> None:
        """Write ``fill``'s cells durably: returns once they are on disk.

        Raises:
            StorageError: the write, or the fsync that was to cover it, failed.
        """
        batch = rocksdict.WriteBatch(raw_mode=True)
        fill(batch)
        self._write(batch)
        with self._cond:
            self._written += 1
            me = self.writes = self._written
            while True:
                if me <= self._failed:
                    raise StorageError(f"the write-ahead log's fsync failed: {self._failure}") from self._failure
                if me <= self._synced:
                    return
                if not self._syncing:
                    break
                self._cond.wait()
            self._syncing, upto = True, self._written
        failure: BaseException | None = None
        try:
            self._sync()
        except BaseException as e:  # an interrupted fsync (Ctrl-C) proves nothing: the next writer syncs
            failure = e
            raise
        finally:
            with self._cond:
                self._syncing = False
                self.syncs += 1
                if failure is None:
                    self._synced = upto
                elif isinstance(failure, Exception):  # and the writes that ended meanwhile: their pages too
                    self._failed, self._failure = self._written, failure
                self._cond.notify_all()


def cells_filler(
    handle: rocksdict.ColumnFamily,
    index: rocksdict.ColumnFamily | None,
    cells: Sequence[tuple[bytes, bytes]],
    deletes: Sequence[bytes],
) -> Fill:
    """A queue write's part of a group commit: its cells into the group's batch."""

    def fill(batch: rocksdict.WriteBatch) -> None:
        put = batch.put
        if index is None:
            for key, value in cells:
                put(key, value, handle)
        else:
            for key, value in cells:
                put(key, value, index if key[:2] == INDEX_PREFIX else handle)
        for key in deletes:
            batch.delete(key, index if index is not None and key[:2] == INDEX_PREFIX else handle)

    return fill


def meta_filler(prefix: bytes, puts: Mapping[str, bytes], deletes: Iterable[str]) -> Fill:
    """A metadata write's part of a group commit (metadata lives in the default family)."""

    def fill(batch: rocksdict.WriteBatch) -> None:
        for key, value in puts.items():
            batch.put(prefix + key.encode(), value)
        for key in deletes:
            batch.delete(prefix + key.encode())

    return fill
