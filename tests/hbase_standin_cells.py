"""TEST STAND-IN — NOT HBASE. The tables of tests/hbase_standin.py, in memory.

What a table holds and how reads see it, with HBase's semantics as far as its
Thrift1 gateway shows them:

* a cell is ``(row, family:qualifier, timestamp) -> value``; a column keeps
  its newest ``maxVersions`` versions (the family's; HBase drops the others
  at its next flush or compaction, the stand-in at once); a put with the
  timestamp of an existing version replaces its value;
* a column is named as HBase's ``CellUtil.parseColumn`` reads it: ``b"f"`` is
  the family ``f`` (every qualifier), ``b"f:"`` the column with the empty
  qualifier, ``b"f:q"`` the column ``q``;
* a delete stamped T removes the versions stamped at or before T (of a
  column, a family, or a whole row) and, as HBase's delete marker does
  until a major compaction, hides a version written *later* with a
  timestamp at or before T (a delete and a put of the same column in the
  same millisecond of HBase's clock: the put is lost); the stand-in keeps
  its markers until the table is deleted or truncated;
* scanners read on from the last row they returned, so they see live data;
  ``batchSize`` hands a wide row out in parts, ``sortColumns`` as a list;
* reads take a time range ``[0, before)`` (the Thrift1 ``...Ts`` calls and
  ``TScan.timestamp``) and a number of versions; a family's ``timeToLive``
  (seconds) hides versions older than the TTL.
"""

from __future__ import annotations

from collections.abc import Iterable

import happybase  # noqa: F401  (loads Hbase.thrift as the Hbase_thrift module)
import Hbase_thrift as hb
from sortedcontainers import SortedDict

from .hbase_standin_filters import parse_filter

#: HBase's ``HConstants.LATEST_TIMESTAMP``: a read with it sees every version.
LATEST = 2**63 - 1
_FOREVER = (None, -1, 2147483647)  # the timeToLive values that mean "no TTL"

#: A column's versions, newest first: ``[(timestamp, value), ...]``.
Versions = list[tuple[int, bytes]]


def parse_column(column: bytes) -> tuple[bytes, bytes | None]:
    """``(family, qualifier)``; the qualifier is None when ``column`` names a whole family."""
    family, colon, qualifier = column.partition(b":")
    return family, (qualifier if colon else None)


class Wanted:
    """Which columns a read asks for (none named: all of them)."""

    def __init__(self, columns: Iterable[bytes] | None) -> None:
        self.families: set[bytes] = set()
        self.columns: set[bytes] = set()
        for column in columns or ():
            family, qualifier = parse_column(column)
            if qualifier is None:
                self.families.add(family)
            else:
                self.columns.add(family + b":" + qualifier)

    def __call__(self, column: bytes) -> bool:
        if not self.families and not self.columns:
            return True
        return column in self.columns or parse_column(column)[0] in self.families

    def named_families(self) -> set[bytes]:
        return self.families | {parse_column(c)[0] for c in self.columns}


class Table:
    """One table: its families, and its rows sorted by key (bytes order)."""

    def __init__(self, families: list[hb.ColumnDescriptor], splits=(), durability=None) -> None:
        self.families = {f.name.rstrip(b":"): f for f in families}
        self.enabled = True
        self.rows: SortedDict = SortedDict()  # row -> {column: Versions}
        #: Delete markers: (row, column or family) -> the latest delete's timestamp.
        self.markers: dict[tuple[bytes, bytes], int] = {}
        self.splits, self.durability = sorted(splits), durability

    def check_families(self, families: Iterable[bytes]) -> None:
        for family in families:
            if family not in self.families:
                raise hb.IOError(message=f"NoSuchColumnFamilyException: {family!r}")

    # -- writes -----------------------------------------------------------------

    def put(self, row: bytes, column: bytes, value: bytes, ts: int) -> None:
        family, _ = parse_column(column)
        self.check_families([family])
        if ts <= max(self.markers.get((row, column), -1), self.markers.get((row, family), -1)):
            return  # under a delete marker: HBase acknowledges the put and never shows it
        versions = self.rows.setdefault(row, {}).setdefault(column, [])
        kept = [(t, v) for t, v in versions if t != ts] + [(ts, value)]
        kept.sort(key=lambda version: -version[0])
        versions[:] = kept[: max(1, self.families[family].maxVersions or 1)]

    def delete(self, row: bytes, column: bytes, ts: int) -> None:
        """Remove the versions stamped at or before ``ts`` of ``column`` (a family: all its columns)."""
        family, qualifier = parse_column(column)
        self.check_families([family])
        mark = (row, column if qualifier is not None else family)
        self.markers[mark] = max(self.markers.get(mark, -1), ts)
        cells = self.rows.get(row)
        if cells is None:
            return
        for name in [c for c in cells if c == column or (qualifier is None and parse_column(c)[0] == family)]:
            cells[name] = [(t, v) for t, v in cells[name] if t > ts]
            if not cells[name]:
                del cells[name]
        if not cells:
            del self.rows[row]

    def delete_row(self, row: bytes, ts: int) -> None:
        for family in list(self.families):
            self.delete(row, family, ts)

    # -- reads ------------------------------------------------------------------

    def _live(self, family: bytes, ts: int, before: int, now: int) -> bool:
        ttl = self.families[family].timeToLive
        return ts < before and (ttl in _FOREVER or ttl < 0 or ts >= now - ttl * 1000)

    def read(self, row: bytes, wanted: Wanted, now: int, before: int = LATEST, versions: int = 1) -> dict:
        """The row's wanted columns, sorted by name: ``{column: Versions}`` (the newest ``versions``)."""
        cells = self.rows.get(row) or {}
        found = {}
        for column in sorted(c for c in cells if wanted(c)):
            family, _ = parse_column(column)
            live = [(t, v) for t, v in cells[column] if self._live(family, t, before, now)][:versions]
            if live:
                found[column] = live
        return found

    def latest(self, row: bytes, column: bytes, now: int) -> tuple[int, bytes] | None:
        """The newest live version of one column, if any."""
        versions = self.read(row, Wanted([column]), now).get(column)
        return versions[0] if versions else None


def row_result(row: bytes, cells: list[tuple[bytes, Versions]], sort: bool) -> hb.TRowResult:
    if sort:
        columns = [hb.TColumn(columnName=c, cell=hb.TCell(value=v[0][1], timestamp=v[0][0])) for c, v in cells]
        return hb.TRowResult(row=row, sortedColumns=columns)
    return hb.TRowResult(row=row, columns={c: hb.TCell(value=v[0][1], timestamp=v[0][0]) for c, v in cells})


class Scanner:
    """A scanner: it reads on from the last row it returned, so it sees live data."""

    def __init__(self, table: Table, scan: hb.TScan) -> None:
        self.table, self.wanted = table, Wanted(scan.columns)
        table.check_families(self.wanted.named_families())
        self.filter = parse_filter(scan.filterString)
        self.before = scan.timestamp if scan.timestamp is not None else LATEST
        self.batch = scan.batchSize if scan.batchSize and scan.batchSize > 0 else None
        self.sort, self.reversed = bool(scan.sortColumns), bool(scan.reversed)
        self.start, self.stop = scan.startRow or b"", scan.stopRow or None
        self.last: bytes | None = None
        self.pending: list[hb.TRowResult] = []  # the rest of a row cut by batchSize

    def _rows(self):
        rows = self.table.rows
        if self.reversed:
            # HBase reversed scans: start is the upper bound (inclusive), stop the lower (exclusive).
            high = self.last if self.last is not None else (self.start or None)
            inclusive = self.last is None
            return rows.irange(self.stop or None, high, inclusive=(False, inclusive), reverse=True)
        low = self.last if self.last is not None else self.start
        return rows.irange(low, self.stop, inclusive=(self.last is None, False))

    def _next_row(self, now: int) -> list[hb.TRowResult]:
        for row in self._rows():
            self.last = row
            cells = list(self.table.read(row, self.wanted, now, self.before).items())
            cells = self.filter(row, cells) if self.filter else cells
            if cells:
                size = self.batch or len(cells)
                return [row_result(row, cells[i : i + size], self.sort) for i in range(0, len(cells), size)]
        return []

    def next(self, count: int, now: int) -> list[hb.TRowResult]:
        results: list[hb.TRowResult] = []
        while len(results) < count:
            if not self.pending:
                self.pending = self._next_row(now)
                if not self.pending:
                    break
            results.append(self.pending.pop(0))
        return results
