"""The packed batch: the fast wire path for puts and scan replies."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hqueue import HQueue, HQueueAdmin, Message, MessageID
from hqueue.errors import InvalidArgument, MessageTooLarge
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


def test_the_client_splits_batches_by_count_and_bytes(server, monkeypatch):
    from hqueue.rpc import wire

    monkeypatch.setattr(wire, "MAX_PUT_BATCH", 7)
    monkeypatch.setattr(wire, "MAX_PUT_BYTES", 50)
    with HQueue("q", f"hqueue://{server.address}") as queue:
        ids = queue.put([Message("t", b"%02d" % i + b"x" * 10) for i in range(30)], partition_id=0)
        assert ids == sorted(ids) and len(set(ids)) == 30
        assert [m.value[:2] for m in queue.scan()] == [b"%02d" % i for i in range(30)]
        with pytest.raises(MessageTooLarge):
            queue.put(Message("t", b"x" * 200))
