"""Group commit: concurrent SYNC_WAL writes share one RocksDB write and one fsync.

    writer: enqueue its fill ---- a leader is writing? ---- yes: wait for it
                                        | no
                                        v
    leader: take every fill queued, fill one WriteBatch, write it and sync the WAL,
            wake the writers it carried; then whoever queued meanwhile leads next.

The fsync lets the GIL go (storage/walsync.py), so the writers that come during
one queue for the next group: a lone writer goes at once, and under load each
fsync carries what came while the last one ran. (While rocksdict did the fsync,
with the GIL held, writers could not queue meanwhile, and a leader waited 0.2 ms
for company; measured with ``bench/producer.py --group-commit``, 16 threads wrote
as many batches a second without that wait, and a lone writer never pays it.)

A group is one atomic RocksDB write: all of it is stored or none, and every
writer in it gets the same outcome. Each writer holds its partition's fence
lock while it waits (storage/fence.py), so no partition changes hands
between its fence check and its write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import rocksdict

from ..errors import StorageError
from ..keys.index import INDEX_PREFIX

#: A writer's part of a group: it puts its cells into the group's batch.
Fill = Callable[[rocksdict.WriteBatch], None]


class _Waiting:
    __slots__ = ("fill", "done", "error")

    def __init__(self, fill: Fill) -> None:
        self.fill, self.done, self.error = fill, False, None  # type: tuple[Fill, bool, BaseException | None]


class GroupCommit:
    """Writes queued fills as groups, one ``write(batch)`` each.

    Args:
        write: Writes one batch durably (its cells, then the WAL synced).
    """

    def __init__(self, write: Callable[[rocksdict.WriteBatch], object]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._queue: list[_Waiting] = []
        self._leading = False
        #: Groups written, and writes they carried (``bench/producer.py`` reads them).
        self.groups = self.writes = 0

    def commit(self, fill: Fill) -> None:
        """Write ``fill``'s cells durably, with whatever other writers queued meanwhile.

        Raises:
            StorageError: the group's write failed; nothing of it was stored.
        """
        me = _Waiting(fill)
        with self._cond:
            self._queue.append(me)
            try:
                while self._leading and not me.done:
                    self._cond.wait()
            except BaseException:  # interrupted (Ctrl-C in a process holding the store)
                self._abandon(me)
                raise
            if me.done:
                if me.error is not None:  # another thread's write failed: an error of its own here
                    raise StorageError(str(me.error)) from me.error
                return
            self._leading = True
            group, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for waiting in group:
                waiting.fill(batch)
            self._write(batch)
        except BaseException as e:
            error = e
        with self._cond:
            for waiting in group:
                waiting.done, waiting.error = True, error
            self.groups, self.writes = self.groups + 1, self.writes + len(group)
            self._leading = False
            self._cond.notify_all()
        if error is not None:
            raise error

    def _abandon(self, me: _Waiting) -> None:
        """A writer interrupted while it waited (under the lock): its fill leaves the queue, so
        that no leader writes it later, when its caller holds no lock of the partition any
        more (a fence could have moved). A fill a leader took already is being written: wait
        for it, so that the caller's locks are held until it lands."""
        if me in self._queue:
            self._queue.remove(me)
            return
        while not me.done:
            self._cond.wait()


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
