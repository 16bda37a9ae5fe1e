"""How far a reader is behind in a partition (SPEC X6): in messages and in time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ids import wall_clock_ms
from .message import MessageID, id_bytes, successor
from .scanner import Scan

if TYPE_CHECKING:
    from .engine import Engine

#: Metrics count lag messages up to this many per partition (a scrape must stay cheap).
LAG_COUNT_LIMIT = 100_000
#: Rows read per call while counting.
_CHUNK = 10_000


def partition_lag(
    engine: Engine,
    queue: str,
    partition_id: int,
    checkpoint: MessageID,
    topics: frozenset[bytes] | None,
    limit: int | None = LAG_COUNT_LIMIT,
) -> tuple[int, int]:
    """How far a reader is behind in a partition: (messages at or after
    ``checkpoint``, counted up to ``limit``, None: all of them; milliseconds
    since the oldest of them was written). Both 0 when nothing waits; never
    negative. Expired (TTL) and truncated messages are not counted."""
    last = engine.last_id(queue, partition_id)
    if last is None or last < checkpoint:
        return 0, 0
    scan = Scan(checkpoint, successor(last), topics)
    start, stop = scan.key_range(partition_id)
    count, oldest = 0, None
    while limit is None or count < limit:
        asked = _CHUNK if limit is None else min(_CHUNK, limit - count)
        keys, _ = engine.scan_columns(queue, start, stop, scan.topics, asked)
        if not keys:
            break
        if oldest is None:
            oldest = MessageID.from_bytes(id_bytes(keys[0]))
        count += len(keys)
        if len(keys) < asked:
            break
        start = keys[-1] + b"\x00"
    if oldest is None:
        return 0, 0
    return count, max(0, wall_clock_ms() - oldest.timestamp)
