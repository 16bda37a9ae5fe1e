"""What only the HBase backend does: regions, URLs, transports, lost servers.

Runs against tests/hbase_standin.py (a TEST STAND-IN, not HBase).
"""

import socket

import happybase
import pytest

from hqueue import HQueue, HQueueAdmin, Message, StorageError
from hqueue.config import QueueInfo
from hqueue.ids import MessageID, wall_clock_ms
from hqueue.keys.index import HASHES, index_cells
from hqueue.keys.timers import timer_cell_keys
from hqueue.message import cell_keys, partition_prefix
from hqueue.storage import open_storage
from hqueue.storage.hbase import HBaseStorage, StorageUnavailable, split_keys
from hqueue.storage.hbase.cells import _cell_time

from ..conftest import hbase_url, start_hbase_standin
from ..processes import wait_for

pytestmark = pytest.mark.hbase  # the HBase backend on the stand-in


def regions(address: str, table: bytes) -> list[bytes]:
    host, port = address.split(":")
    connection = happybase.Connection(host, int(port))
    try:
        return [r["start_key"] for r in connection.table(table).regions()]
    finally:
        connection.close()


def test_split_keys_put_partitions_per_region_in_each_region():
    assert split_keys(8, 1) == [partition_prefix(p) for p in range(1, 8)]
    assert split_keys(32, 4) == [partition_prefix(p) for p in (4, 8, 12, 16, 20, 24, 28)]
    assert split_keys(3, 4) == []


def test_with_thrift2_tables_are_pre_split_and_truncate_keeps_the_splits(hbase_standin):
    thrift1, thrift2 = hbase_standin
    storage = open_storage(hbase_url(thrift1, thrift2))
    try:
        storage.create_queue(QueueInfo("crawl", 32, config={"hbase.hqueue.partitionsPerRegion": "4"}))
        table = storage.prefix.encode() + b"q_crawl"
        expected = [b""] + [partition_prefix(p) for p in range(4, 32, 4)]
        assert regions(thrift1, table) == expected
        storage.truncate_queue("crawl")
        assert regions(thrift1, table) == expected
    finally:
        storage.close()


def test_without_thrift2_a_table_starts_as_one_region(hbase_standin):
    thrift1, _ = hbase_standin
    storage = open_storage(hbase_url(thrift1))
    try:
        storage.create_queue(QueueInfo("crawl", 32))
        assert regions(thrift1, storage.prefix.encode() + b"q_crawl") == [b""]
    finally:
        storage.close()


def test_url_options_are_checked():
    with pytest.raises(ValueError, match="unknown hbase:// URL option"):
        HBaseStorage.from_url("hbase://127.0.0.1:1?colour=blue")
    with pytest.raises(ValueError, match="'admin'"):
        HBaseStorage("127.0.0.1", 1, admin="nohost")


def test_an_unreachable_server_is_a_clear_storage_unavailable():
    with socket.socket() as closed:  # bound, never listening: refused, and no other test can take the port
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(StorageUnavailable, match=f"127.0.0.1:{port}") as info:
            HQueueAdmin(f"hbase://127.0.0.1:{port}")
    assert isinstance(info.value, StorageError)


def test_framed_transport_and_compact_protocol():
    proc, port, _ = start_hbase_standin("--transport", "framed", "--protocol", "compact")
    try:
        url = f"hbase://127.0.0.1:{port}?transport=framed&protocol=compact"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 2)
            with HQueue("q", url) as queue:
                ids = queue.put([Message("t", b"x")] * 3, partition_id=1)
                assert [m.id for m in queue.scan()] == ids
    finally:
        proc.kill()
        proc.wait()


def test_a_server_that_dies_gives_storage_unavailable_and_a_restart_recovers():
    proc, port, _ = start_hbase_standin()
    url = f"hbase://127.0.0.1:{port}?timeout=5000"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
            with HQueue("q", url) as queue:
                queue.put(Message("t", b"before"), partition_id=0)
                # When the server is killed
                proc.kill()
                proc.wait()
                # Then calls fail with a typed error, never a raw Thrift one
                with pytest.raises(StorageUnavailable):
                    queue.put(Message("t", b"lost"), partition_id=0)
                with pytest.raises(StorageUnavailable):
                    list(queue.scan())
                # And once a server is back on the port, the same pool reconnects
                # (the stand-in keeps nothing in memory across restarts: start over)
                proc, _, _ = start_hbase_standin("--port", str(port))
                storage = admin.engine.storage
                storage._ensure_meta_table()
                storage.create_queue(QueueInfo("q2", 1))
                assert [q.name for q in admin.list_queues()] == ["q2"]
    finally:
        proc.kill()
        proc.wait()


def test_only_timer_cells_are_stamped_with_their_due_time_never_topic_index_entries():
    """A cell's HBase timestamp is what the family's TTL counts from: a timer's is its due
    time; a topic-index entry's key also has the top bit set, but no due time in it (its
    bytes there are a topic hash: year 6900 for some topics, the past for others)."""
    due = 1_800_000_000_000
    (timer,) = timer_cell_keys(3, due, [MessageID(1_700_000_000_000, 0)], [b"wanted"])
    (message,) = cell_keys(3, [(1_700_000_000_000, range(1))], [b"wanted"])
    ((index, _),) = index_cells([message], [b"v"], HASHES["xxh3"])
    assert _cell_time(timer) == due
    assert _cell_time(message) is None
    assert _cell_time(index) is None


@pytest.mark.parametrize("ttl", [0, 3600])
def test_a_timer_put_without_a_ttl_is_one_call_and_every_timer_fires_once(hbase_standin, ttl):
    """A timer put was a call per due time, then one for its record: an owner killed between
    them left timers stored without the record, and the put sent again stored them again, to
    fire twice (an attacker's pass over a cluster). Without a TTL a timer's cell needs no
    stamp of its own, and the put is one call; with one it is still a call per due time
    (docs/distributed.md's known gaps). Fired timers are deleted either way."""
    url = hbase_url(hbase_standin[0])
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1, ttl)
    with HQueue("q", url) as queue:
        storage, calls = queue.engine.storage, []
        send = storage._send

        def counting(connection, name, by_time):  # a mutateRows call per timestamp with cells
            calls.extend(stamp for stamp, batch in by_time.items() if batch)
            return send(connection, name, by_time)

        storage._send = counting
        try:
            now = wall_clock_ms()
            queue.put([Message("t", b"%d" % i) for i in range(3)], 0, deliver_at=[now + 100, now + 200, now + 300])
            assert len(calls) == (1 if not ttl else 4), calls
        finally:
            del storage._send
        fired = wait_for(lambda: (ms := list(queue.scan())) and len(ms) >= 3 and ms, 30, "the timers to fire")
        assert sorted(m.value for m in fired) == [b"0", b"1", b"2"] and queue.count_timers()[0] == 0


def test_timers_are_deleted_when_the_region_servers_clock_is_ahead():
    """Without a TTL a timer's cell takes HBase's clock, and its delete was stamped with
    this process's clock and 60 s: with HBase 3 minutes ahead, a cancelled timer stayed and
    fired, and a fired one fired again (a review)."""
    proc, port, _ = start_hbase_standin("--clock-ahead-ms", str(3 * 60_000))
    url = f"hbase://127.0.0.1:{port}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            (soon,) = queue.put(Message("t", b"once"), delay=0.2)
            (later,) = queue.put(Message("t", b"cancelled"), delay=30)
            assert queue.cancel(later)
            fired = wait_for(lambda: list(queue.scan()), 30, "the timer to fire")
            assert [m.value for m in fired] == [b"once"] and queue.count_timers()[0] == 0
            assert queue.cancel(soon) is False  # fired: gone
    finally:
        proc.kill()
        proc.wait()
