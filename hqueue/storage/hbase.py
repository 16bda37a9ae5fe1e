"""HBase storage through its Thrift (1) gateway, with happybase.

Layout (SPEC C1):

* one table per queue, ``<prefix>q_<queue>``, column family ``message``
  (``max_versions=1``, ``time_to_live`` = the queue's TTL, compression
  configurable); row = the 12-byte rowkey, qualifier = topic, value = payload;
* a meta table ``<prefix>meta``, family ``q``, one row per queue holding its
  :class:`~hqueue.config.QueueInfo` as JSON, so every hqueue process pointed
  at the same HBase sees the same queues.

What HBase's Thrift1 API can and cannot do, and what this backend does:

* Pre-split: Thrift1 ``createTable`` takes no split keys. With HBase 2.x,
  name its Thrift2 gateway in the URL (``admin=host:9091``, the server
  started by ``hbase thrift2``) and tables are created pre-split at
  partition boundaries, ``partitionsPerRegion`` partitions a region
  (:func:`split_keys`), through ``THBaseService.createTable``. Without it
  (HBase 1.x, or no Thrift2 gateway) a table starts as one region and HBase
  splits it as it grows.
* Durability: ``SKIP_WAL`` sends mutations with ``writeToWAL=false``.
  ``ASYNC_WAL`` is a table attribute in HBase: it is set through Thrift2
  when ``admin=`` is given; Thrift1 alone cannot set it, so such a table
  uses HBase's default (SYNC_WAL).
* Atomicity: ``mutateRows`` is atomic per row, not per batch. A batch that
  fails part-way may leave a prefix of its rows written (and the put is
  reported failed: at least once, never lost). Every row of one put lies in
  one partition, so usually in one region.
* Truncate: with ``admin=``, Thrift2 ``truncateTable(preserveSplits=true)``;
  Thrift1 has no truncate, so without it the table is disabled, deleted and
  created again with the same families (the info and ID floor are kept).
* Counting: no cheap count exists over Thrift; ``estimate_count`` is None.
* TTL: HBase hides and drops expired cells itself. What it cannot do is
  keep IDs from going back (SPEC C2): once a partition's last rows expire,
  nothing in the table says how high its IDs went, and a restart with a
  clock that went back would give lower ones. So a housekeeping thread
  remembers each TTL queue's newest ID (the ID floor, in the meta table)
  at least twice per TTL, before HBase can hide it.

Errors from Thrift, sockets and HBase are wrapped in :class:`StorageError`
(``raise … from e``); idempotent reads are retried once on a fresh
connection, since the pool drops a connection that failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import happybase
from Hbase_thrift import BatchMutation, Mutation  # loaded by happybase from its Hbase.thrift
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TException
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory, TTransportException

from ..config import Durability, QueueInfo, QueueState
from ..errors import Fenced, InvalidArgument, QueueDisabled, QueueExists, QueueNotFound, StorageError
from ..keys.index import HEAD_LENGTH, is_index_key
from ..keys.timers import is_high_water
from ..message import ROWKEY_LENGTH, key_after, partition_prefix
from ..rpc import idl
from .base import Cell, Storage, housekeeping, keep_id_floor
from .fence import Epoch, Fence, Token, fence_key, next_epoch

logger = logging.getLogger(__name__)

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


def _fence_row(queue: str, partition_id: int) -> bytes:
    return (_KV_ROW + fence_key(queue, partition_id)).encode()


def _cell_deletes(keys: Iterable[bytes], wal: bool) -> dict[int | None, list[BatchMutation]]:
    """Deletes of the cells ``keys``, by the timestamp to send them with (None:
    HBase's clock). HBase removes only the versions stamped at or before a
    delete's own, and a timer's cell is stamped with its due time, maybe in the
    future: timers' cells are deleted in one call stamped with the latest due
    time among them (each has one version, and no key is ever written again)."""
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
    return {None: plain, latest: timers} if timers else {None: plain}


class StorageUnavailable(StorageError):
    """The HBase Thrift server cannot be reached or dropped the connection."""


def split_keys(partitions: int, partitions_per_region: int) -> list[bytes]:
    """Region boundaries that put ``partitions_per_region`` partitions in each region."""
    return [partition_prefix(pid) for pid in range(partitions_per_region, partitions, partitions_per_region)]


class Thrift2Admin:
    """HBase 2.x Thrift2 admin calls (``thrift/hbase2_admin.thrift``).

    A connection is made per call: admin calls are rare, and a long-lived
    idle socket would only be one more thing to fail.
    """

    def __init__(self, address: str, transport: str, protocol: str, timeout: int) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"'admin' must be host:port, got {address!r}")
        self.host, self.port, self.timeout = host, int(port), timeout
        self._idl = idl.load("hbase2_admin.thrift")
        self._transport: Any = {"buffered": TBufferedTransportFactory, "framed": TFramedTransportFactory}[transport]()
        self._protocol = {"binary": TBinaryProtocolFactory, "compact": TCompactProtocolFactory}[protocol]()

    def _call(self, what: str, method: str, *args):
        try:
            client = make_client(
                self._idl.THBaseService,
                self.host,
                self.port,
                proto_factory=self._protocol,
                trans_factory=self._transport,
                timeout=self.timeout,
            )
        except (TException, OSError) as e:
            raise StorageUnavailable(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {e}") from e
        try:
            return getattr(client, method)(*args)
        except (TTransportException, OSError) as e:
            raise StorageUnavailable(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {e}") from e
        except TException as e:
            raise StorageError(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {getattr(e, 'message', e)}") from e
        finally:
            client.close()

    def create_table(self, table: bytes, info: QueueInfo, compression: str) -> None:
        """Create ``table`` pre-split at partition boundaries."""
        t = self._idl
        family = t.TColumnFamilyDescriptor(
            name=FAMILY,
            maxVersions=1,
            timeToLive=info.ttl or None,
            compressionType=getattr(t.TCompressionAlgorithm, compression.upper()),
        )
        durability = {
            Durability.SYNC_WAL: t.TDurability.SYNC_WAL,
            Durability.ASYNC_WAL: t.TDurability.ASYNC_WAL,
            Durability.SKIP_WAL: t.TDurability.SKIP_WAL,
        }[info.durability]
        descriptor = t.TTableDescriptor(
            tableName=t.TTableName(qualifier=table), columns=[family], durability=durability
        )
        splits = split_keys(info.partitions, info.partitions_per_region)
        self._call(f"create table {table!r}", "createTable", descriptor, splits)

    def truncate_table(self, table: bytes) -> None:
        """Delete every row of a disabled table, keeping its regions."""
        self._call(f"truncate table {table!r}", "truncateTable", self._idl.TTableName(qualifier=table), True)


INDEX_ROW_LENGTH = HEAD_LENGTH + 10


def _row_length(key: bytes) -> int:
    """Where a cell key's row ends: after the 12-byte rowkey, or for a topic-index
    entry (topic_index.py) after its ID too, so that each entry is a row of its own."""
    return INDEX_ROW_LENGTH if is_index_key(key) else ROWKEY_LENGTH


def _cell_time(key: bytes) -> int | None:
    """A timer's cell is stamped with its due time, so the family's TTL counts from
    then (timers.py); every other cell gets HBase's write time (None)."""
    if key[0] & 0x80:
        due = int.from_bytes(key[2:10], "big")
        if due < 2**63:
            return due
    return None


class HBaseStorage(Storage):
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
        self._admin = Thrift2Admin(admin, transport, protocol, timeout) if admin else None
        self.prefix, self.compression = prefix, compression
        self._acquire_timeout = timeout / 1000
        self._meta_table = f"{prefix}meta".encode()
        try:
            self._pool = happybase.ConnectionPool(
                pool_size, host=host, port=port, transport=transport, protocol=protocol, timeout=timeout
            )
        except (TException, OSError) as e:
            raise StorageUnavailable(f"cannot connect to the HBase Thrift server at {host}:{port}: {e}") from e
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
            raise StorageUnavailable(f"HBase at {self.url}: {what}: {e}") from e
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
    ) -> None:
        wal = durability != Durability.SKIP_WAL
        by_time: dict[int | None, list[BatchMutation]] = {}
        for key, value in cells:
            cut = _row_length(key)
            mutation = Mutation(column=_COLUMN_PREFIX + key[cut:], value=value, writeToWAL=wal)
            by_time.setdefault(_cell_time(key), []).append(BatchMutation(key[:cut], [mutation]))
        removals = _cell_deletes(deletes, wal)
        if fence is None:  # as few Thrift round trips as can be
            for timestamp, batch in removals.items():
                by_time.setdefault(timestamp, []).extend(batch)
            removals = {}
        with self._connection(f"write {len(cells)} message(s) to {name!r}", name) as connection:
            if fence is not None and high:
                self._reserve(connection, fence, high)
            # One round trip for the batch (happybase's Batch.send); timers'
            # cells, stamped with their due time, in one more per due time.
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

    # -- fences (fence.py) -------------------------------------------------------

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

    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None = None,
        limit: int = 1000,
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
                batch_size=min(rows_wanted, 1000),
                limit=rows_wanted,
            )
            # A message's row holds one cell, its qualifier the topic; a timers' row may hold many.
            cells = [
                (row + column[len(_COLUMN_PREFIX) :], value) for row, data in rows for column, value in data.items()
            ]
            cells.sort()
            return [cell for cell in cells if start_key <= cell[0] < stop_key][:limit]

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

    def write_meta(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        fence: Fence | None = None,
    ) -> None:
        """One ``mutateRows`` round trip for the lot (consumer groups' acks); with a
        fence, the puts, the epoch read back, then the deletes."""
        wal = durability != Durability.SKIP_WAL
        batch = [
            BatchMutation((_KV_ROW + key).encode(), [Mutation(column=_KV_COLUMN, value=value, writeToWAL=wal)])
            for key, value in puts.items()
        ]
        removals = [
            BatchMutation((_KV_ROW + key).encode(), [Mutation(isDelete=True, column=_KV_COLUMN, writeToWAL=wal)])
            for key in deletes
        ]
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
