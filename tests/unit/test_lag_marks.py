"""The lag book's marks: from which ID a tally sees every batch, of any topic and of the
topics readers filter on (hqueue/lag.py)."""

from hqueue.lag import Tally
from hqueue.message import MessageID


def mid(n: int) -> MessageID:
    return MessageID(1_700_000_000_000 + n, 0)


def test_a_tally_begun_at_a_known_end_knows_nothing_waits_before_its_first_batch():
    tally = Tally(mid(10).to_bytes(), mid(10).to_bytes())  # (a seed's: the partition's end read)
    tally.add(mid(20), [b"t"])
    assert tally.first_from(mid(11).to_bytes()) == mid(20).to_bytes()  # nothing between
    assert tally.first_from(mid(5).to_bytes()) is None  # before what it saw: not known
    assert Tally(None, b"").first_from(mid(1).to_bytes()) == b""  # an empty partition


def test_a_tally_begun_by_an_append_does_not_know_what_came_before():
    tally = Tally(None)  # (an append's, before its add: what came before is not known)
    tally.watch([b"t"])  # (a seed in that gap)
    tally.add(mid(20), [b"t"])
    assert tally.first_from(mid(1).to_bytes()) is None
    assert tally.first_from(mid(1).to_bytes(), [b"t"]) is None  # not "none waiting" (a review)


def test_a_topic_filters_first_is_its_topics_batch_and_marks_are_trimmed_with_their_floor():
    tally = Tally(mid(0).to_bytes(), mid(0).to_bytes())
    tally.watch([b"news"])
    tally.add(mid(10), [b"sport"])
    tally.add(mid(20), [b"news"])
    cursor = mid(5).to_bytes()
    assert tally.first_from(cursor) == mid(10).to_bytes()
    assert tally.first_from(cursor, [b"news"]) == mid(20).to_bytes()
    for n in range(100, 100 + 4096):  # (past every mark kept: the oldest are let go)
        tally.add(mid(n), [b"sport"])
    assert tally.first_from(cursor) is None  # older than the batches kept
    assert tally.first_from(cursor, [b"news"]) == mid(20).to_bytes()  # its own marks still hold it
