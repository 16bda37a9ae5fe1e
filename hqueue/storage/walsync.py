"""The embedded store's WAL made durable without holding the GIL.

rocksdict holds the GIL for the whole of ``write``, the fsync of a ``sync=True``
write included (0.15 ms on this machine's disk, milliseconds on many): measured,
a thread ticking every 50 µs beside one writing SYNC_WAL batches ticked every
5.3 ms, the interpreter's switch interval, against 0.12 ms alone. In a server,
every other thread (the event loop's readers, workers, timers, pushes) stopped
for each fsync, and writers could not even queue for the next group commit.

So SYNC_WAL writes are written like ASYNC_WAL ones (RocksDB's ``write`` hands
the WAL record to the kernel before it returns: ``manual_wal_flush`` is off)
and :meth:`WalSync.sync` then ``fdatasync``\\ s the WAL files itself, with
``os.fdatasync``, which lets the GIL go. What RocksDB's own sync does, this
does too:

* every live WAL file (``*.log`` in the store's directory, the WAL directory:
  none is set apart) is synced, older ones first: a write may have gone to the
  one RocksDB switched from meanwhile, and syncing a file with nothing
  unwritten costs a system call;
* the directory is synced once a WAL file it has not seen appears, so that
  the new file's name survives a power loss with its contents;
* a file that went between the listing and its opening was obsolete (RocksDB
  deletes a WAL only once what it held is flushed to synced tables).

The directory's listing is kept while its change stamp (mtime) stands
still, but only once that stamp is older than any filesystem's timestamp
granularity (2.1 s) and the wall clock was not stepped: a listing kept for
0.1 s missed a new WAL on a filesystem that stamps to the second (a
review), and listing at every sync halved 16 writer threads' rate.

A failed ``fdatasync`` raises, and so does every sync after it until the
store is reopened (:meth:`WalSync.reset`): the kernel may have dropped what
it was to write, and a descriptor opened after that is never told, so only
what the reopen reads back from the WAL counts (embedded.py).

Where ``os.fdatasync`` does not exist (not Linux), the store keeps
rocksdict's synced write (:data:`AVAILABLE`).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import NamedTuple

#: A WAL file's name: its number and this suffix (RocksDB's LogFileName).
WAL_SUFFIX = ".log"
#: A listing made once the directory's last change was this old (ns) holds until it changes
#: again: more than the coarsest timestamp granularity of a filesystem (FAT's 2 s; ext4 with
#: small inodes, HFS+: 1 s; others: the kernel's clock tick).
SETTLED_NS = 2_100_000_000
#: The wall clock moved this far (ns) from the monotonic one since a listing: it was stepped.
CLOCK_STEP_NS = 100_000_000
#: Whether this platform has ``os.fdatasync`` (RocksDB's own WAL sync on Linux).
AVAILABLE = hasattr(os, "fdatasync")


class _Listing(NamedTuple):
    stamp: int  # the directory's change stamp (mtime, ns)
    settled: bool  # the stamp was SETTLED_NS old when listed
    wall: int
    monotonic: int
    names: list[str]


class WalSync:
    """Syncs the WAL files of the RocksDB store in ``path``, the GIL let go meanwhile.

    Args:
        path: The store's directory (where RocksDB keeps its WAL).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        #: Open descriptors of the WAL files seen, by name (read-only: enough for fdatasync).
        self._files: dict[str, int] = {}
        #: A sync failed (its errno and what it said): none vouches for anything until the store
        #: is reopened (reset()). Not the exception: its frames hold the store's column families,
        #: whose last reference must go for the reopen to take RocksDB's lock again.
        self._broken: tuple[int, str] | None = None
        self._listed: _Listing | None = None
        #: Times the store was opened (reset()): a write made before a reopen is not synced after.
        self.opened = 0
        self._closed = False
        #: Syncs done, and the directory syncs among them (tests and benches read them).
        self.syncs = self.directory_syncs = 0

    def sync(self, opened: int | None = None) -> None:
        """Make every write RocksDB returned from before this call durable.

        Args:
            opened: :attr:`opened` when the writes were made: if the store was opened again
                since, they went to the store that failed, and this raises.

        Raises:
            OSError: a WAL file or the directory could not be listed, opened or synced.
        """
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the store is closed")
            if opened is not None and opened != self.opened:
                raise OSError(errno.EIO, "the store failed and was opened again since the write")
            if self._broken is not None:  # a descriptor opened after a failure never reports it
                raise OSError(self._broken[0], f"a sync of the WAL failed before: {self._broken[1]}")
            try:
                self._sync()
            except OSError as e:
                self._broken = (e.errno or errno.EIO, str(e))
                raise
            self.syncs += 1

    def _sync(self) -> None:
        new = False
        for name in self._names():
            fd = self._files.get(name)
            if fd is None:
                try:
                    fd = os.open(os.path.join(self.path, name), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # obsolete, and deleted since the listing
                self._files[name], new = fd, True
            os.fdatasync(fd)
        if new:
            self._sync_directory()

    def _names(self) -> list[str]:
        """The WAL files, oldest first. Listed again unless the directory's change stamp is
        the one of the last listing, that listing was made once the stamp was SETTLED_NS old
        (a filesystem stamps to its granularity, as coarse as 2 s: a change later within it
        leaves the stamp as it was), and the wall clock has not been stepped since (a change
        after a step back could bear the old stamp). Descriptors of files gone (obsolete,
        deleted by RocksDB) are closed."""
        stamp = os.stat(self.path).st_mtime_ns
        wall, now = time.time_ns(), time.monotonic_ns()
        listed = self._listed
        if (
            listed is not None
            and stamp == listed.stamp
            and listed.settled
            and abs((wall - listed.wall) - (now - listed.monotonic)) < CLOCK_STEP_NS
        ):
            return listed.names
        names = sorted(
            (name for name in os.listdir(self.path) if name.endswith(WAL_SUFFIX)),
            key=lambda name: (len(name), name),  # (numbers, zero-padded to at least 6 digits)
        )
        if not names:  # RocksDB always has a live WAL here: the store is not where it was
            raise OSError(errno.ENOENT, f"no WAL file in {self.path}")
        for name in set(self._files) - set(names):
            os.close(self._files.pop(name))
        self._listed = _Listing(stamp, wall - stamp >= SETTLED_NS, wall, now, names)
        return names

    def _sync_directory(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.directory_syncs += 1

    def close(self) -> None:
        """Close the descriptors kept, for good (the store closes): a sync after fails."""
        with self._lock:
            self._close()
            self._closed = True

    def reset(self) -> None:
        """The store is opened again: what failed before is what the reopen read back from
        the WAL, and syncs go on (with descriptors of their own)."""
        with self._lock:
            self._close()
            self._broken = None
            self.opened += 1

    def _close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._listed = None
