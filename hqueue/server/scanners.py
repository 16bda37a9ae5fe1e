"""Server-side scanners for remote clients, with an idle timeout.

``messageScannerOpen`` registers a :class:`~hqueue.scanner.PartitionScanner`
under an i32 ID; ``messageScannerGetList`` reads from it; ``close`` or
``idle_timeout`` seconds without a call frees it, so a client that
vanishes leaks nothing.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from itertools import islice

from ..errors import InvalidMessage
from ..message import Message
from ..scanner import PartitionScanner

logger = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 60.0


class ScannerRegistry:
    """Open scanners by ID; a reaper thread closes idle ones."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        self._scanners: dict[int, tuple[PartitionScanner, float]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopped = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="hqueue-scanner-reaper", daemon=True)
        self._reaper.start()

    def open(self, scanner: PartitionScanner) -> int:
        scanner_id = next(self._ids) % 2**31 or next(self._ids)
        with self._lock:
            self._scanners[scanner_id] = (scanner, time.monotonic())
        logger.debug("opened remote scanner %d: %s", scanner_id, scanner)
        return scanner_id

    def take(self, scanner_id: int, count: int) -> list[Message]:
        """Up to ``count`` messages; an empty list at the end."""
        if not isinstance(count, int) or count < 1:
            raise InvalidMessage(f"'nbMessages' must be >= 1, got {count!r}")
        with self._lock:
            entry = self._scanners.get(scanner_id)
            if entry is None:
                raise InvalidMessage(f"scanner {scanner_id} is not open (closed, or idle past {self.idle_timeout:g}s)")
            self._scanners[scanner_id] = (entry[0], time.monotonic())
        return list(islice(entry[0], count))

    def close(self, scanner_id: int) -> None:
        with self._lock:
            entry = self._scanners.pop(scanner_id, None)
        if entry is None:
            raise InvalidMessage(f"scanner {scanner_id} is not open")
        entry[0].close()
        logger.debug("closed remote scanner %d after %d chunk(s)", scanner_id, entry[0].count)

    def __len__(self) -> int:
        return len(self._scanners)

    def reap(self) -> int:
        """Close scanners idle past the timeout; return how many."""
        deadline = time.monotonic() - self.idle_timeout
        with self._lock:
            idle = [i for i, (_, used) in self._scanners.items() if used < deadline]
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
        for scanner, _ in scanners:
            scanner.close()
