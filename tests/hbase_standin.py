"""TEST STAND-IN — NOT HBASE, NOT PART OF THE PRODUCT.

An HBase Thrift1 wire-compatible stand-in server, for testing hqueue's HBase
backend on machines where HBase cannot be installed. It serves happybase's
own ``Hbase.thrift`` IDL over real sockets with thriftpy2 and implements the
calls happybase makes, with HBase's semantics as far as hqueue relies on them:

* tables with column families; rows kept sorted by key (bytes order);
  versioned cells, deletes by timestamp, time ranges and TTL as
  tests/hbase_standin_cells.py describes (no delete markers: that is where
  it differs from HBase);
* writes: ``mutateRow(s)(Ts)`` (puts and deletes, in HBase's order: a
  ``mutateRows`` call puts before it deletes, a ``mutateRow`` call deletes
  first), ``checkAndPut``, ``atomicIncrement``/``increment(Rows)`` (64-bit
  big-endian counters), ``append``, ``deleteAll(Row)(Ts)``;
* reads: ``get``, ``getVer(Ts)``, ``getRow(s)(WithColumns)(Ts)``;
* scanners (``scannerOpenWithScan`` and the older ``scannerOpen*`` calls,
  ``scannerGetList``/``scannerClose``) with start/stop rows, columns and
  families, a time range, ``reversed``, ``sortColumns``, ``batchSize``
  (a wide row comes in parts), a subset of HBase's filter language
  (tests/hbase_standin_filters.py), live data;
* enable/disable (a disabled table refuses reads and writes with IOError,
  and must be disabled before ``deleteTable``), ``AlreadyExists`` on create;
* regions: ``getTableRegions`` lists the regions a table was split into;
* a call the stand-in lacks (``getRowOrBefore``, ``getRegionInfo``) answers
  ``TApplicationException(UNKNOWN_METHOD)``, and a failure that is not an
  IDL exception ``INTERNAL_ERROR``, as a Java Thrift server does: the
  connection stays open.

happybase's own API suite (pinned, vendored in tests/storage/happybase_api/)
runs against the stand-in in tests/storage/test_happybase_api.py.

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
import functools
import itertools
import struct
import threading
import time

import happybase  # noqa: F401  (loads Hbase.thrift as the Hbase_thrift module)
import Hbase_thrift as hb
from happybase.util import bytes_increment
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.thrift import TApplicationException, TException
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory

from hqueue.rpc.connections import ListeningSocket
from hqueue.rpc.idl import load
from hqueue.rpc.threaded import ThreadedServer

from .hbase_standin_cells import LATEST, Scanner, Table, Wanted, parse_column, row_result

#: Milliseconds this stand-in's clock is ahead of the machine's (--clock-ahead-ms): a
#: region server whose clock is not the hqueue server's.
CLOCK_AHEAD_MS = 0


def _now_ms() -> int:
    return int(time.time() * 1000) + CLOCK_AHEAD_MS


def _unknown(service: str, name: str, *args) -> None:
    raise TApplicationException(
        TApplicationException.UNKNOWN_METHOD, f"{service}.{name}: not implemented by the HBase stand-in (not HBase)"
    )


class Answering:
    """A handler as the processor sees it: every call of the service gets an answer.

    A call the stand-in lacks answers ``TApplicationException(UNKNOWN_METHOD)``,
    and an error that is not one of the IDL's answers ``INTERNAL_ERROR``, as a
    Java Thrift server (HBase's) does, instead of closing the connection.
    """

    def __init__(self, service, handler) -> None:
        self._service, self._handler = service, handler

    def __getattr__(self, name: str):
        if name not in self._service.thrift_services:
            raise AttributeError(name)
        call = getattr(self._handler, name, None)
        if call is None:
            return functools.partial(_unknown, self._service.__name__, name)

        @functools.wraps(call)
        def answered(*args):
            try:
                return call(*args)
            except TException:
                raise
            except Exception as e:
                message = f"Internal error processing {name}: {type(e).__name__}: {e}"
                raise TApplicationException(TApplicationException.INTERNAL_ERROR, message) from e

        return answered


class StandInHandler:
    """The Hbase service's calls (what happybase and hqueue use, and their relatives)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tables: dict[bytes, Table] = {}
        self.scanners: dict[int, Scanner] = {}
        self.ids = itertools.count(1)

    def _table(self, name: bytes, *, enabled: bool = True) -> Table:
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
            self.tables[tableName] = Table(columnFamilies)

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

    @staticmethod
    def _split(table: Table, mutations, *, strict: bool) -> tuple[list, list]:
        """Puts and deletes, checked first: one bad family rejects the whole call.

        A put naming a family without a qualifier is refused by ``mutateRows``
        and skipped by ``mutateRow``, as HBase's Thrift1 handler does."""
        table.check_families(parse_column(m.column)[0] for m in mutations)
        puts = [m for m in mutations if not m.isDelete and parse_column(m.column)[1] is not None]
        if strict and len(puts) + sum(1 for m in mutations if m.isDelete) < len(mutations):
            raise hb.IllegalArgument(message="Invalid famAndQf provided.")
        return puts, [m for m in mutations if m.isDelete]

    def mutateRowsTs(self, tableName, rowBatches, timestamp, attributes):
        """HBase's order: every put of the call first, then every delete."""
        with self.lock:
            table = self._table(tableName)
            ts = timestamp if timestamp is not None and timestamp != LATEST else _now_ms()
            split = [(b.row, *self._split(table, b.mutations, strict=True)) for b in rowBatches]
            for row, puts, _ in split:
                for m in puts:
                    table.put(row, m.column, m.value or b"", ts)
            for row, _, deletes in split:
                for m in deletes:
                    table.delete(row, m.column, ts)

    def mutateRows(self, tableName, rowBatches, attributes):
        self.mutateRowsTs(tableName, rowBatches, None, attributes)

    def mutateRowTs(self, tableName, row, mutations, timestamp, attributes):
        """HBase's order: the row's deletes first, then its puts."""
        with self.lock:
            table = self._table(tableName)
            ts = timestamp if timestamp is not None and timestamp != LATEST else _now_ms()
            puts, deletes = self._split(table, mutations, strict=False)
            for m in deletes:
                table.delete(row, m.column, ts)
            for m in puts:
                table.put(row, m.column, m.value or b"", ts)

    def mutateRow(self, tableName, row, mutations, attributes):
        self.mutateRowTs(tableName, row, mutations, None, attributes)

    def checkAndPut(self, tableName, row, column, value, mput, attributes):
        with self.lock:
            table = self._table(tableName)
            current = table.latest(row, column, _now_ms())
            if (current[1] if current else None) != value:
                return False
            self.mutateRow(tableName, row, [mput], attributes)
            return True

    def deleteAllTs(self, tableName, row, column, timestamp, attributes):
        self.mutateRowTs(tableName, row, [hb.Mutation(isDelete=True, column=column)], timestamp, attributes)

    def deleteAll(self, tableName, row, column, attributes):
        self.deleteAllTs(tableName, row, column, None, attributes)

    def deleteAllRowTs(self, tableName, row, timestamp, attributes):
        with self.lock:
            ts = timestamp if timestamp is not None and timestamp != LATEST else _now_ms()
            self._table(tableName).delete_row(row, ts)

    def deleteAllRow(self, tableName, row, attributes):
        self.deleteAllRowTs(tableName, row, None, attributes)

    def atomicIncrement(self, tableName, row, column, value):
        """A signed 64-bit big-endian counter (a missing cell counts as 0); an amount
        of 0 reads it without writing. The new value is stamped now, or with the
        current value's timestamp if that is later (replacing it): never behind it."""
        with self.lock:
            table, now = self._table(tableName), _now_ms()
            column = column if parse_column(column)[1] is not None else column + b":"
            table.check_families([parse_column(column)[0]])
            current = table.latest(row, column, now)
            if current and len(current[1]) != 8:
                raise hb.IOError(
                    message=f"DoNotRetryIOException: Field is not a long, it's {len(current[1])} bytes wide"
                )
            total = (struct.unpack(">q", current[1])[0] if current else 0) + value
            total = (total + 2**63) % 2**64 - 2**63  # a Java long's overflow
            if value:
                table.put(row, column, struct.pack(">q", total), max(now, current[0]) if current else now)
            return total

    def increment(self, increment):
        self.atomicIncrement(increment.table, increment.row, increment.column, increment.ammount)

    def incrementRows(self, increments):
        for increment in increments:
            self.increment(increment)

    def append(self, append):
        with self.lock:
            table, now, cells = self._table(append.table), _now_ms(), []
            for column, value in zip(append.columns, append.values, strict=True):
                current = table.latest(append.row, column, now)
                ts = max(now, current[0]) if current else now
                table.put(append.row, column, (current[1] if current else b"") + value, ts)
                cells.append(hb.TCell(value=(current[1] if current else b"") + value, timestamp=ts))
            return cells

    # -- reads ------------------------------------------------------------------

    def getRowsWithColumnsTs(self, tableName, rows, columns, timestamp, attributes):
        with self.lock:
            table, wanted, now = self._table(tableName), Wanted(columns), _now_ms()
            table.check_families(wanted.named_families())
            before = timestamp if timestamp is not None else LATEST
            found = [(row, table.read(row, wanted, now, before)) for row in rows]
            return [row_result(row, list(cells.items()), False) for row, cells in found if cells]

    def getRowsWithColumns(self, tableName, rows, columns, attributes):
        return self.getRowsWithColumnsTs(tableName, rows, columns, None, attributes)

    def getRowsTs(self, tableName, rows, timestamp, attributes):
        return self.getRowsWithColumnsTs(tableName, rows, None, timestamp, attributes)

    def getRows(self, tableName, rows, attributes):
        return self.getRowsWithColumnsTs(tableName, rows, None, None, attributes)

    def getRowWithColumnsTs(self, tableName, row, columns, timestamp, attributes):
        return self.getRowsWithColumnsTs(tableName, [row], columns, timestamp, attributes)

    def getRowWithColumns(self, tableName, row, columns, attributes):
        return self.getRowsWithColumnsTs(tableName, [row], columns, None, attributes)

    def getRowTs(self, tableName, row, timestamp, attributes):
        return self.getRowsWithColumnsTs(tableName, [row], None, timestamp, attributes)

    def getRow(self, tableName, row, attributes):
        return self.getRowsWithColumnsTs(tableName, [row], None, None, attributes)

    def getVerTs(self, tableName, row, column, timestamp, numVersions, attributes):
        if numVersions is None or numVersions < 1:
            raise hb.IOError(message=f"IllegalArgumentException: numVersions {numVersions} must be >= 1")
        with self.lock:
            table, wanted = self._table(tableName), Wanted([column])
            table.check_families(wanted.named_families())
            before = timestamp if timestamp is not None else LATEST
            cells = table.read(row, wanted, _now_ms(), before, numVersions)
            return [hb.TCell(value=v, timestamp=t) for versions in cells.values() for t, v in versions]

    def getVer(self, tableName, row, column, numVersions, attributes):
        return self.getVerTs(tableName, row, column, None, numVersions, attributes)

    def get(self, tableName, row, column, attributes):
        return self.getVerTs(tableName, row, column, None, 1, attributes)

    # -- scanners ---------------------------------------------------------------

    def scannerOpenWithScan(self, tableName, scan, attributes):
        with self.lock:
            scanner = Scanner(self._table(tableName), scan)
            scanner_id = next(self.ids)
            self.scanners[scanner_id] = scanner
            return scanner_id

    def scannerOpenWithStopTs(self, tableName, startRow, stopRow, columns, timestamp, attributes):
        scan = hb.TScan(startRow=startRow, stopRow=stopRow or None, columns=columns, timestamp=timestamp)
        return self.scannerOpenWithScan(tableName, scan, attributes)

    def scannerOpenWithStop(self, tableName, startRow, stopRow, columns, attributes):
        return self.scannerOpenWithStopTs(tableName, startRow, stopRow, columns, None, attributes)

    def scannerOpenTs(self, tableName, startRow, columns, timestamp, attributes):
        return self.scannerOpenWithStopTs(tableName, startRow, None, columns, timestamp, attributes)

    def scannerOpen(self, tableName, startRow, columns, attributes):
        return self.scannerOpenWithStopTs(tableName, startRow, None, columns, None, attributes)

    def scannerOpenWithPrefix(self, tableName, startAndPrefix, columns, attributes):
        stop = bytes_increment(startAndPrefix) if startAndPrefix else None
        return self.scannerOpenWithStopTs(tableName, startAndPrefix, stop, columns, None, attributes)

    def scannerGetList(self, id, nbRows):
        with self.lock:
            scanner = self.scanners.get(id)
            if scanner is None:
                raise hb.IllegalArgument(message=f"scanner ID {id} is invalid")
            if not scanner.table.enabled:
                raise hb.IOError(message="TableNotEnabledException")
            return scanner.next(nbRows, _now_ms())

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
            self.thrift1.tables[name] = Table(families, splitKeys or (), desc.durability)

    def truncateTable(self, tableName, preserveSplits):
        with self.thrift1.lock:
            table = self.thrift1.tables.get(tableName.qualifier)
            if table is None:
                raise self.idl.TIOError(message=f"TableNotFoundException: {tableName.qualifier!r}")
            if table.enabled:
                raise self.idl.TIOError(message=f"TableNotDisabledException: {tableName.qualifier!r}")
            table.rows.clear()
            table.markers.clear()
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
    main_server = server(hb.Hbase, Answering(hb.Hbase, thrift1), port)
    thrift2 = load("hbase2_admin.thrift").THBaseService
    admin = server(thrift2, Answering(thrift2, Thrift2AdminHandler(thrift1)), admin_port)
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
    parser.add_argument("--clock-ahead-ms", type=int, default=0, help="this clock ahead of the machine's")
    args = parser.parse_args()
    global CLOCK_AHEAD_MS
    CLOCK_AHEAD_MS = args.clock_ahead_ms
    serve(args.host, args.port, args.admin_port, args.transport, args.protocol)


if __name__ == "__main__":
    main()
