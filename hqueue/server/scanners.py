"""Server-side scanners for remote clients, with an idle timeout.

``messageScannerOpen`` registers a :class:`ColumnScanner` under a random i32
ID, bound to the connection that opened it (another connection cannot guess
or use it); ``messageScannerGetList`` reads from it,
at most :data:`~hqueue.rpc.wire.MAX_SCAN_BATCH` messages and about
:data:`~hqueue.rpc.wire.SCAN_REPLY_BYTES` per reply; ``close``, the end of
its connection, or ``idle_timeout`` seconds without a call frees it, so a
client that vanishes leaks nothing.

Memory is bounded, whatever the messages' sizes and however many scanners
a client opens:

* a read asks the store for no more cells than the reply still wants, and
  no more than :data:`READ_BYTES` at the sizes seen so far (a scanner's first
  read takes :data:`FIRST_READ` cells), so a call over 4 MiB messages holds
  a few of them, not a thousand;
* between calls a scanner keeps at most :data:`HELD_BYTES` of what it read:
  more is dropped and read again by the next call (the cursor moves back);
* a connection may have :data:`MAX_PER_CONNECTION` scanners open, one
  token's connections together :data:`MAX_PER_PRINCIPAL` (a quarter of the
  server's: one token cannot take every scanner from the others), and the
  server :data:`MAX_SCANNERS` (``LimitExceeded`` past any).

A scanner hands out the store's columns (cell keys and values) as they come
from the cursor: ``messageScannerGetPacked`` packs them with no object per
message, and the reply's size is counted over the lengths in C. Only the
struct calls (``messageScannerGet``, ``GetList``) make Message objects.
"""

from __future__ import annotations

import bisect
import collections
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from itertools import accumulate
from operator import add
from typing import TYPE_CHECKING

from ..errors import InvalidArgument, LimitExceeded
from ..rpc.loop import may_block
from ..rpc.wire import MAX_SCAN_BATCH, SCAN_REPLY_BYTES, SCANNER_GONE
from ..scanner import DEFAULT_CACHING, KeyRangeCursor, Scan

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 60.0
#: Cells a scanner's first read asks for (before it knows their sizes).
FIRST_READ = 16
#: About the most bytes one read of the store brings, at the cell sizes seen so far.
READ_BYTES = SCAN_REPLY_BYTES
#: The most bytes of cells read and not handed out that a scanner keeps between calls.
HELD_BYTES = 64 * 1024
#: Scanners open at once on one connection, and on the server.
MAX_PER_CONNECTION, MAX_SCANNERS = 64, 10_000
#: Scanners open at once on the connections of one token (a quarter of the server's, as
#: ``--connection-share`` and ``--inflight-share`` are by default).
MAX_PER_PRINCIPAL = MAX_SCANNERS // 4


Columns = tuple[list[bytes], list[bytes]]


class ColumnScanner:
    """One partition's cells in ID order, handed out as columns in replies of bounded size."""

    def __init__(
        self, source: Engine, queue: str, partition_id: int, scan: Scan, caching: int = DEFAULT_CACHING
    ) -> None:
        # A cursor over this process's store (a server's engine is never remote): it holds
        # nothing between reads, and its start and read size may be moved.
        self._cursor = KeyRangeCursor(source, queue, partition_id, scan, caching)
        self.queue, self.partition_id, self.caching = queue, partition_id, caching
        #: Its reads may go through rows of other topics (no topic index), or merge many
        #: topics' index entries: run off the event loop (Engine.off_loop).
        self.off_loop = source.off_loop(queue, scan.topics)
        #: Bytes per cell read so far (None: nothing read yet).
        self._cell_bytes: float | None = None
        self._keys: Sequence[bytes] = ()
        self._values: Sequence[bytes] = ()
        self._at = 0  # the first cell of the chunk not handed out
        #: Chunks read from the store.
        self.count = 0

    def take(self, count: int, room: int | None = None) -> Columns:
        """Up to ``count`` cells (and :data:`MAX_SCAN_BATCH`), stopping after the one
        that brings the reply to ``room`` bytes (:data:`SCAN_REPLY_BYTES`); none at the end."""
        keys: list[bytes] = []
        values: list[bytes] = []
        limit = min(count, MAX_SCAN_BATCH)
        if room is None:  # (read when called: the module's limit, not a default bound at import)
            room = SCAN_REPLY_BYTES
        while len(keys) < limit and room > 0:
            if self._at >= len(self._keys):
                if self._cursor.done:
                    break
                self._read(limit - len(keys))
                continue
            start = self._at
            end = min(len(self._keys), start + limit - len(keys))
            chunk_keys, chunk_values = self._keys[start:end], self._values[start:end]
            sizes = list(accumulate(map(add, map(len, chunk_keys), map(len, chunk_values))))
            over = bisect.bisect_left(sizes, room)  # the first cell that fills the reply
            if over < len(sizes):
                end = start + over + 1
                chunk_keys, chunk_values = chunk_keys[: over + 1], chunk_values[: over + 1]
            room -= sizes[end - start - 1]
            keys += chunk_keys
            values += chunk_values
            self._at = end
        self._drop_what_is_big()
        return keys, values

    def _read(self, wanted: int) -> None:
        """One read of the store: at most ``wanted`` cells, and about READ_BYTES."""
        cells = FIRST_READ if self._cell_bytes is None else int(READ_BYTES // max(self._cell_bytes, 1.0))
        cursor = self._cursor
        cursor.caching = max(1, min(wanted, cells, self.caching))
        self._keys, self._values = cursor.fetch_columns()
        self._at = 0
        self.count += 1
        if self._keys:
            size = sum(map(len, self._keys)) + sum(map(len, self._values))
            self._cell_bytes = size / len(self._keys)

    def _drop_what_is_big(self) -> None:
        """Keep at most HELD_BYTES of cells read and not handed out: the cursor goes back to the rest."""
        left = len(self._keys) - self._at
        if left and (self._cell_bytes or 0) * left > HELD_BYTES:
            self._cursor.start, self._cursor.done = self._keys[self._at], False
            self._keys = self._values = ()
            self._at = 0

    def close(self) -> None:
        self._cursor.close()
        self._keys = self._values = ()

    def __repr__(self) -> str:
        return f"ColumnScanner({self.queue!r}, {self.partition_id})"


class ScannerRegistry:
    """Open scanners by ID; a reaper thread closes idle ones."""

    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        # scanner id -> (scanner, owning connection id, last use)
        self._scanners: dict[int, tuple[ColumnScanner, int, float]] = {}
        # scanner id -> the token its connection authenticated as; scanners open per token
        self._principals: dict[int, str] = {}
        self._per_principal: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="hqueue-scanner-reaper", daemon=True)
        self._reaper.start()

    def open(self, scanner: ColumnScanner, owner: int = 0, principal: str | None = None) -> int:
        """Register ``scanner`` for connection ``owner`` (authenticated as ``principal``, if
        the server has tokens); its new ID.

        Raises:
            LimitExceeded: the connection has MAX_PER_CONNECTION scanners open, the
                principal's connections MAX_PER_PRINCIPAL, or the server MAX_SCANNERS
                (close some: ``messageScannerClose``).
        """
        with self._lock:
            if principal is not None and self._per_principal[principal] >= MAX_PER_PRINCIPAL:
                raise LimitExceeded(
                    "max_scanners_per_token", MAX_PER_PRINCIPAL,
                    f"the connections of token {principal!r} have {MAX_PER_PRINCIPAL} scanners open: close some first",
                )  # fmt: skip
            if len(self._scanners) >= MAX_SCANNERS:
                raise LimitExceeded("max_scanners", MAX_SCANNERS, f"the server has {MAX_SCANNERS} scanners open")
            if owner and sum(1 for entry in self._scanners.values() if entry[1] == owner) >= MAX_PER_CONNECTION:
                raise LimitExceeded(
                    "max_scanners_per_connection", MAX_PER_CONNECTION,
                    f"this connection has {MAX_PER_CONNECTION} scanners open: close one first",
                )  # fmt: skip
            scanner_id = secrets.randbelow(2**31 - 1) + 1
            while scanner_id in self._scanners:
                scanner_id = secrets.randbelow(2**31 - 1) + 1
            self._scanners[scanner_id] = (scanner, owner, time.monotonic())
            if principal is not None:
                self._principals[scanner_id] = principal
                self._per_principal[principal] += 1
        logger.debug("opened remote scanner %d: %s", scanner_id, scanner)
        return scanner_id

    def _get(self, scanner_id: int, owner: int, principal: str | None) -> ColumnScanner:
        entry = self._scanners.get(scanner_id)
        # (a connection that authenticated again as another token has none of the first one's)
        if entry is None or entry[1] != owner or self._principals.get(scanner_id) != principal:
            raise InvalidArgument(f"scanner {scanner_id} {SCANNER_GONE} (closed, or idle past {self.idle_timeout:g}s)")
        return entry[0]

    def take(
        self, scanner_id: int, count: int, owner: int = 0, principal: str | None = None, room: int | None = None
    ) -> Columns:
        """Up to ``count`` cells as (cell keys, values), ``room`` bytes and the cell that
        passes them (see the module's limits); none at the end."""
        if not isinstance(count, int) or count < 1:
            raise InvalidArgument(f"'nbMessages' must be >= 1, got {count!r}")
        with self._lock:
            scanner = self._get(scanner_id, owner, principal)
            self._scanners[scanner_id] = (scanner, owner, time.monotonic())
        if scanner.off_loop:
            may_block()  # (on the event loop: the call goes to a worker, before it reads anything)
        return scanner.take(count, room)

    def close(self, scanner_id: int, owner: int = 0, principal: str | None = None) -> None:
        with self._lock:
            scanner = self._get(scanner_id, owner, principal)
            self._drop([scanner_id])
        scanner.close()
        logger.debug("closed remote scanner %d after %d chunk(s)", scanner_id, scanner.count)

    def close_owned(self, owner: int) -> None:
        """Close every scanner of a connection that ended."""
        with self._lock:
            scanners = self._drop([i for i, entry in self._scanners.items() if entry[1] == owner])
        for scanner in scanners:
            scanner.close()

    def _drop(self, ids: Sequence[int]) -> list[ColumnScanner]:
        """Take these scanners out of the registry (under its lock); them, to close."""
        scanners = []
        for scanner_id in ids:
            scanners.append(self._scanners.pop(scanner_id)[0])
            principal = self._principals.pop(scanner_id, None)
            if principal is not None:
                self._per_principal[principal] -= 1
                if not self._per_principal[principal]:
                    del self._per_principal[principal]
        return scanners

    def __len__(self) -> int:
        return len(self._scanners)

    def reap(self) -> int:
        """Close scanners idle past the timeout; return how many."""
        deadline = time.monotonic() - self.idle_timeout
        with self._lock:
            idle = [i for i, (_, _, used) in self._scanners.items() if used < deadline]
            closed = self._drop(idle)
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
            scanners = self._drop(list(self._scanners))
        for scanner in scanners:
            scanner.close()
