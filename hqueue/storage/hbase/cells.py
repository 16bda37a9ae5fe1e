"""HBase's cells for hqueue: the families and columns, where a cell key's row ends,
each cell's timestamp, and deletes (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import happybase  # noqa: F401  (it loads Hbase_thrift, from its Hbase.thrift)
from Hbase_thrift import BatchMutation, Mutation

from ...errors import StorageError
from ...ids import wall_clock_ms
from ...keys.index import HEAD_LENGTH, is_index_key
from ...message import MAX_TIMESTAMP, ROWKEY_LENGTH, partition_prefix
from ..base import Cell
from ..fence import fence_key

FAMILY = b"message"
_COLUMN_PREFIX = FAMILY + b":"
_META_FAMILY = b"q"
_META_COLUMN = b"q:info"
# Other metadata lives in the meta table too, in its own column, under
# rows that cannot be queue names ("/" is not allowed in those).
_KV_COLUMN = b"q:meta"
_KV_ROW = "meta/"
_ID_END = b"\xff" * 10
#: Seconds between housekeeping rounds, at most; a queue with a short TTL makes them closer.
HOUSEKEEPING_INTERVAL = 300.0
#: Nor closer than this, whatever the TTL.
MIN_HOUSEKEEPING_INTERVAL = 0.5


#: The fence's epoch and floor, in the partition's row of the meta table (fence.py).
_EPOCH_COLUMN = b"q:epoch"
_FLOOR_COLUMN = b"q:floor"
#: How far past a write's last ID its floor reservation reaches, in ms: a fenced
#: write pays the reserving round trip at most this often per partition, and a
#: new owner's first IDs may be this far ahead of the clock.
RESERVE_MS = 500
_TAKE_TRIES = 100
#: Seconds a metadata delete waits once HBase acknowledged it. HBase stamps the delete
#: with its clock's millisecond and its marker hides every version stamped at or before
#: it, a put that comes later included: a key deleted and written again within the same
#: millisecond (a queue dropped and created again, a subscription unregistered and
#: registered) would be lost. Past this wait, HBase's clock has moved on for any put
#: that follows the delete, from this process or any other.
DELETE_SETTLE = 0.0015


def _fence_row(queue: str, partition_id: int) -> bytes:
    return (_KV_ROW + fence_key(queue, partition_id)).encode()


#: How far past both the latest due time and this process's clock a timers' delete is
#: stamped: a timer's cell stamped by HBase's clock (a queue without a TTL) is ahead of
#: this process's by the clocks' skew (a review: 3 minutes ahead, and a cancelled timer
#: fired). A day covers any skew a cluster runs with. Timer keys are never written again,
#: and a delete is of one column, so a marker ahead hides nothing.
DELETE_AHEAD_MS = 86_400_000


def _cell_deletes(keys: Iterable[bytes], wal: bool) -> dict[int | None, list[BatchMutation]]:
    """Deletes of the cells ``keys``, by the timestamp to send them with (None:
    HBase's clock). HBase removes only the versions stamped at or before a
    delete's own, and a timer's cell is stamped with its due time on a queue with
    a TTL, maybe in the future, or with HBase's clock: timers' cells are deleted
    in one call stamped past the latest due time among them and past now
    (:data:`DELETE_AHEAD_MS`; each has one version, and no key is written again)."""
    plain: list[BatchMutation] = []
    timers: list[BatchMutation] = []
    latest = 0
    for key in keys:
        cut = _row_length(key)
        mutation = BatchMutation(
            key[:cut], [Mutation(isDelete=True, column=_COLUMN_PREFIX + key[cut:], writeToWAL=wal)]
        )
        due = _cell_time(key)
        if due is None:
            plain.append(mutation)
        else:
            timers.append(mutation)
            latest = max(latest, due)
    if not timers:
        return {None: plain}
    return {None: plain, min(max(latest, wall_clock_ms()) + DELETE_AHEAD_MS, MAX_TIMESTAMP): timers}


class StorageUnavailable(StorageError):
    """The HBase Thrift server cannot be reached or dropped the connection."""


def split_keys(partitions: int, partitions_per_region: int) -> list[bytes]:
    """Region boundaries that put ``partitions_per_region`` partitions in each region."""
    return [partition_prefix(pid) for pid in range(partitions_per_region, partitions, partitions_per_region)]


INDEX_ROW_LENGTH = HEAD_LENGTH + 10


def _in_range(
    rows: Iterable[tuple[bytes, dict[bytes, bytes]]], start_key: bytes, stop_key: bytes
) -> Iterator[list[Cell]]:
    """Each scanned row's cells (a cell's key: the row, then its qualifier's topic) in
    ``[start_key, stop_key)``; a row with none is skipped."""
    prefix = len(_COLUMN_PREFIX)
    for row, data in rows:
        cells = [(row + column[prefix:], value) for column, value in data.items()]
        kept = [cell for cell in cells if start_key <= cell[0] < stop_key]
        if kept:
            yield kept


def _cells_bytes(cells: list[Cell]) -> int:
    return sum(len(key) + len(value) for key, value in cells)


def _row_length(key: bytes) -> int:
    """Where a cell key's row ends: after the 12-byte rowkey, or for a topic-index
    entry (topic_index.py) after its ID too, so that each entry is a row of its own."""
    return INDEX_ROW_LENGTH if is_index_key(key) else ROWKEY_LENGTH


def _cell_time(key: bytes) -> int | None:
    """A timer's due time, from its cell key (None for any other cell, topic-index entries
    too: their keys also have the top bit set, with no due time in them). On a queue with
    a TTL a timer's cell is stamped with it, so that the family's TTL counts from then
    (timers.py); every other cell gets HBase's write time."""
    if key[0] & 0x80 and not is_index_key(key):
        due = int.from_bytes(key[2:10], "big")
        if due < 2**63:
            return due
    return None
