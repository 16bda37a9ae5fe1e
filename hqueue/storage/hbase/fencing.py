"""Fenced writes on HBase (SPEC C10, ``storage/fence.py``): take a partition with
``checkAndPut`` on its fence row, reserve IDs ahead, read the epoch back after
a write, and undo a refused write's own cells."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import happybase
from Hbase_thrift import BatchMutation, Mutation  # loaded by happybase from its Hbase.thrift

from ...config import Durability
from ...errors import Fenced, StorageError
from ...keys.timers import is_high_water
from ..base import Cell
from ..fence import Epoch, Fence, Token, next_epoch
from .cells import (
    _EPOCH_COLUMN,
    _FLOOR_COLUMN,
    _KV_COLUMN,
    _KV_ROW,
    _TAKE_TRIES,
    DELETE_SETTLE,
    RESERVE_MS,
    _cell_deletes,
    _fence_row,
)


class FencedWrites:
    """The fence half of :class:`~hqueue.storage.hbase.HBaseStorage` (a mixin over its
    connections, meta table and reservations)."""

    url: str
    _meta_table: bytes
    _reserved: dict[tuple[str, int], tuple[Epoch, bytes]]
    _connection: Any
    _send: Any
    get_queue: Any

    def take_partition(self, name: str, partition_id: int, token: Token | None = None) -> Fence:
        self.get_queue(name)
        row = _fence_row(name, partition_id)
        with self._connection(f"take {name!r} partition {partition_id}", name) as connection:
            meta = connection.table(self._meta_table)
            for _ in range(_TAKE_TRIES):
                old = meta.row(row, columns=[_EPOCH_COLUMN]).get(_EPOCH_COLUMN)
                epoch = next_epoch(name, partition_id, Epoch.from_bytes(old), token)
                bump = Mutation(column=_EPOCH_COLUMN, value=epoch.to_bytes())
                if connection.client.checkAndPut(self._meta_table, row, _EPOCH_COLUMN, old, bump, {}):
                    # Read after the bump: it covers every reservation made under older epochs.
                    floor = meta.row(row, columns=[_FLOOR_COLUMN]).get(_FLOOR_COLUMN, b"")
                    self._reserved[(name, partition_id)] = (epoch, floor)
                    return Fence(name, partition_id, epoch, floor)
        raise StorageError(f"HBase at {self.url}: could not take {name!r} partition {partition_id}: contended")

    def _reserve(self, connection: happybase.Connection, fence: Fence, high: bytes) -> None:
        """Raise the partition's floor above ``high`` (RESERVE_MS ahead), if the epoch is still ours."""
        key = (fence.queue, fence.partition_id)
        reserved = self._reserved.get(key)
        if reserved is not None and reserved[0] == fence.epoch and high < reserved[1]:
            return
        until = max((int.from_bytes(high[:8], "big") + RESERVE_MS).to_bytes(8, "big") + b"\0\0", fence.floor)
        row = _fence_row(*key)
        raise_floor, epoch = Mutation(column=_FLOOR_COLUMN, value=until), fence.epoch.to_bytes()
        if not connection.client.checkAndPut(self._meta_table, row, _EPOCH_COLUMN, epoch, raise_floor, {}):
            raise Fenced(fence.queue, fence.partition_id, fence.epoch)
        self._reserved[key] = (fence.epoch, until)

    def _verify(self, connection: happybase.Connection, fence: Fence, undo: Callable[[], None] | None = None) -> None:
        """Raise Fenced, after calling ``undo``, if the partition's epoch is no longer ``fence``'s."""
        row = _fence_row(fence.queue, fence.partition_id)
        stored = connection.table(self._meta_table).row(row, columns=[_EPOCH_COLUMN])
        if Epoch.from_bytes(stored.get(_EPOCH_COLUMN)) == fence.epoch:
            return
        if undo is not None:
            undo()
        raise Fenced(fence.queue, fence.partition_id, fence.epoch)

    def _undo(self, connection: happybase.Connection, name: str, cells: Sequence[Cell], wal: bool) -> None:
        """Delete a refused write's cells: their IDs are at or below its reservation, so
        below every ID of the new owner, whose cells are never touched. The timers'
        high-water cell is one per partition, not per ID: it stays (the fence's floor
        covers every ID it could name)."""
        mine = [key for key, _ in cells if not is_high_water(key)]
        self._send(connection, name, _cell_deletes(mine, wal))

    def write_meta(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        fence: Fence | None = None,
        entered: Callable[[], object] | None = None,
    ) -> None:
        """One ``mutateRows`` round trip for the lot (consumer groups' acks); with a
        fence, the puts, the epoch read back, then the deletes. (HBase orders the
        writes; ``entered`` is never called: a group keeps its lock through the write.)"""
        wal = durability != Durability.SKIP_WAL
        batch = [
            BatchMutation((_KV_ROW + key).encode(), [Mutation(column=_KV_COLUMN, value=value, writeToWAL=wal)])
            for key, value in puts.items()
        ]
        removals = [
            BatchMutation((_KV_ROW + key).encode(), [Mutation(isDelete=True, column=_KV_COLUMN, writeToWAL=wal)])
            for key in deletes
        ]
        deleting = bool(removals)
        if fence is None:
            batch, removals = batch + removals, []
        if not (batch or removals or fence):
            return
        with self._connection(f"write {len(batch) + len(removals)} metadata key(s)") as connection:
            if batch:
                connection.client.mutateRows(self._meta_table, batch, {})
            if fence is not None:
                self._verify(connection, fence)
            if removals:
                connection.client.mutateRows(self._meta_table, removals, {})
        if deleting:
            time.sleep(DELETE_SETTLE)  # a put that follows must not fall under the deletes' markers
