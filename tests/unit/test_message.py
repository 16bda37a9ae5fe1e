"""Message, MessageID and the rowkey codec (SPEC C1)."""

import pickle
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hqueue import InvalidArgument, InvalidMessage, Message, MessageID
from hqueue.message import (
    MAX_SEQUENCE,
    PackedReceipts,
    decode_rowkey,
    encode_rowkey,
    ids_by_partition,
    messages_from_columns,
)

timestamps = st.integers(min_value=0, max_value=2**63 - 1)
sequences = st.integers(min_value=0, max_value=MAX_SEQUENCE)
ids = st.builds(MessageID, timestamps, sequences)
pids = st.integers(min_value=0, max_value=32766)


@given(pids, ids)
def test_rowkey_round_trips(pid, message_id):
    rowkey = encode_rowkey(pid, message_id)
    assert len(rowkey) == 12
    assert decode_rowkey(rowkey) == (pid, message_id)


@given(pids, ids, pids, ids)
def test_rowkey_byte_order_is_partition_then_id_order(p1, i1, p2, i2):
    assert (encode_rowkey(p1, i1) < encode_rowkey(p2, i2)) == ((p1, i1) < (p2, i2))


@given(ids, ids)
def test_id_bytes_order_equals_id_order(a, b):
    assert (a.to_bytes() < b.to_bytes()) == (a < b)
    assert MessageID.from_bytes(a.to_bytes()) == a


def test_rowkey_layout_is_big_endian_pid_timestamp_sequence():
    assert encode_rowkey(1, MessageID(2, 3)) == b"\x00\x01" + b"\x00" * 7 + b"\x02" + b"\x00\x03"


@pytest.mark.parametrize(
    "bad", [b"", b"\x00" * 11, b"\x00" * 13, b"\x7f\xff" + b"\x00" * 10, b"\x00" * 10 + b"\x80\x00"]
)
def test_decode_rejects_malformed_rowkeys(bad):
    with pytest.raises(ValueError):
        decode_rowkey(bad)


def test_message_id_validates_arguments():
    with pytest.raises(TypeError, match="'timestamp'"):
        MessageID("1")
    with pytest.raises(TypeError, match="'sequence'"):
        MessageID(1, 1.5)
    with pytest.raises(ValueError, match="'timestamp'"):
        MessageID(-1)
    with pytest.raises(ValueError, match="'sequence'"):
        MessageID(1, MAX_SEQUENCE + 1)


def test_message_id_is_ordered_hashable_and_converts_times():
    when = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    mid = MessageID.from_datetime(when, 5)
    assert mid.datetime == when and mid.sequence == 5
    assert MessageID(1, 2) < MessageID(1, 3) < MessageID(2, 0)
    assert len({MessageID(1, 2), MessageID(1, 2)}) == 1
    assert MessageID.parse("17:3") == MessageID(17, 3)
    assert MessageID.parse("2026-11-22T10:00+00:00") == MessageID.from_datetime(when)
    with pytest.raises(ValueError, match="not a message ID"):
        MessageID.parse("soon")


def test_a_datetime_is_its_exact_millisecond_both_ways():
    """timestamp() * 1000 is a float: 1 in 5 of 2038's milliseconds came out one early (a
    timer due before the time asked, in the API, the CLI's --at and the shell's AT alike),
    and a timestamp shown from about 2300 on was a millisecond off (an attacker's pass)."""
    asked = datetime(2038, 7, 13, 13, 48, 9, 588000, tzinfo=UTC)
    assert MessageID.from_datetime(asked).timestamp == 2162641689588
    for ms in (2162641689588, 1, 4102444800123, 10_000_000_000_001, 253402300799999):
        assert MessageID(ms).datetime == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
        assert MessageID.from_datetime(MessageID(ms).datetime).timestamp == ms


def test_message_takes_str_or_bytes_topics_and_bytes_values():
    message = Message("crawler", b"http://a")
    assert (message.topic, message.value, message.id, message.partition_id) == (b"crawler", b"http://a", None, None)
    assert Message(b"crawler", bytearray(b"x")).value == b"x"


def test_a_topic_given_as_str_compares_equal_to_it_when_it_comes_back():
    # Given a topic written as str, and one as bytes
    message, raw = Message("crawler", b"x"), Message(b"crawler", b"x")
    # Then it is the bytes stored, and equal to the str too (never a silent False)
    assert message.topic == "crawler" and message.topic == b"crawler" and raw.topic == "crawler"
    assert message.topic != "other" and message.topic != b"other" and not (message.topic != "crawler")
    assert isinstance(message.topic, bytes) and message.topic.decode() == "crawler" and len(message.topic) == 7
    assert message.topic in ("crawler", "x") and message.topic in {b"crawler"} and message.topic in {"crawler"}
    assert str(message.topic) == "crawler" and repr(message.topic) == "b'crawler'"
    assert Message("café", b"x").topic == "café" and Message("café", b"x").topic == "café".encode()
    assert Message(b"t\xfe", b"x").topic != "t\ufffd" and str(Message(b"t\xfe", b"x").topic) == "t\\xfe"
    assert pickle.loads(pickle.dumps(message)) == message  # and it round-trips, as the wire does


@pytest.mark.parametrize(
    "topic, value, error",
    [
        ("", b"x", InvalidMessage),
        (b"", b"x", InvalidMessage),
        (1, b"x", TypeError),
        ("t", "text", TypeError),
        ("t", None, TypeError),
    ],
)
def test_message_rejects_bad_topics_and_values(topic, value, error):
    with pytest.raises(error):
        Message(topic, value)


def test_stored_messages_decode_from_cells_and_pickle():
    (message,) = messages_from_columns([encode_rowkey(3, MessageID(10, 1)) + b"topic"], [b"payload"])
    assert (message.partition_id, message.id, message.topic, message.value) == (
        3,
        MessageID(10, 1),
        b"topic",
        b"payload",
    )
    assert message == Message("topic", b"payload", id=MessageID(10, 1), partition_id=3)
    assert pickle.loads(pickle.dumps(message)) == message


@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1, 255, 256, 300, 32766]), st.binary(min_size=10, max_size=10)),
        max_size=40,
    ).map(lambda pairs: [pid.to_bytes(2, "big") + id_ for pid, id_ in pairs])
)
def test_concatenated_receipts_are_the_same_ids_by_partition_as_a_list_of_them(rowkeys):
    """The wire's packed receipts are cut into IDs without a rowkey made of each (one
    partition's: one struct call): the same partitions, the same IDs in order, each once."""
    by_partition = ids_by_partition(PackedReceipts(b"".join(rowkeys)))
    assert by_partition == ids_by_partition(rowkeys)
    assert list(by_partition) == list(dict.fromkeys(int.from_bytes(k[:2], "big") for k in rowkeys))
    for pid, ids in by_partition.items():
        assert ids == list(dict.fromkeys(k[2:] for k in rowkeys if int.from_bytes(k[:2], "big") == pid))


@pytest.mark.parametrize(
    ("receipts", "error"),
    [
        (PackedReceipts(b"x" * 13), InvalidArgument),
        ([b"x" * 11], InvalidArgument),
        ([b"x" * 12, "x" * 12], TypeError),
        (b"x" * 12, TypeError),
        (b"x" * 24, TypeError),
    ],
)
def test_a_receipt_that_is_not_a_12_byte_rowkey_is_refused(receipts, error):
    """(Plain bytes too, as a remote client refuses them: only the wire's are packed.)"""
    with pytest.raises(error, match="12-byte rowkey"):
        ids_by_partition(receipts)


def test_many_concatenated_receipts_of_one_partition_are_cut_like_a_list_of_them():
    """Past the counts cut by one struct call (1,000), the receipts are sliced one by one."""
    rowkeys = [b"\x00\x07" + i.to_bytes(10, "big") for i in range(1_500)]
    assert ids_by_partition(PackedReceipts(b"".join(rowkeys))) == {7: [k[2:] for k in rowkeys]}
