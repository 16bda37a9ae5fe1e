"""Group commit: concurrent SYNC_WAL writes share one RocksDB write and one fsync.

RocksDB merges concurrent writers into one write group (one WAL append, one
fsync), but only writers that are inside ``DB::Write`` together, and
rocksdict holds the GIL for the whole call, fsync included: two threads
never are. Measured on the embedded store, 16 threads writing with
``sync=True`` wrote 5,449 batches/s against one thread's 6,977
(``bench/producer.py --group-commit``). So the queue is here:

    writer: enqueue its fill ---- a leader is writing? ---- yes: wait for it
                                        | no
                                        v
    leader: (writers came together lately: wait GATHER_SECONDS for them)
            take every fill queued, fill one WriteBatch, write it with sync=True,
            wake the writers it carried; then whoever queued meanwhile leads next.

Because the GIL is held through each fsync, writers that arrive during one
cannot queue until it ends, and the first of them would lead a group of one.
So a leader waits GATHER_SECONDS (0.2 ms) for company when the last group
carried more than one writer, or another thread's write ended less than
CROWD_SECONDS ago; a lone writer, however fast, never waits, and a wait
that found nobody (one writer whose calls come through rotating server
threads) makes the next ones rarer, down to 1 chance in MAX_BACKOFF.

A group is one atomic RocksDB write: all of it is stored or none, and every
writer in it gets the same outcome. Each writer holds its partition's fence
lock while it waits (storage/fence.py), so no partition changes hands
between its fence check and its write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import rocksdict

from ..errors import StorageError
from ..keys.index import INDEX_PREFIX

#: How long a leader waits for more writers, when they come together.
GATHER_SECONDS = 0.0002
#: Writers "come together" when another thread's write ended less than this ago.
CROWD_SECONDS = 0.002
#: After waits that found nobody, a leader skips up to this many chances to wait.
MAX_BACKOFF = 64
#: A writer's part of a group: it puts its cells into the group's batch.
Fill = Callable[[rocksdict.WriteBatch], None]


class _Waiting:
    __slots__ = ("fill", "done", "error", "thread")

    def __init__(self, fill: Fill) -> None:
        self.fill, self.done, self.error = fill, False, None  # type: tuple[Fill, bool, BaseException | None]
        self.thread = threading.get_ident()


class GroupCommit:
    """Writes queued fills as groups, one ``write(batch)`` each.

    Args:
        write: Writes one batch durably (``db.write(batch, sync options)``).
    """

    def __init__(self, write: Callable[[rocksdict.WriteBatch], object]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._queue: list[_Waiting] = []
        self._leading = False
        self._crowded = False  # whether writers came together in the last group
        self._last_end, self._last_threads = 0.0, frozenset[int]()  # when the last group ended, and whose it was
        #: Groups written, and writes they carried (``bench/producer.py`` reads them).
        self.groups = self.writes = 0
        #: Times a leader waited GATHER_SECONDS for company.
        self.gathers = 0
        self._backoff = self._skip = 0  # after waits that found nobody: skip this many chances

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
            gathered = self._crowded or self._others_lately(me.thread)
            if gathered:
                self.gathers += 1
                # rocksdict holds the GIL through the fsync, so writers that came meanwhile
                # are still on their way here: let them in before the group closes.
                try:
                    self._cond.wait(GATHER_SECONDS)
                except BaseException:  # interrupted: another leads, and this fill is not written
                    self._leading = False
                    self._abandon(me)
                    self._cond.notify_all()
                    raise
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
            self._crowded = len(group) > 1 or bool(self._queue)
            if gathered and len(group) == 1:  # nobody came: wait less often, up to 1 in 64
                self._backoff = min(2 * self._backoff or 1, MAX_BACKOFF)
                self._skip = self._backoff
            elif len(group) > 1:
                self._backoff = 0
            self._last_end, self._last_threads = time.monotonic(), frozenset(w.thread for w in group)
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

    def _others_lately(self, thread: int) -> bool:
        """Whether another thread's write ended within CROWD_SECONDS: with the GIL held
        through each fsync, writers never meet in the queue, but they do come one
        right after another. A lone writer, however fast, never waits."""
        if time.monotonic() - self._last_end >= CROWD_SECONDS or not self._last_threads - {thread}:
            return False
        if self._skip:  # one writer on rotating connections looks like many: waits found nobody
            self._skip -= 1
            return False
        return True


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
