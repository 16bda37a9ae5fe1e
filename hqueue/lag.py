"""How far a reader is behind in a partition (SPEC X6): in messages and in time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .coordination.registry import successor
from .ids import wall_clock_ms
from .message import MessageID
from .scanner import Scan

if TYPE_CHECKING:
    from .engine import Engine

#: describe_subscriber counts lag messages up to this many per partition.
LAG_COUNT_LIMIT = 100_000


def partition_lag(
    engine: Engine, queue: str, partition_id: int, checkpoint: MessageID, topics: frozenset[bytes] | None
) -> tuple[int, int]:
    """How far a subscriber is behind in a partition: (undelivered messages,
    counted up to LAG_COUNT_LIMIT; milliseconds since the oldest undelivered
    one was written). Both 0 when nothing waits; never negative."""
    last = engine.last_id(queue, partition_id)
    if last is None or last < checkpoint:
        return 0, 0
    scan = Scan(checkpoint, successor(last), topics)
    start, stop = scan.key_range(partition_id)
    waiting = engine.scan(queue, start, stop, scan.topics, LAG_COUNT_LIMIT)
    if not waiting:
        return 0, 0
    oldest = waiting[0].id
    return len(waiting), max(0, wall_clock_ms() - oldest.timestamp) if oldest else 0
