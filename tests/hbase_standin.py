"""TEST STAND-IN — NOT HBASE, NOT PART OF THE PRODUCT.

An HBase Thrift1 wire-compatible stand-in server, for testing hqueue's HBase
backend on machines where HBase cannot be installed. It serves happybase's
own ``Hbase.thrift`` IDL over real sockets with thriftpy2 and implements the
calls happybase makes, with HBase's semantics as far as hqueue relies on them:

* tables with column families; rows kept sorted by key (bytes order);
* ``mutateRows`` (puts and deletes, a delete of ``family`` alone deletes the
  family's cells of that row), ``checkAndPut``;
* scanners (``scannerOpenWithScan``/``scannerGetList``/``scannerClose``) with
  start/stop rows, column and family filters, ``reversed``, live data;
* a family's ``timeToLive`` hides cells older than the TTL (by cell
  timestamp, which is the server's write time unless given);
* enable/disable (a disabled table refuses reads and writes with IOError,
  and must be disabled before ``deleteTable``), ``AlreadyExists`` on create;
* regions: ``getTableRegions`` lists the regions a table was split into.

On a second port it serves the Thrift2 admin subset hqueue uses
(``thrift/hbase2_admin.thrift``: ``createTable`` with split keys,
``truncateTable`` keeping splits, ``tableExists``), as an HBase 2.x
``hbase thrift2`` gateway would, over the same tables.

Everything is in memory. Usage::

    python -m tests.hbase_standin [--host 127.0.0.1] [--port 0] [--admin-port 0] \
        [--transport buffered|framed] [--protocol binary|compact]

It prints ``LISTENING <thrift1 port> <thrift2 port>`` once ready.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time

import happybase  # noqa: F401  (loads Hbase.thrift as the Hbase_thrift module)
import Hbase_thrift as hb
from sortedcontainers import SortedDict
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory

from hqueue.rpc.idl import load
from hqueue.rpc.threaded import ListeningSocket, ThreadedServer


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Table:
    def __init__(self, families: list[hb.ColumnDescriptor], splits=(), durability=None) -> None:
        self.families = {f.name.rstrip(b":"): f for f in families}
        self.enabled = True
        self.rows: SortedDict = SortedDict()  # row -> {column: (value, ts)}
        self.splits, self.durability = sorted(splits), durability

    def visible(self, column: bytes, ts: int, now: int) -> bool:
        ttl = self.families[column.split(b":", 1)[0]].timeToLive
        return ttl is None or ttl < 0 or ttl == 2147483647 or ts >= now - ttl * 1000


class _Scanner:
    def __init__(self, table: _Table, scan: hb.TScan) -> None:
        self.table, self.columns, self.reversed = table, scan.columns or [], bool(scan.reversed)
        self.start, self.stop = scan.startRow or b"", scan.stopRow or None
        self.last: bytes | None = None

    def rows(self):
        rows = self.table.rows
        if self.reversed:
            # HBase reversed scans: start is the upper bound (inclusive), stop the lower (exclusive).
            high = self.last if self.last is not None else (self.start or None)
            inclusive = self.last is None
            return rows.irange(self.stop or None, high, inclusive=(False, inclusive), reverse=True)
        low = self.last if self.last is not None else self.start
        return rows.irange(low, self.stop, inclusive=(self.last is None, False))

    def wanted(self, column: bytes) -> bool:
        if not self.columns:
            return True
        family = column.split(b":", 1)[0]
        return column in self.columns or family in self.columns or family + b":" in self.columns


class StandInHandler:
    """The Hbase service's calls (the subset happybase and hqueue use)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tables: dict[bytes, _Table] = {}
        self.scanners: dict[int, _Scanner] = {}
        self.ids = itertools.count(1)

    def _table(self, name: bytes, *, enabled: bool = True) -> _Table:
        table = self.tables.get(name)
        if table is None:
            raise hb.IOError(message=f"TableNotFoundException: {name!r}")
        if enabled and not table.enabled:
            raise hb.IOError(message=f"TableNotEnabledException: {name!r} is disabled")
        return table

    # -- admin ------------------------------------------------------------------

    def getTableNames(self):
        with self.lock:
            return sorted(self.tables)

    def createTable(self, tableName, columnFamilies):
        with self.lock:
            if tableName in self.tables:
                raise hb.AlreadyExists(message=f"table {tableName!r} exists")
            if not columnFamilies:
                raise hb.IllegalArgument(message="a table needs a column family")
            self.tables[tableName] = _Table(columnFamilies)

    def deleteTable(self, tableName):
        with self.lock:
            if self._table(tableName, enabled=False).enabled:
                raise hb.IOError(message=f"TableNotDisabledException: {tableName!r}")
            del self.tables[tableName]

    def enableTable(self, tableName):
        with self.lock:
            self._table(tableName, enabled=False).enabled = True

    def disableTable(self, tableName):
        with self.lock:
            self._table(tableName, enabled=False).enabled = False

    def isTableEnabled(self, tableName):
        with self.lock:
            return self._table(tableName, enabled=False).enabled

    def getColumnDescriptors(self, tableName):
        with self.lock:
            return {f.name: f for f in self._table(tableName, enabled=False).families.values()}

    def getTableRegions(self, tableName):
        with self.lock:
            table = self._table(tableName, enabled=False)
            bounds = [b""] + table.splits + [b""]
            return [
                hb.TRegionInfo(
                    startKey=start,
                    endKey=end,
                    id=i,
                    name=tableName + b",%d" % i,
                    version=1,
                    serverName=b"standin",
                    port=0,
                )
                for i, (start, end) in enumerate(itertools.pairwise(bounds))
            ]

    def compact(self, tableNameOrRegionName):
        pass

    def majorCompact(self, tableNameOrRegionName):
        pass

    # -- writes -----------------------------------------------------------------

    def _apply(self, table: _Table, row: bytes, mutations, ts: int) -> None:
        cells = table.rows.get(row) or {}
        for m in mutations:
            family = m.column.split(b":", 1)[0]
            if family not in table.families:
                raise hb.IOError(message=f"NoSuchColumnFamilyException: {family!r}")
            if m.isDelete:  # as HBase: a delete stamped T removes the versions stamped at or before T
                for column in [
                    c for c in cells if c == m.column or (b":" not in m.column and c.split(b":", 1)[0] == family)
                ]:
                    if cells[column][1] <= ts:
                        del cells[column]
            else:
                cells[m.column] = (m.value, ts)
        if cells:
            table.rows[row] = cells
        else:
            table.rows.pop(row, None)

    def mutateRows(self, tableName, rowBatches, attributes):
        self.mutateRowsTs(tableName, rowBatches, None, attributes)

    def mutateRowsTs(self, tableName, rowBatches, timestamp, attributes):
        with self.lock:
            table = self._table(tableName)
            ts = timestamp if timestamp is not None else _now_ms()
            for batch in rowBatches:  # validate first: a bad family rejects the whole call
                for m in batch.mutations:
                    if m.column.split(b":", 1)[0] not in table.families:
                        raise hb.IOError(message=f"NoSuchColumnFamilyException: {m.column!r}")
            for batch in rowBatches:
                self._apply(table, batch.row, batch.mutations, ts)

    def mutateRow(self, tableName, row, mutations, attributes):
        self.mutateRows(tableName, [hb.BatchMutation(row=row, mutations=mutations)], attributes)

    def checkAndPut(self, tableName, row, column, value, mput, attributes):
        with self.lock:
            table = self._table(tableName)
            current = (table.rows.get(row) or {}).get(column)
            if (current[0] if current else None) != value:
                return False
            self._apply(table, row, [mput], _now_ms())
            return True

    def deleteAllRow(self, tableName, row, attributes):
        with self.lock:
            self._table(tableName).rows.pop(row, None)

    # -- reads ------------------------------------------------------------------

    def _result(self, table: _Table, row: bytes, cells: dict, wanted, now: int):
        columns = {
            c: hb.TCell(value=v, timestamp=ts)
            for c, (v, ts) in cells.items()
            if wanted(c) and table.visible(c, ts, now)
        }
        return hb.TRowResult(row=row, columns=columns) if columns else None

    def getRowWithColumns(self, tableName, row, columns, attributes):
        with self.lock:
            table = self._table(tableName)
            cells = table.rows.get(row)
            if cells is None:
                return []
            scanner = _Scanner(table, hb.TScan(columns=columns))
            result = self._result(table, row, cells, scanner.wanted, _now_ms())
            return [result] if result else []

    def getRow(self, tableName, row, attributes):
        return self.getRowWithColumns(tableName, row, None, attributes)

    def scannerOpenWithScan(self, tableName, scan, attributes):
        with self.lock:
            scanner_id = next(self.ids)
            self.scanners[scanner_id] = _Scanner(self._table(tableName), scan)
            return scanner_id

    def scannerGetList(self, id, nbRows):
        with self.lock:
            scanner = self.scanners.get(id)
            if scanner is None:
                raise hb.IllegalArgument(message=f"scanner ID {id} is invalid")
            if not scanner.table.enabled:
                raise hb.IOError(message="TableNotEnabledException")
            results, now = [], _now_ms()
            for row in scanner.rows():
                scanner.last = row
                result = self._result(scanner.table, row, scanner.table.rows[row], scanner.wanted, now)
                if result:
                    results.append(result)
                    if len(results) >= nbRows:
                        break
            return results

    def scannerGet(self, id):
        return self.scannerGetList(id, 1)

    def scannerClose(self, id):
        with self.lock:
            if self.scanners.pop(id, None) is None:
                raise hb.IllegalArgument(message=f"scanner ID {id} is invalid")


class Thrift2AdminHandler:
    """THBaseService's admin subset (HBase 2.x thrift2), over the same tables."""

    def __init__(self, thrift1: StandInHandler) -> None:
        self.thrift1, self.idl = thrift1, load("hbase2_admin.thrift")

    def tableExists(self, tableName):
        with self.thrift1.lock:
            return tableName.qualifier in self.thrift1.tables

    def createTable(self, desc, splitKeys):
        name = desc.tableName.qualifier
        with self.thrift1.lock:
            if name in self.thrift1.tables:
                raise self.idl.TIOError(message=f"TableExistsException: {name!r}")
            families = [
                hb.ColumnDescriptor(
                    name=f.name + b":", maxVersions=f.maxVersions or 1, timeToLive=f.timeToLive if f.timeToLive else -1
                )
                for f in desc.columns or []
            ]
            if not families:
                raise self.idl.TIOError(message="a table needs a column family")
            self.thrift1.tables[name] = _Table(families, splitKeys or (), desc.durability)

    def truncateTable(self, tableName, preserveSplits):
        with self.thrift1.lock:
            table = self.thrift1.tables.get(tableName.qualifier)
            if table is None:
                raise self.idl.TIOError(message=f"TableNotFoundException: {tableName.qualifier!r}")
            if table.enabled:
                raise self.idl.TIOError(message=f"TableNotDisabledException: {tableName.qualifier!r}")
            table.rows.clear()
            if not preserveSplits:
                table.splits = []
            table.enabled = True  # HBase enables a table again after truncating it


def serve(host: str, port: int, admin_port: int, transport: str, protocol: str) -> None:
    transports = {"buffered": TBufferedTransportFactory, "framed": TFramedTransportFactory}
    protocols = {"binary": TBinaryProtocolFactory, "compact": TCompactProtocolFactory}

    def server(service, handler, port: int) -> ThreadedServer:
        sock = ListeningSocket.bound(host, port)
        return ThreadedServer(service, handler, sock, transport=transports[transport](), protocol=protocols[protocol]())

    thrift1 = StandInHandler()
    main_server = server(hb.Hbase, thrift1, port)
    admin = server(load("hbase2_admin.thrift").THBaseService, Thrift2AdminHandler(thrift1), admin_port)
    admin.serve_in_thread("standin-thrift2")
    print(f"LISTENING {main_server.port} {admin.port}", flush=True)
    main_server.serve()


def main() -> None:
    parser = argparse.ArgumentParser(description="TEST STAND-IN for an HBase Thrift1 server (not HBase)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--admin-port", type=int, default=0, help="Thrift2 admin port")
    parser.add_argument("--transport", choices=["buffered", "framed"], default="buffered")
    parser.add_argument("--protocol", choices=["binary", "compact"], default="binary")
    args = parser.parse_args()
    serve(args.host, args.port, args.admin_port, args.transport, args.protocol)


if __name__ == "__main__":
    main()
