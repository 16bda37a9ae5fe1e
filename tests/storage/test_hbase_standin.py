"""What tests/hbase_standin.py (a TEST STAND-IN for HBase's Thrift1 gateway, not
HBase) does beyond happybase's own suite (test_happybase_api.py): how it
answers calls it lacks or cannot run, and the scan options hqueue's backend
could use that happybase's suite does not check.
"""

from __future__ import annotations

import itertools

import happybase
import Hbase_thrift as hb
import pytest
import thriftpy2
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TBufferedTransportFactory

pytestmark = pytest.mark.hbase  # the stand-in itself

_names = itertools.count(1)


@pytest.fixture
def connection(hbase_standin):
    host, port = hbase_standin[0].split(":")
    connection = happybase.Connection(host, int(port), table_prefix=f"standin{next(_names)}")
    connection.create_table("t", {"cf1": {"max_versions": 3}, "cf2": {}})
    yield connection
    connection.close()


def raw_client(address: str, service=hb.Hbase):
    host, port = address.split(":")
    return make_client(service, host, int(port), trans_factory=TBufferedTransportFactory(), timeout=10_000)


def test_a_call_the_standin_lacks_answers_unknown_method_and_the_connection_stays_open(hbase_standin):
    client = raw_client(hbase_standin[0])
    try:
        with pytest.raises(TApplicationException) as info:
            client.getRowOrBefore(b"t", b"row", b"cf1")
        assert info.value.type == TApplicationException.UNKNOWN_METHOD
        assert "getRowOrBefore" in info.value.message and "stand-in" in info.value.message
        assert isinstance(client.getTableNames(), list)  # the same connection answers on
    finally:
        client.close()


def test_a_method_no_idl_of_hbase_has_answers_unknown_method(hbase_standin, tmp_path):
    idl = tmp_path / "odd.thrift"
    idl.write_text("service Hbase {\n  void noSuchCall()\n  list<binary> getTableNames()\n}\n")
    odd = thriftpy2.load(str(idl), module_name="odd_thrift")
    client = raw_client(hbase_standin[0], odd.Hbase)
    try:
        with pytest.raises(TApplicationException) as info:
            client.noSuchCall()
        assert info.value.type == TApplicationException.UNKNOWN_METHOD
        assert isinstance(client.getTableNames(), list)
    finally:
        client.close()


def test_a_call_that_fails_inside_answers_internal_error_and_the_connection_stays_open(hbase_standin, connection):
    client = raw_client(hbase_standin[0])
    try:
        with pytest.raises(TApplicationException) as info:
            client.mutateRows(connection.table("t").name, None, {})  # no row batches: not a list
        assert info.value.type == TApplicationException.INTERNAL_ERROR
        assert "mutateRows" in info.value.message
        assert connection.table("t").name in client.getTableNames()
    finally:
        client.close()


def test_a_filter_the_standin_lacks_answers_internal_error(connection):
    table = connection.table("t")
    table.put(b"r", {b"cf1:a": b"1"})
    for lacking in (b"PageFilter (1)", b"WHILE PrefixFilter ('r')", b"PrefixFilter ('r'"):
        with pytest.raises(TApplicationException) as info:
            list(table.scan(filter=lacking))
        assert info.value.type == TApplicationException.INTERNAL_ERROR
    assert dict(table.scan()) == {b"r": {b"cf1:a": b"1"}}


def test_filters_keep_what_hbase_keeps(connection):
    table = connection.table("t")
    table.put(b"a1", {b"cf1:q": b"x", b"cf1:r": b"yes"})
    table.put(b"a2", {b"cf1:r": b"no"})
    table.put(b"b1", {b"cf1:q": b"z", b"cf2:s": b"yes"})

    def rows(text: bytes):
        return dict(table.scan(filter=text))

    assert set(rows(b"PrefixFilter ('a')")) == {b"a1", b"a2"}
    # SingleColumnValueFilter: a row without the column passes unless filterIfMissing.
    assert set(rows(b"SingleColumnValueFilter ('cf1', 'q', =, 'binary:x')")) == {b"a1", b"a2"}
    assert set(rows(b"SingleColumnValueFilter ('cf1', 'q', =, 'binary:x', true, true)")) == {b"a1"}
    assert rows(b"ValueFilter (=, 'binary:yes')") == {b"a1": {b"cf1:r": b"yes"}, b"b1": {b"cf2:s": b"yes"}}
    assert rows(b"QualifierFilter (=, 'binary:q') AND PrefixFilter ('b')") == {b"b1": {b"cf1:q": b"z"}}
    assert set(rows(b"PrefixFilter ('b') OR ValueFilter (=, 'substring:NO')")) == {b"a2", b"b1"}
    assert set(rows(b"SKIP ValueFilter (!=, 'binary:no')")) == {b"a1", b"b1"}
    assert rows(b"KeyOnlyFilter () AND FirstKeyOnlyFilter ()") == {
        b"a1": {b"cf1:q": b""},
        b"a2": {b"cf1:r": b""},
        b"b1": {b"cf1:q": b""},
    }
    assert set(rows(b"RowFilter (>=, 'binary:a2') AND (FamilyFilter (=, 'binary:cf2'))")) == {b"b1"}


def test_scan_batching_hands_a_wide_row_out_in_parts(connection):
    table = connection.table("t")
    table.put(b"wide", {b"cf1:c%d" % i: b"%d" % i for i in range(5)})
    parts = list(table.scan(scan_batching=2, batch_size=1))
    assert [key for key, _ in parts] == [b"wide"] * 3
    assert [sorted(data) for _, data in parts] == [[b"cf1:c0", b"cf1:c1"], [b"cf1:c2", b"cf1:c3"], [b"cf1:c4"]]


def test_the_older_scanner_calls_take_stop_rows_and_time_ranges(hbase_standin, connection):
    table = connection.table("t")
    for i in range(5):
        table.put(b"r%d" % i, {b"cf1:a": b"old"}, timestamp=1000)
        table.put(b"r%d" % i, {b"cf1:a": b"new"})
    host, port = hbase_standin[0].split(":")
    old = happybase.Connection(host, int(port), table_prefix=connection.table_prefix, compat="0.90")
    try:
        t = old.table("t")  # compat 0.90: scannerOpen, scannerOpenWithStop, scannerOpenTs, scannerOpenWithStopTs
        assert [k for k, _ in t.scan(row_start=b"r3")] == [b"r3", b"r4"]
        assert [k for k, _ in t.scan(row_start=b"r1", row_stop=b"r3")] == [b"r1", b"r2"]
        assert {d[b"cf1:a"] for _, d in t.scan(row_start=b"r0", timestamp=2000)} == {b"old"}
        assert len(list(t.scan(row_start=b"r0", row_stop=b"r2", timestamp=1000))) == 0  # [0, ts): ts excluded
    finally:
        old.close()


def test_a_family_keeps_its_newest_max_versions(connection):
    table = connection.table("t")
    for ts in range(1, 6):
        table.put(b"v", {b"cf1:a": b"%d" % ts}, timestamp=ts)
    assert table.cells(b"v", b"cf1:a", versions=10, include_timestamp=True) == [(b"5", 5), (b"4", 4), (b"3", 3)]
    table.delete(b"v", [b"cf1:a"], timestamp=4)  # the versions stamped at or before 4
    assert table.cells(b"v", b"cf1:a", versions=10) == [b"5"]
    table.put(b"v", {b"cf1:": b"empty qualifier"})
    assert table.row(b"v", columns=[b"cf1:"]) == {b"cf1:": b"empty qualifier"}  # "cf1:" is a column, not the family


def test_a_counter_that_is_not_8_bytes_is_an_io_error(connection):
    table = connection.table("t")
    table.put(b"c", {b"cf1:n": b"abc"})
    with pytest.raises(hb.IOError, match="not a long"):
        table.counter_inc(b"c", b"cf1:n")
    assert table.counter_inc(b"c", b"cf1:m", 2**63 - 1) == 2**63 - 1
    assert table.counter_inc(b"c", b"cf1:m") == -(2**63)  # a Java long wraps
