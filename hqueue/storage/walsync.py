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

A failed ``fdatasync`` raises: the kernel may have dropped what it was to
write, so the store is reopened before its next use (embedded.py) and no
later sync vouches for it.
"""

from __future__ import annotations

import os
import threading
import time

#: A WAL file's name: its number and this suffix (RocksDB's LogFileName).
WAL_SUFFIX = ".log"
#: A directory whose last change is this old (ns) when it is listed: its listing holds until
#: it changes again (WalSync._names). The kernel stamps changes with its coarse clock, a tick
#: (1–10 ms) behind: a tenth of a second leaves room for ten of them.
SETTLED_NS = 100_000_000


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
        #: The last listing: the directory's change stamp then, whether it was settled, the names.
        self._listed: tuple[int, bool, list[str]] = (-1, False, [])
        #: Syncs done, and the directory syncs among them (tests and benches read them).
        self.syncs = self.directory_syncs = 0

    def sync(self) -> None:
        """Make every write RocksDB returned from before this call durable.

        Raises:
            OSError: a WAL file or the directory could not be listed, opened or synced.
        """
        with self._lock:
            try:
                self._sync()
            except OSError:
                self._close()  # (a descriptor that saw a failed sync never reports it again)
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
        """The WAL files, oldest first: listed again unless the directory is unchanged since
        a listing made when its last change was SETTLED_NS old already (a change stamps the
        directory with the kernel's coarse clock, which a later one within the same tick
        leaves as it was: a listing made in that tick is not trusted)."""
        changed = os.stat(self.path).st_mtime_ns
        if changed == self._listed[0] and self._listed[1]:
            return self._listed[2]
        settled = time.time_ns() - changed >= SETTLED_NS
        names = sorted(
            (name for name in os.listdir(self.path) if name.endswith(WAL_SUFFIX)),
            key=lambda name: (len(name), name),  # (numbers, zero-padded to at least 6 digits)
        )
        for name in set(self._files) - set(names):  # deleted by RocksDB: obsolete
            os.close(self._files.pop(name))
        self._listed = (changed, settled, names)
        return names

    def _sync_directory(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.directory_syncs += 1

    def close(self) -> None:
        """Close the descriptors kept (the store closes, or reopens)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._listed = (-1, False, [])
