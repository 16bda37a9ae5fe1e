"""The per-topic index (SPEC X4): a topic's reads cost its rows, whatever else the queue holds.

Runs on every storage backend and through a server (``make_queue``).
"""

from __future__ import annotations

import hashlib

import pytest
import rocksdict
from xxhash import xxh3_64_digest

from hqueue import HQueue, HQueueAdmin, InvalidArgument, Message, MessageID
from hqueue.config import QueueInfo
from hqueue.engine import Engine
from hqueue.ids import wall_clock_ms
from hqueue.keys.index import HASH_KEY, index_cells, index_range, message_key, topic_head
from hqueue.storage.embedded import EmbeddedStorage
from hqueue.storage.memory import MemoryStorage

from ..processes import drain, wait_for


def test_every_reader_sees_the_same_messages_with_and_without_the_index(make_queue):
    plain = make_queue(partitions=2)
    indexed = make_queue(partitions=2, topic_index=True)
    assert indexed.info.topic_index and not plain.info.topic_index
    for queue in (plain, indexed):
        for pid in range(2):
            queue.put([Message(f"t{i % 7}", b"%d-%d" % (pid, i)) for i in range(300)], pid)
    for topics in (["t3"], ["t1", "t5"], None, ["absent"]):
        for pid in range(2):  # in ID order within a partition (across them, the two queues' times differ)
            read = [[m.value for m in q.scan(topics=topics, partition_id=pid)] for q in (indexed, plain)]
            assert read[0] == read[1]
        assert sorted(m.value for m in indexed.scan(topics=topics)) == sorted(
            m.value for m in plain.scan(topics=topics)
        )
    tenth = [list(q.scan(topics=["t2"], partition_id=1))[10].id for q in (plain, indexed)]
    assert [m.value for m in indexed.scan(tenth[1], topics=["t2"], partition_id=1)] == [
        m.value for m in plain.scan(tenth[0], topics=["t2"], partition_id=1)
    ]
    pages = [m.value for batch in indexed.scan_batches(topics=["t4"], batch_size=7) for m in batch]
    assert pages == [m.value for batch in plain.scan_batches(topics=["t4"], batch_size=7) for m in batch]


def test_groups_and_timers_read_and_write_through_the_index(make_queue):
    queue = make_queue(partitions=1, topic_index=True)
    queue.put([Message("noise", b"n")] * 50 + [Message("wanted", b"w1")], 0)
    queue.put(Message("wanted", b"w2"), 0, delay=0.2)
    with queue.consumer("g", topics=["wanted"]) as consumer:
        got = drain(consumer, 2)
        assert [d.value for d in got] == [b"w1", b"w2"]


def test_a_topic_read_touches_only_that_topic_s_rows():
    """Count what the store hands back: the index makes it the topic's rows only."""
    storage = CountingStorage("topic-index-cost")
    engine = Engine(storage)
    engine.create_queue(QueueInfo("q", 1, config={"hqueue.topicIndex": "true"}))
    engine.put("q", [Message("big", b"x")] * 5000 + [Message("small", b"y")] * 3, 0)
    storage.returned = 0
    messages = engine.scan("q", b"\x00\x00", b"\x00\x01", frozenset([b"small"]), 1000)
    assert len(messages) == 3 and storage.returned == 3
    engine.close()


def test_a_read_of_many_topics_holds_about_one_answer_not_one_per_topic():
    """Each topic's ``limit`` entries were read, then merged: a 16-message read of 32 topics
    of 1 MiB messages held 512 of them (620 MB of server)."""
    storage = CountingStorage("topic-index-merge")
    engine = Engine(storage)
    engine.create_queue(QueueInfo("q", 1, config={"hqueue.topicIndex": "true"}))
    topics = [b"t%02d" % i for i in range(32)]
    engine.put("q", [Message(topics[i % 32], b"%04d" % i) for i in range(32 * 16)], 0)
    everything = engine.scan("q", b"\x00\x00", b"\x00\x01", None, 10_000)
    for wanted, max_bytes in ((topics, None), (topics[:5], None), (topics, 200), (topics[3:4], None)):
        storage.returned = 0
        keys, values = engine.scan_columns("q", b"\x00\x00", b"\x00\x01", frozenset(wanted), 16, max_bytes)
        expected = [m for m in everything if bytes(m.topic) in wanted][:16]
        if max_bytes is not None:  # (up to the one that brings them to 200 bytes)
            sizes = [len(k) + len(v) for k, v in zip(keys, values, strict=True)]
            assert sum(sizes[:-1]) < max_bytes <= sum(sizes)
            expected = expected[: len(keys)]
        assert values == [m.value for m in expected]
        assert storage.returned <= 2 * 16 + len(wanted)  # (it was 16 a topic: 512)
    # A one-message read of 32 topics reads one message: their keys pick it (each topic's
    # first entry was read whole: 64 of 4 MiB held 260 MB of server, an attacker's pass)
    storage.returned = 0
    keys, values = engine.scan_columns("q", b"\x00\x00", b"\x00\x01", frozenset(topics), 1, 1)
    assert values == [everything[0].value] and storage.returned == 1
    # Two topics taking turns: their values are read a window at a time, not one read a message
    storage.calls = 0
    keys, values = engine.scan_columns("q", b"\x00\x00", b"\x00\x01", frozenset(topics[:2]), 30)
    assert values == [m.value for m in everything if bytes(m.topic) in topics[:2]][:30]
    assert storage.calls <= 2 * 5 + 2, storage.calls  # (windows 1, 2, 4, 8, 15: a read a topic each)
    engine.close()


def test_reads_of_several_topics_cut_by_bytes_miss_nothing_on_every_store(store_url):
    """A topic's read cut by bytes goes on from its last entry: HBase counted the bytes of the
    entry it started after, came back short, and the topic was taken as ended (a consumer
    group of 8 topics received 16 of 40 big messages of one)."""
    with HQueueAdmin(store_url) as admin:
        admin.create_queue("plain", 1)
        admin.create_queue("indexed", 1, topic_index=True)
    with HQueue("plain", store_url) as plain, HQueue("indexed", store_url) as indexed:
        messages = [Message(f"t{i % 3}", b"x" * (100 if i % 3 else 1000) + b"%d" % i) for i in range(60)]
        for queue in (plain, indexed):
            queue.put(messages, 0)
        engine = indexed.engine
        start, stop = b"\x00\x00", b"\x00\x01"
        for topics in ({b"t0", b"t1"}, {b"t0", b"t1", b"t2"}, {b"t0"}):
            for max_bytes in (1, 500, 1500, 4000):
                at, got = start, []
                while True:  # as a group's scan goes on, from after the last it was given
                    keys, values = engine.scan_columns("indexed", at, stop, topics, 7, max_bytes)
                    if not keys:
                        break
                    got += values
                    at = keys[-1] + b"\x00"
                expected = [m.value for m in plain.scan(topics=sorted(topics), partition_id=0)]
                assert got == expected, (topics, max_bytes)


def test_a_read_of_several_topics_sees_no_later_put_in_one_topic_and_not_an_earlier_one():
    """Each topic is a read of its own: messages of topics a and b put between two of them
    showed b's and not a's, and a group reading on from the last it got skipped a's."""
    storage = PuttingBetweenReads("topic-index-race")
    engine = storage.engine = Engine(storage)
    engine.create_queue(QueueInfo("q", 1, config={"hqueue.topicIndex": "true"}))
    engine.put("q", [Message("a", b"a0"), Message("b", b"b0")], 0)
    storage.armed = True
    start, stop = b"\x00\x00", b"\x00\x01"
    keys, values = engine.scan_columns("q", start, stop, frozenset([b"a", b"b"]), 10)
    later = engine.scan_columns("q", keys[-1] + b"\x00", stop, frozenset([b"a", b"b"]), 10)[1]
    assert storage.armed is False  # (the puts came between two topics' reads)
    assert values + later == [b"a0", b"b0", b"a1", b"b1"]
    engine.close()


class PuttingBetweenReads(MemoryStorage):
    """Puts a message of topic a, then one of b, right after the first index read."""

    armed = False
    engine: Engine

    def scan(self, *args, **kwargs):
        cells = super().scan(*args, **kwargs)
        if self.armed and args[1][:2] == b"\xff\xff":  # an index read
            self.armed = False
            self.engine.put("q", [Message("a", b"a1")], 0)
            self.engine.put("q", [Message("b", b"b1")], 0)
        return cells


class CountingStorage(MemoryStorage):
    returned = calls = 0

    def scan(self, *args, **kwargs):
        cells = super().scan(*args, **kwargs)
        self.returned += len(cells)
        self.calls += 1
        return cells


def test_index_keys_map_back_to_message_keys():
    key = b"\x00\x03" + MessageID(1700, 2).to_bytes() + b"topic"
    ((index_key, value),) = index_cells([key], [b"v"], xxh3_64_digest)
    assert value == b"v" and index_key.startswith(topic_head(b"\x00\x03", b"topic", xxh3_64_digest))
    assert message_key(index_key) == key
    start, stop = index_range(b"\x00\x03", b"\x00\x04", b"topic", xxh3_64_digest)
    assert start <= index_key < stop


def test_a_put_s_index_entries_come_in_key_order_with_their_own_values():
    keys = [b"\x00\x01" + MessageID(1700, i).to_bytes() + b"topic-%d" % i for i in range(200)]
    values = [b"v%d" % i for i in range(200)]
    cells = index_cells(keys, values, xxh3_64_digest)
    assert [k for k, _ in cells] == sorted(k for k, _ in cells)
    assert sorted((message_key(k), v) for k, v in cells) == sorted(zip(keys, values, strict=True))


def test_new_queues_name_their_hash_and_unknown_hashes_are_refused():
    engine = Engine(MemoryStorage("hashes"))
    engine.create_queue(QueueInfo("q", 1, config={"hqueue.topicIndex": "true"}))
    assert engine.queue_info("q").config[HASH_KEY] == "xxh3"
    with pytest.raises(InvalidArgument, match="unknown hqueue.topicIndexHash 'md5'"):
        engine.create_queue(QueueInfo("r", 1, config={"hqueue.topicIndex": "true", HASH_KEY: "md5"}))
    engine.create_queue(QueueInfo("plain", 1))
    assert HASH_KEY not in engine.queue_info("plain").config
    engine.close()


def test_a_store_from_before_keeps_its_index(tmp_path):
    """Stores written before the index had its own column family and XXH3: their
    queues keep BLAKE2b, and their entries move into the index family on open."""
    path = str(tmp_path / "data")
    storage = EmbeddedStorage(path)
    storage.create_queue(QueueInfo("old", 1, config={"hqueue.topicIndex": "true"}))  # no hash named: as before
    family, batch = storage._handles["old"], rocksdict.WriteBatch(raw_mode=True)
    for i in range(25_000):  # rows and entries in the queue's own family, as the old layout had them
        topic = b"t%d" % (i % 3)
        key = b"\x00\x00" + MessageID(1700_000_000_000, i).to_bytes() + topic
        head = b"\xff\xff\x00\x00" + hashlib.blake2b(topic, digest_size=8).digest()
        batch.put(key, b"v%d" % i, family)
        batch.put(head + key[2:], b"v%d" % i, family)
    storage._db.write(batch)
    del family, batch  # RocksDB's lock goes with the last reference
    storage.close()
    with HQueue("old", "local://" + path) as queue:
        assert [m.value for m in queue.scan(topics=["t1"])] == [b"v%d" % i for i in range(1, 25_000, 3)]
        queue.put(Message("t1", b"new"), 0)
        assert [m.value for m in queue.scan(topics=["t1"])][-1] == b"new"
        storage = queue.engine.storage  # type: ignore[attr-defined]
        assert sum(1 for _ in storage._family("old").keys()) == 25_001  # rows only
        assert sum(1 for _ in storage._index_families["old"].keys()) == 25_001


def test_truncate_and_delete_clear_the_index_family(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1, topic_index=True)
        with HQueue("q", url) as queue:
            queue.put([Message("t", b"before")] * 5, 0)
        admin.truncate_queue("q")
        with HQueue("q", url) as queue:
            assert list(queue.scan(topics=["t"])) == []
            queue.put(Message("t", b"after"), 0)
            assert [m.value for m in queue.scan(topics=["t"])] == [b"after"]
        admin.disable_queue("q")
        admin.delete_queue("q")
        admin.create_queue("q", 1, topic_index=True)
        with HQueue("q", url) as queue:
            assert list(queue.scan(topics=["t"])) == []


def past_ttl(message_id: MessageID, ttl: float = 1.0) -> None:
    """Until the wall clock's TTL cutoff (now - ttl, in whole milliseconds) is above the ID:
    a sleep of exactly the TTL left it equal at times, and the message alive."""
    wait_for(lambda: wall_clock_ms() - ttl * 1000 > message_id.timestamp, ttl + 10, f"{message_id} to expire")


def test_expired_messages_leave_the_index_too(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1, ttl=1, topic_index=True)
    with HQueue("q", url) as queue:
        old = queue.put([Message("t", b"old")] * 10, 0)
        past_ttl(old[-1])
        (new,) = queue.put(Message("t", b"new"), 0)
        assert [m.value for m in queue.scan(topics=["t"])] == [b"new"]  # hidden at once
        past_ttl(new)
        storage = queue.engine.storage  # type: ignore[attr-defined]
        storage.reclaim_expired("q")
        assert list(storage._family("q").keys()) == []  # rows and index entries reclaimed
        assert list(storage._index_families["q"].keys()) == []


def test_a_reclaim_with_nothing_expired_rewrites_nothing(tmp_path):
    """Each pass compacted the whole queue: a 330 MB queue with nothing expired was written
    again every 5 minutes (345 MB)."""
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2, ttl=3600, topic_index=True)
    with HQueue("q", url) as queue:
        for pid in (0, 1):
            queue.put([Message(f"t{i}", b"alive") for i in range(100)], pid)
        storage = queue.engine.storage  # type: ignore[attr-defined]
        storage._db.flush()
        files = sorted(f["name"] for f in storage._db.live_files())
        storage.reclaim_expired("q")
        assert sorted(f["name"] for f in storage._db.live_files()) == files
        assert len(list(queue.scan(topics=["t7"]))) == 2


@pytest.mark.parametrize("flag", ["on", "enabled", "tru"])
def test_a_misspelled_index_flag_is_refused_not_a_queue_without_the_index(tmp_path, flag):
    """``hqueue.topicIndex: 'on'`` made a queue without the index, silently (an attacker's pass)."""
    with HQueueAdmin(f"local://{tmp_path}") as admin:
        with pytest.raises(InvalidArgument, match="must be true or false"):
            admin.create_queue("q", 1, config={"hqueue.topicIndex": flag})
        admin.create_queue("yes", 1, config={"hqueue.topicIndex": "TRUE"})
        assert admin.engine.queue_info("yes").topic_index


def test_a_topic_that_is_not_utf8_text_is_an_invalid_message_not_a_unicode_error(tmp_path):
    """A str topic holding a lone surrogate raised UnicodeEncodeError (an attacker's pass)."""
    from hqueue import InvalidMessage

    with pytest.raises(InvalidMessage, match="not UTF-8 text"):
        Message("\udcff", b"x")
    with HQueueAdmin(f"local://{tmp_path}") as admin:
        admin.create_queue("q", 1)
    with HQueue("q", f"local://{tmp_path}") as queue, pytest.raises(InvalidMessage):
        list(queue.scan(topics=["\udcff"]))


def test_a_read_or_group_of_a_topic_longer_than_any_message_can_have_is_refused(make_queue):
    """A scan took topics over MAX_TOPIC_BYTES (none can be stored), through a server too
    (an attacker's pass); groups and subscribers of such a topic are refused as well."""
    from hqueue import InvalidMessage
    from hqueue.message import MAX_TOPIC_BYTES

    queue = make_queue(partitions=1)
    queue.put(Message("t" * MAX_TOPIC_BYTES, b"longest"), 0)
    assert [m.value for m in queue.scan(topics=["t" * MAX_TOPIC_BYTES])] == [b"longest"]
    too_long = "t" * (MAX_TOPIC_BYTES + 1)
    with pytest.raises(InvalidMessage, match=f"at most {MAX_TOPIC_BYTES} bytes"):
        list(queue.scan(topics=[too_long]))
    with pytest.raises(InvalidMessage, match=f"at most {MAX_TOPIC_BYTES} bytes"):
        queue.consumer("g", topics=[too_long])
    with pytest.raises(InvalidMessage, match=f"at most {MAX_TOPIC_BYTES} bytes"):
        queue.engine.groups.open(queue.name, "g2", frozenset([too_long.encode()]), 0, 3)
