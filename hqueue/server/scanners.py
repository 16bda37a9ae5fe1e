"""Server-side scanners for remote clients, with an idle timeout.

``messageScannerOpen`` registers a :class:`~hqueue.scanner.PartitionScanner`
under a random i32 ID, bound to the connection that opened it (another
connection cannot guess or use it); ``messageScannerGetList`` reads from it,
at most :data:`~hqueue.rpc.wire.MAX_SCAN_BATCH` messages and about
:data:`~hqueue.rpc.wire.SCAN_REPLY_BYTES` per reply; ``close``, the end of
its connection, or ``idle_timeout`` seconds without a call frees it, so a
client that vanishes leaks nothing.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from ..errors import InvalidArgument
from ..message import Message, stored_size
from ..rpc.wire import MAX_SCAN_BATCH, SCAN_REPLY_BYTES
from ..scanner import PartitionScanner

logger = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 60.0


class ScannerRegistry:
    """Open scanners by ID; a reaper thread closes idle ones."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        # scanner id -> (scanner, owning connection id, last use)
        self._scanners: dict[int, tuple[PartitionScanner, int, float]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="hqueue-scanner-reaper", daemon=True)
        self._reaper.start()

    def open(self, scanner: PartitionScanner, owner: int = 0) -> int:
        """Register ``scanner`` for connection ``owner``; its new ID."""
        with self._lock:
            scanner_id = secrets.randbelow(2**31 - 1) + 1
            while scanner_id in self._scanners:
                scanner_id = secrets.randbelow(2**31 - 1) + 1
            self._scanners[scanner_id] = (scanner, owner, time.monotonic())
        logger.debug("opened remote scanner %d: %s", scanner_id, scanner)
        return scanner_id

    def _get(self, scanner_id: int, owner: int) -> PartitionScanner:
        entry = self._scanners.get(scanner_id)
        if entry is None or entry[1] != owner:
            raise InvalidArgument(
                f"scanner {scanner_id} is not open on this connection (closed, or idle past {self.idle_timeout:g}s)"
            )
        return entry[0]

    def take(self, scanner_id: int, count: int, owner: int = 0) -> list[Message]:
        """Up to ``count`` messages (see the module's limits); an empty list at the end."""
        if not isinstance(count, int) or count < 1:
            raise InvalidArgument(f"'nbMessages' must be >= 1, got {count!r}")
        with self._lock:
            scanner = self._get(scanner_id, owner)
            self._scanners[scanner_id] = (scanner, owner, time.monotonic())
        out, size = [], 0
        for message in scanner:
            out.append(message)
            size += stored_size(message)
            if len(out) >= count or len(out) >= MAX_SCAN_BATCH or size >= SCAN_REPLY_BYTES:
                break
        return out

    def close(self, scanner_id: int, owner: int = 0) -> None:
        with self._lock:
            scanner = self._get(scanner_id, owner)
            del self._scanners[scanner_id]
        scanner.close()
        logger.debug("closed remote scanner %d after %d chunk(s)", scanner_id, scanner.count)

    def close_owned(self, owner: int) -> None:
        """Close every scanner of a connection that ended."""
        with self._lock:
            ids = [i for i, entry in self._scanners.items() if entry[1] == owner]
            scanners = [self._scanners.pop(i)[0] for i in ids]
        for scanner in scanners:
            scanner.close()

    def __len__(self) -> int:
        return len(self._scanners)

    def reap(self) -> int:
        """Close scanners idle past the timeout; return how many."""
        deadline = time.monotonic() - self.idle_timeout
        with self._lock:
            idle = [i for i, (_, _, used) in self._scanners.items() if used < deadline]
            closed = [self._scanners.pop(i)[0] for i in idle]
        for scanner in closed:
            scanner.close()
        if idle:
            logger.info("closed %d scanner(s) idle for %gs: %s", len(idle), self.idle_timeout, idle)
        return len(idle)

    def _reap_loop(self) -> None:
        while not self._stopped.wait(min(self.idle_timeout / 2, 5.0)):
            self.reap()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            scanners, self._scanners = list(self._scanners.values()), {}
        for scanner, _, _ in scanners:
            scanner.close()
