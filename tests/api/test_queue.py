"""HQueue's put and scan API (SPEC C5, C6), on every storage backend."""

import contextlib
import os
import threading
import time
from datetime import UTC, datetime

import pytest

from hqueue import (
    GroupNotFound,
    HQueue,
    HQueueAdmin,
    InvalidArgument,
    InvalidMessage,
    InvalidPartition,
    Message,
    MessageID,
    MessageTooLarge,
    QueueDisabled,
    QueueNotFound,
    Scan,
)
from hqueue.queue import partition_for_key


def test_put_returns_ids_and_scan_reads_them_back(make_queue):
    queue = make_queue(partitions=4)
    ids = queue.put(Message("crawler", b"http://www.360test.com"))
    assert len(ids) == 1 and isinstance(ids[0], MessageID)
    (message,) = queue.scan()
    assert (message.id, message.topic, message.value) == (ids[0], b"crawler", b"http://www.360test.com")


def test_put_to_a_partition_and_batches_get_consecutive_ids(make_queue):
    queue = make_queue(partitions=16)
    ids = queue.put([Message("crawler", b"u%d" % i) for i in range(5)], partition_id=10)
    assert ids == sorted(ids) and len(set(ids)) == 5
    messages = list(queue.get_partition_scanner(10))
    assert [m.id for m in messages] == ids
    assert [m.value for m in messages] == [b"u%d" % i for i in range(5)]
    assert {m.partition_id for m in messages} == {10}


def test_a_batch_without_partition_goes_to_one_random_partition(make_queue):
    queue = make_queue(partitions=8)
    queue.put([Message("t", b"%d" % i) for i in range(50)])
    assert len({m.partition_id for m in queue.scan()}) == 1


def test_a_keyed_put_goes_by_the_queue_made_again_under_its_handle(make_queue, admin, api_url):
    """A handle's put went by its client's cached definition (2 s): into a queue deleted and
    made again with more partitions, a key's puts went to the partition the old count named
    (an attacker's probe, through a server). A put now says the definition it was routed
    by; refused by the new queue (nothing written), it reads it afresh and goes again."""
    from hqueue.checks import partition_for_key

    queue = make_queue(partitions=2)
    queue.put(Message("t", b"before"), key=b"user-4")  # (its definition cached)
    with HQueueAdmin(api_url) as other:  # (another client: its own cache)
        other.disable_queue(queue.name)
        other.delete_queue(queue.name)
        other.create_queue(queue.name, 16)
    expected = partition_for_key(b"user-4", 16)
    queue.put(Message("t", b"after"), key=b"user-4")
    assert [(m.value, m.partition_id) for m in queue.scan()] == [(b"after", expected)]
    with HQueueAdmin(api_url) as other:  # (and a timer put, the same way)
        other.disable_queue(queue.name)
        other.delete_queue(queue.name)
        other.create_queue(queue.name, 16)
    assert [t.partition_id for t in queue.put(Message("t", b"timer"), key=b"user-4", delay=600)] == [expected]


def test_a_put_goes_by_the_queue_made_again_with_fewer_partitions(make_queue, admin, api_url):
    """Through a server, a put naming no partition raised InvalidPartition ("must be in 0..0,
    got 5") once the queue was made again with fewer partitions: the client routed it by its
    cached definition, then read the new queue's owners (an attacker's pass)."""
    queue = make_queue(partitions=8)
    queue.put(Message("t", b"before"))  # (its definition cached)
    with HQueueAdmin(api_url) as other:
        other.disable_queue(queue.name)
        other.delete_queue(queue.name)
        other.create_queue(queue.name, 1)
    for n in range(20):
        queue.put(Message("t", b"%d" % n))
    assert {m.partition_id for m in queue.scan()} == {0} and sum(1 for _ in queue.scan()) == 20


@pytest.mark.parametrize("store", ["embedded", "memory"])
def test_puts_racing_a_queue_made_again_are_refused_or_read_never_lost(tmp_path, store):
    """In one process, puts racing delete_queue + create_queue (8 partitions, then 1) were
    acknowledged into partitions the new queue lacks, and never read (an attacker's pass:
    1-3 a run): a write made by the old definition is refused now, and put goes again."""
    from hqueue.message import decode_rowkey, partition_prefix

    url = f"local://{tmp_path}/data" if store == "embedded" else f"memory://race-{os.getpid()}-{time.monotonic_ns()}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("s", 8)
        queue = HQueue("s", url)
        stop, hidden = threading.Event(), []

        def put() -> None:
            while not stop.is_set():
                with contextlib.suppress(QueueNotFound, QueueDisabled):
                    queue.put(Message("t", b"v"))

        threads = [threading.Thread(target=put) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for round_ in range(40):
                admin.delete_queue("s", force=True)
                admin.create_queue("s", 1 if round_ % 2 == 0 else 8)
                time.sleep(0.03)
                if round_ % 2 == 0:  # rows where the 1-partition queue has no partition
                    storage = queue.engine.storage
                    for pid in range(1, 8):
                        cells = storage.scan("s", partition_prefix(pid), partition_prefix(pid + 1), None, 100)
                        hidden += [decode_rowkey(key[:12]) for key, _ in cells]
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            queue.close()
    assert hidden == []


def test_a_consumer_of_a_queue_made_again_closes_without_an_error(make_queue, admin):
    """Its group went with the queue: each receive says GroupNotFound (as after
    delete_group), and close() raised it too, so a with block's exit did (an attacker's pass)."""
    queue = make_queue(partitions=1)
    with queue.consumer("g") as consumer:
        consumer.receive(1, wait=0)
        admin.disable_queue(queue.name)
        admin.delete_queue(queue.name)
        admin.create_queue(queue.name, 1)
        with pytest.raises(GroupNotFound):
            consumer.receive(1, wait=0)
    assert consumer.closed


def test_single_puts_spread_over_partitions(make_queue):
    queue = make_queue(partitions=8)
    for i in range(200):
        queue.put(Message("t", b"%d" % i))
    assert len({m.partition_id for m in queue.scan()}) == 8


def test_same_key_always_goes_to_the_same_partition_in_order(make_queue):
    queue = make_queue(partitions=32)
    for i in range(20):
        queue.put(Message("orders", b"%d" % i), key=b"shop-42")
    messages = list(queue.scan())
    assert {m.partition_id for m in messages} == {partition_for_key(b"shop-42", 32)}
    assert [m.value for m in messages] == [b"%d" % i for i in range(20)]
    assert partition_for_key("shop-42", 32) == partition_for_key(b"shop-42", 32)


def test_queue_scanner_merges_partitions_in_id_order(make_queue):
    queue = make_queue(partitions=8)
    for i in range(400):
        queue.put(Message("t", b"%d" % i), partition_id=i % 8)
    # small caching forces many chunk refills and merge rounds
    with queue.get_queue_scanner(Scan(), caching=7) as scanner:
        messages = list(scanner)
    assert len(messages) == 400
    keys = [(m.id, m.partition_id) for m in messages]
    assert keys == sorted(keys)


def test_combined_scanner_uses_each_partitions_own_scan(make_queue):
    queue = make_queue(partitions=4)
    ids = {pid: queue.put([Message("a", b"x"), Message("b", b"y")] * 3, partition_id=pid) for pid in range(4)}
    scanner = queue.get_combined_partition_scanner(
        {1: Scan(start_id=ids[1][2]), 2: Scan(topics=["b"]), 3: Scan(stop_id=ids[3][1])}
    )
    got = [(m.partition_id, m.id) for m in scanner]
    expected = [(1, i) for i in ids[1][2:]] + [(2, i) for i in ids[2][1::2]] + [(3, ids[3][0])]
    assert sorted(got, key=lambda x: (x[1], x[0])) == got
    assert sorted(got) == sorted(expected)


def test_scan_range_is_start_inclusive_stop_exclusive(make_queue):
    queue = make_queue(partitions=1)
    ids = queue.put([Message("t", b"%d" % i) for i in range(10)], partition_id=0)
    got = [m.id for m in queue.get_queue_scanner(Scan(ids[2], ids[7]))]
    assert got == ids[2:7]


def test_scan_by_time_finds_messages_written_in_that_window(make_queue):
    queue = make_queue(partitions=2)
    queue.put(Message("t", b"old"), partition_id=0)
    time.sleep(0.01)
    now_ms = int(time.time() * 1000)
    queue.put(Message("t", b"new"), partition_id=1)
    assert [m.value for m in queue.scan(start=now_ms)] == [b"new"]
    assert [m.value for m in queue.scan(stop=now_ms)] == [b"old"]
    since = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    assert [m.value for m in queue.scan(start=since)] == [b"new"]


def test_topic_filter_returns_only_those_topics(make_queue):
    queue = make_queue(partitions=3)
    for i in range(30):
        queue.put(Message(["topic1", "topic2", "topic3"][i % 3], b"%d" % i), partition_id=i % 3)
    scan = Scan().add_topic("topic1").add_topic(b"topic2")
    topics = [m.topic for m in queue.get_queue_scanner(scan, caching=4)]
    assert len(topics) == 20 and set(topics) == {b"topic1", b"topic2"}


def test_next_returns_none_at_the_end_and_scanners_are_context_managers(make_queue):
    queue = make_queue(partitions=2)
    queue.put(Message("t", b"only"), partition_id=1)
    scanner = queue.get_partition_scanner(1)
    assert scanner.next().value == b"only"
    assert scanner.next() is None
    scanner.close()
    with queue.get_queue_scanner() as scanner:
        assert next(iter(scanner)).value == b"only"
        assert scanner.next() is None


def test_scan_limit_and_partition(make_queue):
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"%d" % i) for i in range(50)], partition_id=1)
    assert len(list(queue.scan(limit=7))) == 7
    assert list(queue.scan(partition_id=0)) == []


def test_ids_strictly_increase_per_partition_with_concurrent_writers(make_queue):
    queue = make_queue(partitions=2)
    errors = []

    def write():
        try:
            for i in range(50):
                queue.put([Message("t", b"x")] * 10, partition_id=i % 2)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for pid in range(2):
        ids = [m.id for m in queue.get_partition_scanner(pid)]
        assert len(ids) == 1500 and len(set(ids)) == 1500 and ids == sorted(ids)


def test_a_second_handle_in_the_process_shares_the_allocators(make_queue, api_url):
    queue = make_queue(partitions=1)
    with HQueue(queue.name, api_url) as other:
        a = queue.put(Message("t", b"a"), partition_id=0)
        b = other.put(Message("t", b"b"), partition_id=0)
        c = queue.put(Message("t", b"c"), partition_id=0)
    assert a < b < c


# -- bad input: clear, typed errors, and nothing written -----------------------


def test_unknown_queue_is_queue_not_found(api_url):
    with pytest.raises(QueueNotFound, match="'nope'"):
        HQueue("nope", api_url)


def test_disabled_queue_rejects_put_and_scan(make_queue, admin):
    queue = make_queue()
    admin.disable_queue(queue.name)
    with pytest.raises(QueueDisabled):
        queue.put(Message("t", b"x"))
    with pytest.raises(QueueDisabled):
        queue.get_queue_scanner()
    with pytest.raises(QueueDisabled):
        queue.scan()
    admin.enable_queue(queue.name)
    queue.put(Message("t", b"x"))


@pytest.mark.parametrize("how", ["scan", "batches", "partition"])
def test_a_scan_of_a_queue_deleted_and_created_again_says_so_and_reads_none_of_the_new_queue(
    make_queue, admin, api_url, how
):
    # Given a scan that read part of a queue (a scan reads 1,000 a chunk, the others 10 here;
    # through servers, two chunks more ahead)
    queue = make_queue(partitions=2)
    old = queue.put([Message("t", b"old %d" % i) for i in range(5000)], partition_id=0)
    reading = {
        "scan": lambda: queue.scan(),
        "batches": lambda: (m for batch in queue.scan_batches(batch_size=10) for m in batch),
        "partition": lambda: iter(queue.get_partition_scanner(0, caching=10)),
    }[how]()
    first = [next(reading).id for _ in range(5)]
    # When the queue is deleted, made again under its name, and given messages
    admin.disable_queue(queue.name)
    admin.delete_queue(queue.name)
    admin.create_queue(queue.name, 2)
    with HQueue(queue.name, api_url) as again:
        new = again.put([Message("t", b"new %d" % i) for i in range(50)], partition_id=0)
    # Then the scan says the queue it read is gone, within what it had read ahead,
    # and none of the new queue's messages comes out of it (a chunk asked for ahead, through
    # a server, may have met the queue disabled, or deleted and not made again yet)
    read = list(first)
    with pytest.raises((QueueNotFound, QueueDisabled), match="deleted and created again|disabled|does not exist"):
        for message in reading:
            read.append(message.id)
    assert set(read) <= set(old) and not set(read) & set(new)
    assert admin.describe_queue(queue.name)["config"]["hqueue.created"]  # (when, and which)


def remade(admin, api_url: str, name: str) -> set:
    """Delete queue ``name``, make it again (2 partitions) and put 20 messages in each
    partition: their IDs."""
    admin.disable_queue(name)
    admin.delete_queue(name)
    admin.create_queue(name, 2)
    with HQueue(name, api_url) as again:
        return {i for pid in (0, 1) for i in again.put([Message("t", b"new")] * 20, partition_id=pid)}


def test_scan_batches_does_not_go_on_into_a_queue_made_again_in_its_next_partition(make_queue, admin, api_url):
    """Each partition's cursor took the queue it found when it was opened: the partitions
    read after a recreate were the new queue's (an attacker's probe: 3,000 of them)."""
    queue = make_queue(partitions=2)
    for pid in (0, 1):
        queue.put([Message("t", b"old")] * 5, partition_id=pid)
    batches = queue.scan_batches()
    assert len(next(batches)) == 5  # partition 0, all of it
    new = remade(admin, api_url, queue.name)
    with pytest.raises(QueueNotFound, match="deleted and created again"):
        for batch in batches:
            assert not set(batch.ids) & new


@pytest.mark.parametrize("how", ["queue", "partition", "combined"])
def test_a_scanner_opened_before_its_queue_was_made_again_reads_none_of_the_new_one(make_queue, admin, api_url, how):
    """A cursor took the queue it found at its first read, not when it was opened (an
    attacker's probe: a scanner got the new queue's messages)."""
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"old")] * 5, partition_id=0)
    scanner = {
        "queue": lambda: queue.get_queue_scanner(),
        "partition": lambda: queue.get_partition_scanner(0),
        "combined": lambda: queue.get_combined_partition_scanner({0: Scan(), 1: Scan()}),
    }[how]()
    new = remade(admin, api_url, queue.name)
    with pytest.raises(QueueNotFound, match="deleted and created again"):
        for message in scanner:
            assert message.id not in new


@pytest.mark.parametrize("pid", [-1, 4, 40000])
def test_partition_out_of_range_is_rejected(make_queue, pid):
    queue = make_queue(partitions=4)
    with pytest.raises(InvalidPartition, match="'partition_id'"):
        queue.put(Message("t", b"x"), partition_id=pid)
    with pytest.raises(InvalidPartition):
        queue.get_partition_scanner(pid)


@pytest.mark.parametrize("bad", ["text", b"bytes", 42, [b"raw"], [Message("t", b"ok"), ("t", b"x")], None])
def test_wrong_types_are_type_errors_and_write_nothing(make_queue, bad):
    queue = make_queue(partitions=1)
    with pytest.raises(TypeError):
        queue.put(bad)
    assert list(queue.scan()) == []


@pytest.mark.parametrize("name", [123, b"q", None])
def test_a_queue_name_that_is_no_str_is_a_type_error(api_url, name):
    with pytest.raises(TypeError, match="'name' must be a str"):
        HQueue(name, api_url)


def test_a_topic_put_as_str_comes_back_equal_to_it(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("crawler", b"a"), Message("café", b"b")])
    topics = [m.topic for m in queue.scan()]
    assert topics == ["crawler", "café"] and topics == [b"crawler", "café".encode()]
    assert [m.value for m in queue.scan(topics=["crawler"])] == [b"a"]


def test_empty_batch_is_invalid(make_queue):
    with pytest.raises(InvalidMessage, match="at least one"):
        make_queue().put([])


def test_an_oversized_message_rejects_the_whole_batch(make_queue):
    queue = make_queue(partitions=1, max_message_bytes=1000)
    batch = [Message("t", b"ok"), Message("t", b"x" * 1000), Message("t", b"ok")]
    with pytest.raises(MessageTooLarge, match="message 1"):
        queue.put(batch, partition_id=0)
    assert list(queue.scan()) == []
    queue.put(Message("t", b"x" * 999), partition_id=0)


def test_partition_and_key_together_are_rejected(make_queue):
    with pytest.raises(TypeError, match="not both"):
        make_queue().put(Message("t", b"x"), partition_id=0, key=b"k")


def test_bad_scan_arguments_are_rejected_at_once(make_queue):
    queue = make_queue()
    with pytest.raises(TypeError, match="'start_id'"):
        Scan(start_id=5)
    with pytest.raises(TypeError, match="'topics'"):
        Scan(topics="one-topic")
    with pytest.raises(TypeError, match="'start'"):
        queue.scan(start="yesterday")
    # past the wire's i32 refused on every store alike (embedded failed in islice, a server took it)
    for caching in (0, True, 2**31, 10**19):
        with pytest.raises(ValueError, match="'caching' must be an int in 1..2147483647"):
            queue.get_queue_scanner(caching=caching)


def test_scan_batches_read_columns_partition_by_partition(make_queue):
    queue = make_queue(partitions=3)
    batch = [Message(f"t{i % 2}", b"v%d" % i) for i in range(25)]
    written = {pid: queue.put(batch, partition_id=pid) for pid in range(3)}
    batches = list(queue.scan_batches(batch_size=10))
    assert [(b.partition_id, len(b)) for b in batches] == [(pid, n) for pid in range(3) for n in (10, 10, 5)]
    assert [i for b in batches if b.partition_id == 1 for i in b.ids] == written[1]
    assert [m.id for b in batches for m in b] == [i for pid in range(3) for i in written[pid]]
    only = list(queue.scan_batches(topics=["t1"], partition_id=2))
    assert len(only) == 1 and only[0].topics == [b"t1"] * 12 and only[0].values[0] == b"v1"
    start = written[0][20]
    assert sum(len(b) for b in queue.scan_batches(start=start, partition_id=0)) == 5
    with pytest.raises(InvalidArgument):
        next(queue.scan_batches(batch_size=0))


def test_a_batch_is_atomic_and_one_over_the_cap_is_refused_whole(make_queue):
    """Every backend holds the same rule: a batch is one atomic write; a batch over
    MAX_BATCH_MESSAGES messages or MAX_BATCH_BYTES bytes is refused, never split."""
    from hqueue.config import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES
    from hqueue.errors import BatchTooLarge

    queue = make_queue(partitions=2)
    with pytest.raises(BatchTooLarge, match="not split"):
        queue.put([Message("t", b"x")] * (MAX_BATCH_MESSAGES + 1), partition_id=0)
    big = b"v" * (MAX_BATCH_BYTES // 2)
    with pytest.raises(BatchTooLarge, match="bytes"):
        queue.put([Message("t", big), Message("t", big)], partition_id=0)
    assert list(queue.scan()) == []
    ids = queue.put([Message("t", b"x")] * MAX_BATCH_MESSAGES, partition_id=1)
    assert ids == sorted(ids) and len(set(ids)) == MAX_BATCH_MESSAGES
