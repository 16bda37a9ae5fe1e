"""HBaseStorage: queues in HBase tables over happybase (see the package's docstring)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import parse_qs, urlsplit

import happybase
from Hbase_thrift import BatchMutation, Mutation  # loaded by happybase from its Hbase.thrift
from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ...config import Durability, QueueInfo, QueueState
from ...errors import InvalidArgument, QueueDisabled, QueueExists, QueueNotFound, StorageError
from ...message import ROWKEY_LENGTH, key_after, partition_prefix
from ...rpc.failures import explain
from ..base import Cell, Storage, housekeeping, keep_id_floor, until_bytes
from ..fence import Epoch, Fence
from .admin import Thrift2Admin
from .cells import (
    _COLUMN_PREFIX,
    _ID_END,
    _KV_COLUMN,
    _KV_ROW,
    _META_COLUMN,
    _META_FAMILY,
    DELETE_SETTLE,
    FAMILY,
    HOUSEKEEPING_INTERVAL,
    MIN_HOUSEKEEPING_INTERVAL,
    StorageUnavailable,
    _cell_deletes,
    _cell_time,
    _cells_bytes,
    _in_range,
    _row_length,
)
from .fencing import FencedWrites

logger = logging.getLogger(__name__)


class HBaseStorage(FencedWrites, Storage):
    """Queues in HBase tables, reached through a pool of happybase connections.

    Args:
        host, port: The HBase Thrift server.
        prefix: Prepended to every table name (one HBase, many deployments).
        transport: ``buffered`` (HBase's default) or ``framed``.
        protocol: ``binary`` (HBase's default) or ``compact``.
        pool_size: Connections kept open.
        timeout: Socket timeout in milliseconds.
        compression: Column family compression (``NONE``, ``SNAPPY``, ``GZ``…).
        admin: ``host:port`` of an HBase 2.x Thrift2 gateway, for pre-split
            tables, ASYNC_WAL and truncate that keeps splits.
    """

    in_process = False  # each call is a round trip to HBase: never on a server's event loop

    def __init__(
        self,
        host: str = "localhost",
        port: int = 9090,
        *,
        prefix: str = "hq_",
        transport: str = "buffered",
        protocol: str = "binary",
        pool_size: int = 8,
        timeout: int = 30_000,
        compression: str = "NONE",
        admin: str | None = None,
    ) -> None:
        self.url = f"hbase://{host}:{port}?prefix={prefix}&transport={transport}&protocol={protocol}"
        self.host, self.port = host, port
        self._admin = Thrift2Admin(admin, transport, protocol, timeout) if admin else None
        self.prefix, self.compression = prefix, compression
        self._acquire_timeout = timeout / 1000
        self._meta_table = f"{prefix}meta".encode()
        try:
            self._pool = happybase.ConnectionPool(
                pool_size, host=host, port=port, transport=transport, protocol=protocol, timeout=timeout
            )
        except (TException, OSError) as e:
            why = explain(host, port, e, None, "HBase's Thrift server")
            raise StorageUnavailable(f"cannot connect to the HBase Thrift server at {host}:{port}: {why}") from e
        self._ensure_meta_table()
        self._closed, self._lock = threading.Event(), threading.RLock()
        #: (queue, pid) -> (epoch, the floor reserved under it): see _reserve.
        self._reserved: dict[tuple[str, int], tuple[Epoch, bytes]] = {}
        housekeeping(self, self._closed, self._lock, self._housekeeping_interval)

    def _housekeeping_interval(self) -> float:
        """Half the shortest TTL (so every newest ID is remembered before it can
        expire), within [MIN_HOUSEKEEPING_INTERVAL, HOUSEKEEPING_INTERVAL]."""
        if self._closed.is_set():
            return 0.0
        try:
            ttls = [info.ttl for info in self.list_queues() if info.ttl]
        except Exception:  # HBase away: try again soon
            return MIN_HOUSEKEEPING_INTERVAL * 10
        return max(MIN_HOUSEKEEPING_INTERVAL, min([HOUSEKEEPING_INTERVAL] + [ttl / 2 for ttl in ttls]))

    @classmethod
    def from_url(cls, url: str) -> HBaseStorage:
        """``hbase://host:port?prefix=hq_&transport=framed&protocol=compact&pool=8&timeout=30000``."""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        known = {"prefix", "transport", "protocol", "pool", "timeout", "compression", "admin"}
        if set(query) - known:
            raise InvalidArgument(
                f"unknown hbase:// URL option(s) {sorted(set(query) - known)}; known: {sorted(known)}"
            )
        return cls(
            parts.hostname or "localhost",
            parts.port or 9090,
            prefix=query.get("prefix", "hq_"),
            transport=query.get("transport", "buffered"),
            protocol=query.get("protocol", "binary"),
            pool_size=int(query.get("pool", 8)),
            timeout=int(query.get("timeout", 30_000)),
            compression=query.get("compression", "NONE"),
            admin=query.get("admin"),
        )

    # -- plumbing -------------------------------------------------------------

    @contextmanager
    def _connection(self, what: str, queue: str | None = None) -> Iterator[happybase.Connection]:
        """A pooled connection; Thrift and socket errors become hqueue errors."""
        try:
            with self._pool.connection(timeout=self._acquire_timeout) as connection:
                yield connection
        except (TTransportException, OSError, happybase.NoConnectionsAvailable) as e:
            plain = isinstance(e, happybase.NoConnectionsAvailable)
            why = str(e) if plain else explain(self.host, self.port, e, None, "HBase's Thrift server")
            raise StorageUnavailable(f"HBase at {self.url}: {what}: {why}") from e
        except TException as e:
            # HBase's IOError carries the Java exception's name in its message.
            message = getattr(e, "message", None) or repr(e)
            if isinstance(message, bytes):  # thriftpy2 may leave IDL strings undecoded
                message = message.decode("utf-8", "replace")
            if queue is not None and "TableNotFoundException" in message:
                raise QueueNotFound(queue) from e
            if queue is not None and "TableNotEnabledException" in message:
                raise QueueDisabled(queue) from e
            raise StorageError(f"HBase at {self.url}: {what}: {message}") from e

    def _retrying(self, what: str, call, queue: str | None = None):
        """Run an idempotent read; retry once on a fresh connection."""
        try:
            with self._connection(what, queue) as connection:
                return call(connection)
        except StorageUnavailable:
            logger.info("retrying %s once after a connection failure", what, exc_info=True)
            with self._connection(what, queue) as connection:
                return call(connection)

    def _table_name(self, queue: str) -> bytes:
        return f"{self.prefix}q_{queue}".encode()

    def _ensure_meta_table(self) -> None:
        with self._connection("create the meta table") as connection:
            if self._meta_table not in connection.client.getTableNames():
                try:
                    connection.create_table(self._meta_table, {_META_FAMILY.decode(): {"max_versions": 1}})
                except TException as e:  # another process created it first
                    if type(e).__name__ != "AlreadyExists":
                        raise

    # -- queues ---------------------------------------------------------------

    def create_queue(self, info: QueueInfo) -> None:
        with self._connection(f"create queue {info.name!r}") as connection:
            client = connection.client
            mutation = Mutation(column=_META_COLUMN, value=info.to_json())
            # checkAndPut with no expected value succeeds only if the row is new:
            # two processes creating one queue cannot both win.
            if not client.checkAndPut(self._meta_table, info.name.encode(), _META_COLUMN, None, mutation, {}):
                raise QueueExists(info.name)
            table = self._table_name(info.name)
            if table in client.getTableNames():  # a leftover of a half-finished delete
                if client.isTableEnabled(table):
                    client.disableTable(table)
                client.deleteTable(table)
            self._create_table(connection, info)

    def _create_table(self, connection: happybase.Connection, info: QueueInfo) -> None:
        table = self._table_name(info.name)
        if self._admin:
            self._admin.create_table(table, info, self.compression)
        else:
            family = {"max_versions": 1, "compression": self.compression}
            if info.ttl:
                family["time_to_live"] = info.ttl
            connection.create_table(table, {FAMILY.decode(): family})
        if not info.enabled:
            connection.client.disableTable(table)

    def get_queue(self, name: str) -> QueueInfo:
        def read(connection):
            return connection.table(self._meta_table).row(name.encode(), columns=[_META_COLUMN])

        row = self._retrying(f"read queue {name!r}", read)
        if not row:
            raise QueueNotFound(name)
        return QueueInfo.from_json(row[_META_COLUMN])

    def list_queues(self) -> list[QueueInfo]:
        def read(connection):
            return list(connection.table(self._meta_table).scan(columns=[_META_COLUMN]))

        rows = self._retrying("list queues", read)
        return sorted((QueueInfo.from_json(data[_META_COLUMN]) for _, data in rows), key=lambda i: i.name)

    def update_queue(self, info: QueueInfo) -> None:
        old = self.get_queue(info.name)
        with self._connection(f"update queue {info.name!r}") as connection:
            table = self._table_name(info.name)
            # Mirror the state on the HBase table, so HBase tools see it too.
            if old.state != info.state:
                if info.state == QueueState.DISABLED:
                    connection.client.disableTable(table)
                else:
                    connection.client.enableTable(table)
            connection.table(self._meta_table).put(info.name.encode(), {_META_COLUMN: info.to_json()})

    def delete_queue(self, name: str) -> None:
        self.get_queue(name)
        with self._connection(f"delete queue {name!r}") as connection:
            table = self._table_name(name)
            if table in connection.client.getTableNames():
                if connection.client.isTableEnabled(table):
                    connection.client.disableTable(table)
                connection.client.deleteTable(table)
            connection.table(self._meta_table).delete(name.encode())
        time.sleep(DELETE_SETTLE)  # a create that follows must not fall under the delete's marker

    def truncate_queue(self, name: str) -> None:
        info = self.get_queue(name)
        with self._connection(f"truncate queue {name!r}", name) as connection:
            table = self._table_name(name)
            if connection.client.isTableEnabled(table):
                connection.client.disableTable(table)
            if self._admin:
                self._admin.truncate_table(table)  # HBase enables it again afterwards
                if not info.enabled:
                    connection.client.disableTable(table)
            else:
                connection.client.deleteTable(table)
                self._create_table(connection, info)

    # -- cells ----------------------------------------------------------------

    def write(
        self,
        name: str,
        cells: Sequence[Cell],
        durability: str,
        deletes: Sequence[bytes] = (),
        *,
        fence: Fence | None = None,
        high: bytes = b"",
        ttl: int = 0,
        created: str | None = None,
    ) -> None:
        wal = durability != Durability.SKIP_WAL  # (``created`` is not checked: Storage.write)
        by_time: dict[int | None, list[BatchMutation]] = {}
        for key, value in cells:
            cut = _row_length(key)
            mutation = Mutation(column=_COLUMN_PREFIX + key[cut:], value=value, writeToWAL=wal)
            stamp = _cell_time(key) if ttl else None  # (without a TTL: one call for the lot, so atomic)
            by_time.setdefault(stamp, []).append(BatchMutation(key[:cut], [mutation]))
        removals = _cell_deletes(deletes, wal)
        if fence is None:  # as few Thrift round trips as can be
            for timestamp, batch in removals.items():
                by_time.setdefault(timestamp, []).extend(batch)
            removals = {}
        with self._connection(f"write {len(cells)} message(s) to {name!r}", name) as connection:
            if fence is not None and high:
                self._reserve(connection, fence, high)
            # One round trip for the batch (happybase's Batch.send); on a queue with a TTL,
            # timers' cells, stamped with their due time, in one more per due time (not
            # atomic against this server's crash: docs/distributed.md's known gaps).
            self._send(connection, name, by_time)
            if fence is not None:
                self._verify(connection, fence, undo=lambda: self._undo(connection, name, cells, wal))
                # Only once verified: a fenced writer never deletes (a timer another owner must fire).
                self._send(connection, name, removals)

    def _send(
        self, connection: happybase.Connection, name: str, by_time: dict[int | None, list[BatchMutation]]
    ) -> None:
        """One ``mutateRows`` per timestamp (None: HBase's clock)."""
        for timestamp, batch in by_time.items():
            if timestamp is not None and batch:
                connection.client.mutateRowsTs(self._table_name(name), batch, timestamp, {})
        if by_time.get(None):
            connection.client.mutateRows(self._table_name(name), by_time[None], {})

    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None = None,
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> list[Cell]:
        return self._scan(name, start_key, stop_key, topics, limit, max_bytes)

    def scan_keys(self, name: str, start_key: bytes, stop_key: bytes, limit: int) -> list[bytes]:
        """The keys alone: HBase's KeyOnlyFilter leaves the values on the region server."""
        return [key for key, _ in self._scan(name, start_key, stop_key, None, limit, None, keys_only=True)]

    def _scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None,
        limit: int,
        max_bytes: int | None,
        keys_only: bool = False,
    ) -> list[Cell]:
        if start_key >= stop_key:
            return []
        columns = [_COLUMN_PREFIX + t for t in sorted(topics)] if topics else [FAMILY]

        # HBase scans rows; a cell key may go past the 12-byte row (timers' cells, timers.py).
        row_start = start_key[: _row_length(start_key)]
        cut = _row_length(stop_key)
        row_stop = stop_key if len(stop_key) <= cut else key_after(stop_key[:cut])
        rows_wanted = limit + (len(start_key) > len(row_start))  # the first row may hold only cells before start

        def read(connection):
            rows = connection.table(self._table_name(name)).scan(
                row_start=row_start,
                row_stop=row_stop,
                columns=columns,
                filter=b"KeyOnlyFilter()" if keys_only else None,
                # (a byte bound: rows fetched a few at a time, none past the bound's batch)
                batch_size=min(rows_wanted, 1000 if max_bytes is None else 32),
                limit=rows_wanted,
            )
            # A message's row holds one cell, its qualifier the topic; a timers' row may hold many.
            # Cells outside the range (the first row's before start_key) go before any byte is
            # counted: they took their row's bytes, and a read that went on came back short.
            chunks: Iterable[list[Cell]] = _in_range(rows, start_key, stop_key)
            if max_bytes is not None:  # no more rows taken once they hold max_bytes
                chunks = until_bytes(chunks, max_bytes, _cells_bytes)
            cells = sorted(cell for chunk in chunks for cell in chunk)[:limit]
            return cells if max_bytes is None else until_bytes(cells, max_bytes)

        return self._retrying(f"scan {name!r}", read, name)

    def last_rowkey(self, name: str, partition_id: int) -> bytes | None:
        def read(connection):
            rows = connection.table(self._table_name(name)).scan(
                row_start=partition_prefix(partition_id) + _ID_END,
                row_stop=partition_prefix(partition_id),
                columns=[FAMILY],
                limit=1,
                reverse=True,
            )
            return [row for row, _ in rows]

        rows = self._retrying(f"last rowkey of {name!r} partition {partition_id}", read, name)
        return rows[0][:ROWKEY_LENGTH] if rows else None

    def get_meta(self, key: str) -> bytes | None:
        def read(connection):
            return connection.table(self._meta_table).row((_KV_ROW + key).encode(), columns=[_KV_COLUMN])

        return self._retrying(f"read {key!r}", read).get(_KV_COLUMN)

    def put_meta(self, key: str, value: bytes) -> None:
        with self._connection(f"write {key!r}") as connection:
            connection.table(self._meta_table).put((_KV_ROW + key).encode(), {_KV_COLUMN: value})

    def delete_meta(self, key: str) -> None:
        with self._connection(f"delete {key!r}") as connection:
            connection.table(self._meta_table).delete((_KV_ROW + key).encode(), columns=[_KV_COLUMN])
        time.sleep(DELETE_SETTLE)  # a put that follows must not fall under the delete's marker

    def list_meta(self, prefix: str) -> dict[str, bytes]:
        def read(connection):
            rows = connection.table(self._meta_table).scan(row_prefix=(_KV_ROW + prefix).encode(), columns=[_KV_COLUMN])
            return {row.decode()[len(_KV_ROW) :]: data[_KV_COLUMN] for row, data in rows}

        return self._retrying(f"list {prefix!r}", read)

    def estimate_count(self, name: str) -> int | None:
        return None

    def reclaim_expired(self, name: str) -> None:
        """HBase drops expired cells itself; remember the queue's newest ID before it
        can (the ID floor: new IDs stay above it after a restart, SPEC C2)."""
        info = self.get_queue(name)
        if info.ttl:
            keep_id_floor(self, info, None)

    def close(self) -> None:
        with self._lock:  # waits for a housekeeping round under way
            self._closed.set()
        # happybase's pool has no close(); drop every pooled connection.
        pool_queue = getattr(self._pool, "_queue", None)
        while pool_queue is not None and not pool_queue.empty():
            pool_queue.get_nowait().close()
