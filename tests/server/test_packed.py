"""The packed batch: the fast wire path for puts and scan replies."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hqueue import HQueue, HQueueAdmin, Message, MessageID
from hqueue.config import MAX_BATCH_MESSAGES
from hqueue.errors import BatchTooLarge, InvalidArgument, MessageTooLarge
from hqueue.ids import IDAllocator, consecutive
from hqueue.message import MAX_SEQUENCE
from hqueue.rpc import packed
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from .test_hardening import raw_client


@given(st.lists(st.tuples(st.binary(max_size=50), st.binary(max_size=200)), max_size=50))
def test_pack_and_unpack_round_trip(pairs):
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    assert packed.unpack(packed.pack(keys, values)) == (keys, values)


@pytest.mark.parametrize("count", [2, 999, 1000, 1001, 2500, 10_000])
def test_parts_of_one_size_round_trip_across_the_cached_formats(count):
    """Parts all of one size are cut by formats cached up to 1000 parts at a time."""
    keys = [b"%019d" % i for i in range(count)]  # one size, each different
    values = [b"%03d" % (i % 1000) for i in range(count)]
    mixed = [b"v" * (i % 7) for i in range(count)]  # sizes that differ
    assert packed.unpack(packed.pack(keys, values)) == (keys, values)
    assert packed.unpack(packed.pack(keys, mixed)) == (keys, mixed)
    assert packed.unpack(packed.pack([b"t"] * count, keys)) == ([b"t"] * count, keys)


@pytest.mark.parametrize(
    "blob, error",
    [
        (b"", "4-byte count"),
        (struct.pack("<I", 1000), "needs 8004 bytes"),
        (struct.pack("<III", 1, 5, 5) + b"short", "add up to 10"),
        (struct.pack("<III", 1, 1, 1) + b"abc", "add up to 2"),
    ],
)
def test_a_malformed_blob_is_a_clear_error(blob, error):
    with pytest.raises(InvalidArgument, match=error):
        packed.unpack(blob)


@given(st.integers(0, MAX_SEQUENCE), st.integers(1, 70_000))
def test_consecutive_ids_follow_the_allocators_rule(sequence, count):
    """What a client rebuilds from (first ID, count): the sequence counts up, then the next millisecond."""
    expected, ts, seq = [], 1_000, sequence
    for _ in range(count):
        expected.append(MessageID(ts, seq))
        ts, seq = (ts + 1, 0) if seq == MAX_SEQUENCE else (ts, seq + 1)
    assert consecutive(MessageID(1_000, sequence), count) == expected
    allocator = IDAllocator(
        MessageID(1_000, sequence - 1) if sequence else MessageID(999, MAX_SEQUENCE), clock=lambda: 0
    )
    assert allocator.allocate(count) == expected


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2, max_message_bytes=100)
    yield server
    server.stop()


def test_a_raw_client_puts_and_reads_packed_batches(server):
    client = raw_client(server.port)
    result = client.putPacked("q", 1, packed.pack([b"t1", b"t2"], [b"a", b"b"]))
    assert result.count == 2
    with HQueue("q", f"hqueue://{server.address}") as queue:
        assert [m.value for m in queue.scan()] == [b"a", b"b"]
        assert queue.scan().__next__().id == MessageID(result.firstID.timestamp, result.firstID.sequenceID)
    scanner = client.messageScannerOpen("q", 1, T.TMessageScan())
    keys, values = packed.unpack(client.messageScannerGetPacked(scanner, 10))
    assert values == [b"a", b"b"] and [k[12:] for k in keys] == [b"t1", b"t2"]
    assert packed.unpack(client.messageScannerGetPacked(scanner, 10)) == ([], [])
    client.close()


@pytest.mark.parametrize(
    "topics, values, error",
    [
        ([b""], [b"x"], "non-empty topic"),
        ([b"t"], [b"x" * 200], "MessageTooLarge"),
        ([], [], "at least one"),
    ],
)
def test_bad_packed_batches_get_typed_errors_and_write_nothing(server, topics, values, error):
    client = raw_client(server.port)
    with pytest.raises(T.TInvalidMessage, match=error):
        client.putPacked("q", 0, packed.pack(topics, values))
    with pytest.raises(T.TInvalidMessage, match="packed batch"):
        client.putPacked("q", 0, b"\x05\x00\x00\x00")
    with pytest.raises(T.TQueueNotFound):
        client.putPacked("nope", 0, packed.pack([b"t"], [b"v"]))
    assert client.listQueues()[0].name == "q"  # the connection lives on
    client.close()
    with HQueue("q", f"hqueue://{server.address}") as queue:
        assert list(queue.scan()) == []


def test_a_remote_batch_is_one_call_and_a_larger_one_is_refused_whole(server):
    """A batch is atomic through a server too: one call, consecutive IDs; over the
    per-call cap it is refused before anything is sent, never split."""
    with HQueue("q", f"hqueue://{server.address}") as queue:
        ids = queue.put([Message("t", b"%05d" % i) for i in range(MAX_BATCH_MESSAGES)], partition_id=0)
        assert ids == consecutive(ids[0], MAX_BATCH_MESSAGES)
        with pytest.raises(BatchTooLarge, match="not split"):
            queue.put([Message("t", b"y")] * (MAX_BATCH_MESSAGES + 1), partition_id=1)
        with pytest.raises(MessageTooLarge):
            queue.put(Message("t", b"x" * 200))
        assert sum(1 for _ in queue.scan()) == MAX_BATCH_MESSAGES  # nothing of the refused batches
    # A raw client meets the same cap at the server, as a typed error, and nothing is written.
    client = raw_client(server.port)
    over = MAX_BATCH_MESSAGES + 1
    with pytest.raises(T.TInvalidMessage, match="LimitExceeded: max_put_messages=10000"):
        client.putPacked("q", 1, packed.pack([b"t"] * over, [b"y"] * over))
    # fewer messages than the cap, more bytes (17 MB: inside the 20 MiB frame limit)
    with pytest.raises(T.TInvalidMessage, match="LimitExceeded: max_put_bytes"):
        client.putPacked("q", 1, packed.pack([b"tt"] * 5000, [b"v" * 3400] * 5000))
    client.close()
    with HQueue("q", f"hqueue://{server.address}") as queue:
        assert list(queue.get_partition_scanner(1)) == []
