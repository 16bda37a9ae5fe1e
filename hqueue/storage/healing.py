"""An embedded store that failed (a full disk) reopens once it can: every
operation goes through ``_guard``, and ``_heal`` reopens before the next one
once replaying the WAL surely fits (a mixin of
:class:`~hqueue.storage.embedded.EmbeddedStorage`)."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from typing import Any

from ..config import QueueInfo
from ..errors import QueueExists, QueueNotFound, StorageError

logger = logging.getLogger("hqueue.storage.embedded")

#: Seconds between tries to reopen a store that failed (a full disk).
REOPEN_INTERVAL = 1.0
#: Free space a reopen needs beyond twice the WAL (for the manifest, options, a flush).
REOPEN_MARGIN_BYTES = 4 * 1024 * 1024


class Healing:
    """The failure half of an embedded store."""

    path: str
    _db: Any
    _failed: bool
    _last_reopen: float
    _lock: threading.RLock
    _families: dict[str, Any]
    _infos: dict[str, QueueInfo]

    def _open(self) -> Any:
        raise NotImplementedError

    def _bind(self, info: QueueInfo) -> None:
        raise NotImplementedError

    def _unbind(self, name: str) -> None:
        raise NotImplementedError

    def _finish_truncates(self) -> None:
        raise NotImplementedError

    def _guard(self, call, *args, **kwargs):
        """Run a rocksdict call, turning its bare exceptions into StorageError."""
        try:
            return call(*args, **kwargs)
        except Exception as e:
            if isinstance(e, (QueueNotFound, QueueExists, StorageError)):
                raise  # (a StorageError of the store's own says what failed already)
            self._note_failure(e)
            raise StorageError(f"embedded store {self.path}: {e}") from e

    def _note_failure(self, error: Exception) -> None:
        """Mark the store failed if rocksdict's ``error`` is one only a reopen cures (a full
        disk, an I/O error: a failed fsync among them; a write that named a dropped column
        family, after which RocksDB refused every write: embedded.py's ``_writing`` keeps
        that from happening)."""
        said = str(error)
        if "No space left" in said or "IO error" in said or "column family specified in write batch" in said:
            if not self._failed:
                logger.error("embedded store %s failed: %s; will reopen once it can", self.path, str(error))
            self._failed = True

    def _reopen_space(self) -> tuple[int, int]:
        """(bytes a reopen needs free: twice the WAL plus a margin, bytes free now)."""
        wal = sum(e.stat().st_size for e in os.scandir(self.path) if e.name.endswith(".log") and e.is_file())
        stat = os.statvfs(self.path)
        return 2 * wal + REOPEN_MARGIN_BYTES, stat.f_bavail * stat.f_frsize

    def _heal(self) -> None:
        """Reopen the store if it failed (a full disk); called before each operation."""
        if not self._failed:
            return
        with self._lock:
            if not self._failed:
                return
            if time.monotonic() - self._last_reopen < REOPEN_INTERVAL:
                raise StorageError(f"embedded store {self.path} failed (disk full?); it reopens once space is free")
            self._last_reopen = time.monotonic()
            # A reopen that fails for space leaves RocksDB's lock held until the
            # process exits, so only try once replaying the WAL surely fits.
            needed, free = self._reopen_space()
            if free < needed:
                raise StorageError(
                    f"embedded store {self.path} failed (disk full); it reopens once {needed >> 20} MiB "
                    f"are free ({free >> 20} MiB now)"
                )
            if self._db is not None:
                try:
                    self._db.close()
                except Exception:
                    pass  # it is broken: that is why we are here
            # RocksDB's lock goes with the last reference to the old instance.
            for name in list(self._families):
                self._unbind(name)
            self._db = None
            gc.collect()
            try:
                self._db = self._open()
            except StorageError as e:
                raise StorageError(f"embedded store {self.path} failed and cannot reopen yet: {e}") from e
            self._finish_truncates()
            for info in self._infos.values():
                self._bind(info)
            self._failed = False
            logger.warning("embedded store %s reopened after a failure; operations go on", self.path)
