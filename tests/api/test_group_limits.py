"""What a consumer group takes from its members, as an attacker would try it
(issue 18): acks of receipts the group never handed out, leases of hours, one
member holding everything.

Runs on every storage backend and through a server (``make_queue``); the
tests of smaller limits run on an embedded store (``group_limits=``) and on a
server started with them.
"""

from __future__ import annotations

import threading
import time

import pytest

from hqueue import GroupLimits, HQueue, HQueueAdmin, InvalidArgument, LimitExceeded, Message, MessageID
from hqueue.api import groups_of
from hqueue.groups import service as group_service
from hqueue.groups.state import HEAP_SLACK, MAX_ACKED_AHEAD
from hqueue.message import encode_rowkey

from ..processes import drain, queue_with_group_limits, wait_for


def made_up_receipts(count: int, partition_id: int = 0) -> list[bytes]:
    """Receipts of messages far in the future: never written, never handed out."""
    base = 4_000_000_000_000  # the year 2096
    return [encode_rowkey(partition_id, MessageID(base + i // 32_000, i % 32_000)) for i in range(count)]


# -- acks (18.5) ------------------------------------------------------------------------------


def test_acks_of_messages_never_received_are_ignored_and_the_group_still_delivers_them(make_queue):
    # Given 20 messages, of which a member received the first 5
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    stored = list(queue.scan())
    with queue.consumer("g", member="a") as consumer:
        received = drain(consumer, 5)
        assert len(received) == 5
        # When it acks 10 messages it never received (real IDs of the queue)
        never_received = stored[10:20]
        assert consumer.ack(never_received) == 0
        # Then the group still delivers those 10 (and the 5 between)
        rest = drain(consumer, 15)
        assert sorted(d.value for d in rest) == sorted(m.value for m in stored[5:20])
        assert consumer.ack(received + rest) == 20
        assert consumer.receive(10, wait=0.2) == []


def test_one_ack_of_200000_made_up_receipts_keeps_nothing(make_queue):
    # Given a group with one message in flight
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
    with queue.consumer("g") as consumer:
        (held, *_) = drain(consumer, 3)
        groups = groups_of(queue.engine)
        # When one call acks 200,000 receipts the group never handed out
        assert groups.ack(queue.name, "g", made_up_receipts(100_000, 0) + made_up_receipts(100_000, 1)) == 0
        # Then nothing of them is kept: no acked ID ahead of the cursor in any partition
        described = groups.describe(queue.name, "g")
        assert {pid: p["acked_ahead"] for pid, p in described["partitions"].items()} == {0: 0, 1: 0}
        # and the real receipts still count
        assert consumer.ack(held) == 1


def test_a_made_up_ack_is_stored_nowhere_in_the_store(tmp_path):
    # Given an embedded store whose group has state in partition 0
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        admin.create_queue("q", 1)
        with admin.queue("q") as queue:
            queue.put([Message("t", b"x")], 0)
            with queue.consumer("g") as consumer:
                consumer.ack(drain(consumer, 1))
                storage = queue.engine.storage
                before = storage.list_meta("group-state/q/")
                # When 200,000 made-up receipts are acked
                assert groups_of(queue.engine).ack("q", "g", made_up_receipts(200_000)) == 0
                # Then the store holds exactly what it held before
                assert storage.list_meta("group-state/q/") == before


def test_a_member_cannot_dead_letter_a_message_the_group_never_handed_out(make_queue, admin):
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
    victim = list(queue.scan())[2]
    with queue.consumer("g") as consumer:
        assert consumer.dead_letter(victim) == 0  # never received: not the caller's to fail
        assert sorted(d.value for d in drain(consumer, 3)) == [b"0", b"1", b"2"]


# -- leases and fairness (18.6) ---------------------------------------------------------------


def test_a_member_that_never_acks_cannot_starve_the_other(make_queue):
    # Given one partition shared by two members, and 10,000 messages
    queue = make_queue(partitions=1)
    for start in range(0, 10_000, 2_000):
        queue.put([Message("old", b"%d" % i) for i in range(start, start + 2_000)], 0)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        b.nack(b.receive(1, wait=1), delay=0)  # b is a member from now on (and gives back what it got)
        # When a asks for 10,000 messages for an hour, again and again, and never acks
        hoarded = []
        for _ in range(3):
            hoarded += a.receive(10_000, wait=0, lease=3600)
        assert 0 < len(hoarded) <= 1_000  # the default per-member cap
        # Then b still gets every one of 5,000 new messages
        queue.put([Message("new", b"n%d" % i) for i in range(5_000)], 0)
        new: set[bytes] = set()

        def take() -> bool:
            got = b.receive(1_000, wait=0.2)
            b.ack(got)
            new.update(d.value for d in got if d.topic == b"new")
            return len(new) == 5_000

        wait_for(take, 120, "b to get the 5,000 new messages", interval=0)


def test_a_member_that_never_acks_cannot_keep_its_partition_from_the_others(make_queue):
    # Given two partitions and two members: partition 0 is a's, partition 1 is b's
    queue = make_queue(partitions=2)
    queue.put([Message("old", b"%d" % i) for i in range(2_000)], 0)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        hoarded = a.receive(1, wait=1, lease=3600)
        assert b.receive(1, wait=0.2) == []  # b is a member from now on (its partition is empty)
        # When a leases all it may of partition 0 for an hour and never acks
        for _ in range(3):
            hoarded += a.receive(10_000, wait=0, lease=3600)
        assert len(hoarded) == 1_000  # the default per-member cap
        # Then b gets the rest of partition 0, and 2,000 new messages put there
        queue.put([Message("new", b"n%d" % i) for i in range(2_000)], 0)
        taken: set[bytes] = set()

        def take() -> bool:
            assert a.receive(10_000, wait=0, lease=3600) == []  # a stays a live member, holding all it may
            got = b.receive(1_000, wait=0.2)
            b.ack(got)
            taken.update(d.value for d in got)
            return len(taken) == 3_000

        wait_for(take, 60, "b to get the 3,000 messages a does not hold", interval=0)
        assert not taken & {d.value for d in hoarded}


def test_by_default_a_lease_is_at_most_a_minute_as_kafka_share_groups_lock(make_queue):
    # Kafka's share groups lock a record 30 s and at most 60 s (group.share.max.record.lock.duration.ms);
    # a member still working renews its lease (extend), as the Processor does
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"x")], 0)
    with queue.consumer("g", member="a") as a:
        (held,) = drain(a, 1)
        assert 25 < queue.pending("g")[0].lease_left <= 30  # the default lease
        a.extend(held, lease=7 * 86400)
        assert 55 < queue.pending("g")[0].lease_left <= 60  # a week asked: a minute given


@pytest.fixture(params=["embedded", "remote"])
def limited(request, tmp_path):
    """A URL whose groups lease for at most 1 s and let a member hold 3 messages, 3 groups a queue."""
    limits = GroupLimits(max_lease=1.0, max_member_in_flight=3, max_groups=3)
    with queue_with_group_limits(request, tmp_path, limits) as (queue, _):
        yield queue


def test_a_lease_longer_than_the_maximum_is_shortened_and_the_message_goes_out_again(limited):
    limited.put([Message("t", b"x")], 0)
    with limited.consumer("g", member="a") as a, limited.consumer("g", member="b") as b:
        (held,) = a.receive(1, wait=2, lease=7 * 86400)  # a week asked
        (pending,) = limited.pending("g")
        assert pending.lease_left <= 1.0  # one second given
        again = drain(b, 1, timeout=10)  # a never acks: it comes back within the maximum
        assert [d.value for d in again] == [b"x"] and again[0].attempt == 2
        assert a.ack(held) == 1  # the receipt is the message's: it still counts


def test_a_nack_delay_is_no_longer_than_the_maximum_lease(limited):
    limited.put([Message("t", b"x")], 0)
    with limited.consumer("g") as consumer:
        assert consumer.nack(drain(consumer, 1), delay=7 * 86400) == 1
        (pending,) = limited.pending("g")
        assert pending.retry_in is not None and pending.retry_in <= 1.0


def test_a_receive_returns_at_most_what_the_member_may_still_hold(limited):
    limited.put([Message("t", b"%d" % i) for i in range(10)], 0)
    with limited.consumer("g", member="a") as a, limited.consumer("g", member="b") as b:
        started = time.monotonic()
        first = a.receive(10, wait=2, lease=60)  # (leased 1 s: the server's max_lease)
        assert len(first) == 3
        assert a.receive(10, wait=0.2, lease=60) == []  # holds its 3: no more
        assert len(b.receive(10, wait=2)) == 3  # the others still get work
        a.ack(first[:2])
        again = a.receive(10, wait=2)
        if time.monotonic() - started < 0.9:  # its third lease still held (a slow machine: it ran out)
            assert len(again) == 2  # room for two again
        else:
            assert len(again) <= 3


@pytest.fixture(params=["embedded", "remote"])
def capped(request, tmp_path, monkeypatch):
    """A queue whose members hold at most 3 messages each, and its group service; its waiting
    receives look again only when woken (or after 60 s): what wakes them is all a test sees."""
    monkeypatch.setattr(group_service, "RECHECK", 60.0)
    limits = GroupLimits(max_member_in_flight=3)
    with queue_with_group_limits(request, tmp_path, limits) as queue_and_groups:
        yield queue_and_groups


def waiting_receive(consumer, groups, want: int, waiting: int = 1) -> tuple[threading.Thread, list]:
    """A receive of ``want`` waiting up to 30 s in a thread (once the service has it
    waiting, the ``waiting``-th: the member holds all it may, or the key's message is out),
    and the list it fills."""
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(consumer.receive(want, wait=30)), daemon=True)
    thread.start()
    wait_for(lambda: groups.arrivals.waiting("q") == waiting, 10, "the receive to wait")
    assert thread.is_alive() and not got
    return thread, got


def counted_looks(groups, monkeypatch) -> list[str]:
    """The members whose receives look for messages, one entry a look, from now on."""
    looks: list[str] = []
    take = groups._take
    monkeypatch.setattr(
        groups, "_take", lambda group, member, *rest: (looks.append(member), take(group, member, *rest))[1]
    )
    return looks


@pytest.mark.parametrize("finish", ["ack", "nack", "dead_letter"])
def test_a_member_at_its_cap_waiting_in_a_receive_gets_the_room_its_ack_gives_at_once(capped, finish):
    # Given a member holding the 3 messages it may, waiting in a receive for more
    queue, groups = capped
    queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
    with queue.consumer("g", member="a") as a:
        held = a.receive(10, wait=2)
        assert len(held) == 3
        thread, got = waiting_receive(a, groups, 10)
        # When it finishes one of them (from another thread, as a Processor's commits do)
        assert getattr(a, finish)(held[:1]) == 1
        # Then the waiting receive takes the room now, not at its next look (60 s here)
        thread.join(10)
        assert not thread.is_alive() and len(got) == 1


def test_an_ack_that_frees_nothing_anyone_waits_for_wakes_nobody(capped):
    # (50 members waiting on an empty queue while one acked cost the server 3.2 ms an ack,
    # each ack setting all of them looking: an attacker's pass)
    queue, groups = capped
    queue.put([Message("t", b"1"), Message("t", b"2")], 0)
    with queue.consumer("g", member="a") as a:
        held = a.receive(2, wait=2)
        seen = groups.arrivals.seen("q", "g", "a")
        assert a.ack(held[:1]) == 1  # holding 2 of the 3 it may: no one is at a cap
        assert groups.arrivals.seen("q", "g", "a") == seen


def test_an_ack_giving_a_member_at_its_cap_room_wakes_its_receives_and_no_other_member_s(capped, monkeypatch):
    # (50 members waiting on a drained queue were each set looking by every ack of a member
    # at its cap, which frees nothing for them: 5 ms of server CPU an ack, bench/group_abuse.py)
    queue, groups = capped
    looks = counted_looks(groups, monkeypatch)
    queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        # Given a at its cap (3), and b holding the other 2 and waiting for more of the drained queue
        held = a.receive(10, wait=2)
        assert len(held) == 3 and len(b.receive(10, wait=2)) == 2
        thread, got = waiting_receive(b, groups, 10)
        looked = looks.count("b")
        # When a acks one, and then waits for more itself, and acks another
        assert a.ack(held[:1]) == 1
        assert a.receive(10, wait=0) == []  # (room, but nothing left to take)
        waiting_a, got_a = waiting_receive(a, groups, 10, waiting=2)
        assert a.ack(held[1:2]) == 1
        # Then b did not look again; a's receive did not wake either (a was not at its cap)
        time.sleep(0.2)
        assert looks.count("b") == looked and thread.is_alive() and waiting_a.is_alive()
        # and a write wakes both: one of them gets it
        queue.put(Message("t", b"new"), 0)
        wait_for(lambda: len(got) + len(got_a) == 1, 10, "the new message to be taken")
    thread.join(10)  # (the other ends as its member leaves)
    waiting_a.join(10)
    assert not thread.is_alive() and not waiting_a.is_alive()


@pytest.fixture(params=["embedded", "remote"])
def capped_two(request, tmp_path, monkeypatch):
    """:func:`capped`, on a queue of 2 partitions."""
    monkeypatch.setattr(group_service, "RECHECK", 60.0)
    with queue_with_group_limits(request, tmp_path, GroupLimits(max_member_in_flight=3), 2) as queue_and_groups:
        yield queue_and_groups


def test_a_member_reaching_its_cap_hands_its_partitions_to_a_member_waiting_at_once(capped_two, monkeypatch):
    # (the waiting member looked again only at its next recheck, a second by default)
    queue, groups = capped_two
    looks = counted_looks(groups, monkeypatch)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        # Given b waiting on its partition (1, empty), a reading partition 0, which has 5
        assert a.receive(10, wait=0) == []  # (a is a member)
        thread, got = waiting_receive(b, groups, 10)
        looked = looks.count("b")
        queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
        # (the write wakes b, which finds nothing on its partition, and waits again)
        wait_for(lambda: looks.count("b") > looked and groups.arrivals.waiting("q") == 1, 10, "b to wait again")
        # When a takes the 3 it may hold
        assert len(a.receive(10, wait=2)) == 3
        # Then partition 0 is b's while a is at its cap: b takes the other 2 at once
        thread.join(10)
        assert not thread.is_alive() and sorted(d.value for d in got) == [b"3", b"4"]


def test_a_capped_member_s_ack_hands_a_waiting_member_the_partition_it_then_reads(capped_two):
    # (only the acking member's receives were woken, but the members share the partitions
    # out again once it has room: an attacker's pass)
    queue, groups = capped_two
    with (
        queue.consumer("g", member="a") as a,
        queue.consumer("g", member="b") as b,
        queue.consumer("g", member="x") as x,
    ):
        # Given a, b, x over 2 partitions (a and x read 0, b reads 1), and a at its cap
        for consumer in (a, b, x):
            assert consumer.receive(10, wait=0) == []
        queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
        held = a.receive(10, wait=2)
        assert len(held) == 3
        # (while a is at its cap, b reads 0 and x reads 1)
        queue.put(Message("t", b"p1"), 1)
        thread, got = waiting_receive(b, groups, 10)
        # When a acks one, it reads again: b's partition is 1 again, with a message there
        assert a.ack(held[:1]) == 1
        # Then b takes it at once (not at its next recheck: 60 s here)
        thread.join(10)
        assert not thread.is_alive() and [d.value for d in got] == [b"p1"]


@pytest.fixture(params=["embedded", "remote"])
def short_leases(request, tmp_path, monkeypatch):
    """Leases of a second at most; waiting receives look again only when woken (or at 60 s)."""
    monkeypatch.setattr(group_service, "RECHECK", 60.0)
    with queue_with_group_limits(request, tmp_path, GroupLimits(max_lease=1.0)) as queue_and_groups:
        yield queue_and_groups


def test_a_lease_running_out_reaches_a_member_waiting_for_its_message(short_leases):
    queue, groups = short_leases
    queue.put(Message("t", b"x"), 0)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        # Given a holding the message for a second, never acking, and b waiting for messages
        assert len(a.receive(1, wait=2)) == 1
        started = time.monotonic()
        got: list = []
        thread = threading.Thread(target=lambda: got.extend(b.receive(1, wait=20)), daemon=True)
        thread.start()
        # Then b gets it when the lease runs out, not at its wait's end (nor at 60 s)
        thread.join(15)
        assert [d.value for d in got] == [b"x"] and time.monotonic() - started < 10


@pytest.fixture(params=["embedded", "remote"])
def capped_short(request, tmp_path, monkeypatch):
    """Members hold 3 at most, for a second at most; receives look again only when woken (or at 60 s)."""
    monkeypatch.setattr(group_service, "RECHECK", 60.0)
    limits = GroupLimits(max_member_in_flight=3, max_lease=1.0)
    with queue_with_group_limits(request, tmp_path, limits) as queue_and_groups:
        yield queue_and_groups


def test_a_member_at_its_cap_gets_room_when_its_own_lease_runs_out(capped_short):
    # (its receive looked again only at its recheck: its look stopped before the leases)
    queue, _ = capped_short
    queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
    with queue.consumer("g", member="a") as a:
        assert len(a.receive(10, wait=2)) == 3  # at its cap, never acked
        started = time.monotonic()
        again = a.receive(10, wait=20)
        assert len(again) == 3 and {d.attempt for d in again} == {2}
        assert time.monotonic() - started < 10  # (its leases ran out after a second)


def test_a_key_in_order_waiting_for_its_ack_goes_out_when_it_comes(capped):
    queue, groups = capped
    # Given a group in key order, one key's first message leased to a, and b waiting for the next
    queue.put([Message("k", b"1"), Message("k", b"2")], 0)
    with (
        queue.consumer("g", member="a", key_affinity="topic") as a,
        queue.consumer("g", member="b", key_affinity="topic") as b,
    ):
        (first,) = a.receive(1, wait=2)
        thread, got = waiting_receive(b, groups, 1)
        # When a acks it, the key's next message goes to the member waiting, at once
        assert a.ack([first]) == 1
        thread.join(10)
        assert not thread.is_alive() and [d.value for d in got] == [b"2"]


def test_a_queue_has_at_most_max_groups_groups(limited):
    # Given a queue with its 3 groups (each one a consumer token may make costs the
    # server its state and metrics series on every partition: 5,000 took 177 MiB)
    for name in ("a", "b", "c"):
        limited.consumer(name).close()
    # When a fourth is made, it is refused whole, typed, naming the limit
    with pytest.raises(LimitExceeded, match="has 3 consumer groups") as refused:
        limited.consumer("d")
    assert refused.value.limit == "max_groups" and refused.value.value == 3
    # Then the existing ones open again, and one deleted leaves room
    limited.consumer("a").close()
    with HQueueAdmin(limited.url) as admin:
        assert admin.list_groups("q") == ["a", "b", "c"]
        admin.delete_group("q", "b")
    limited.consumer("d").close()


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_lease": 0}, "max_lease"),
        ({"max_lease": 8 * 86400}, "max_lease"),
        ({"max_member_in_flight": 0}, "max_member_in_flight"),
        ({"max_member_in_flight": True}, "max_member_in_flight"),
        ({"max_span": "10"}, "max_span"),
        ({"max_groups": 0}, "max_groups"),
        ({"member_timeout": 1}, "member_timeout"),
        ({"member_timeout": float("nan")}, "member_timeout"),
    ],
)
def test_bad_group_limits_are_refused(kwargs, error):
    with pytest.raises(InvalidArgument, match=error):
        GroupLimits(**kwargs)


def test_group_limits_are_for_a_store_in_this_process(tmp_path):
    with pytest.raises(InvalidArgument, match="hqueue server --max-lease"):
        HQueueAdmin("hqueue://127.0.0.1:1", group_limits=GroupLimits())


# -- memory: what an acked message leaves behind --------------------------------------------


def _heap_ids(queue: HQueue, group: str) -> int:
    state = groups_of(queue.engine)._group(queue.name, group).partitions[0]
    assert state.heap_ids == sum(len(ids) for _, _, ids in state.lease_heap)
    return state.heap_ids


def test_acked_messages_are_not_held_until_their_lease_would_have_ended(tmp_path):
    # Given a member that receives 100 at a time with the longest lease, and acks each batch
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        for _ in range(30):
            queue.put([Message("t", b"x")] * 1000, 0)
        with queue.consumer("g", lease=60) as consumer:
            # When it has taken 30,000 messages in a few seconds
            for _ in range(300):
                received = consumer.receive(100, wait=1)
                # (every lease before it ended: the deadlines kept are this batch's alone,
                # none looked through again)
                assert _heap_ids(queue, "g") == 100
                assert consumer.ack(received) == 100
                # Then the group holds no more than a bounded slack of their IDs (it held
                # every ID for its minute: 6M IDs, ~340 MB, at 100,000 msgs/s)
                assert _heap_ids(queue, "g") <= 2 * 100 + HEAP_SLACK


def test_leases_still_run_out_when_acked_ones_around_them_are_let_go(tmp_path):
    # Given a member b holding 5 messages unacked among messages a receives and acks
    limits = GroupLimits(max_lease=1.5)
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url, group_limits=limits) as queue:
        queue.put([Message("t", b"held-%d" % i) for i in range(5)], 0)
        queue.put([Message("t", b"x")] * 5000, 0)
        with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
            held = b.receive(5, wait=1, lease=1.5)
            assert {d.value for d in held} == {b"held-%d" % i for i in range(5)}
            # When a's acks make the heap prune many times, and b's extend moves its leases once
            for _ in range(25):
                a.ack(a.receive(100, wait=1))
            assert b.extend(held, lease=1.5) == 5
            for _ in range(25):
                a.ack(a.receive(100, wait=1))
            assert _heap_ids(queue, "g") <= 5 + 2 * 100 + HEAP_SLACK
            # Then b's 5, never acked, still go out again when their (extended) lease ends
            again = drain(a, 5, timeout=10)
            assert sorted(d.value for d in again) == sorted(d.value for d in held)
            assert {d.attempt for d in again} == {2}


def _one_then(tmp_path, thousands: int) -> str:
    """The URL of a store with a 1-partition queue "q": one message (b"first"), then
    ``thousands`` x 1,000 more."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"first")], 0)
        for _ in range(thousands):
            queue.put([Message("t", b"x")] * 1000, 0)
    return url


def test_one_unfinished_message_costs_a_bounded_state_and_still_goes_out_again_after_a_restart(tmp_path):
    # Given member b holding the first message, unacked
    url = _one_then(tmp_path, 30)
    with HQueue("q", url) as queue:
        with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
            (held,) = b.receive(1, wait=1, lease=60)
            # When a receives and acks the 30,000 after it
            for _ in range(300):
                assert a.ack(a.receive(100, wait=1)) == 100
            # Then the group keeps at most MAX_ACKED_AHEAD acks: past them, the cursor moved on
            # and keeps b's message as unfinished behind it (it kept every ack: ~70 bytes each)
            state = groups_of(queue.engine)._group(queue.name, "g").partitions[0]
            assert len(state.acked) <= MAX_ACKED_AHEAD and state.behind == {held.id.to_bytes()}
            assert state.done > held.id.to_bytes() and len(state.open) <= 1 + HEAP_SLACK
            described = groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]
            assert described["lag_messages"] == 1 and described["in_flight"] == 1  # b's: still lag
    # And after a restart (b's lease died with it), b's message goes out again, and only it
    with HQueue("q", url) as queue, queue.consumer("g", member="c") as c:
        again = drain(c, 1, timeout=10)
        assert [d.value for d in again] == [b"first"]
        assert c.receive(100, wait=0.5) == []
        assert c.ack(again) == 1
        state = groups_of(queue.engine)._group(queue.name, "g").partitions[0]
        assert not state.behind and not state.acked
    with HQueue("q", url) as queue, queue.consumer("g") as d:
        assert d.receive(100, wait=0.5) == []  # acked, stored: never again
        assert groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]["lag_messages"] == 0


def test_an_unfinished_message_behind_the_cursor_is_retried_and_dead_lettered_as_any(tmp_path):
    url = _one_then(tmp_path, 12)
    with HQueue("q", url) as queue:
        with queue.consumer("g", member="a", max_retries=1) as a, queue.consumer("g", member="b") as b:
            (held,) = b.receive(1, wait=1, lease=60)
            for _ in range(120):
                a.ack(a.receive(100, wait=1))
            state = groups_of(queue.engine)._group(queue.name, "g").partitions[0]
            assert state.behind == {held.id.to_bytes()}
            # When b fails it twice (its first delivery and its one retry)
            assert b.nack([held], delay=0) == 1
            (again,) = drain(b, 1, timeout=10)
            assert again.attempt == 2
            assert b.nack([again], delay=0) == 1
            # Then it goes to the dead-letter queue, and nothing of it is kept
            wait_for(lambda: not state.behind and not state.ready, 10, "the message to be dead-lettered")
            with HQueue("q.dlq", url) as dlq:
                assert [m.value for m in dlq.scan()] == [b"first"]


def test_acks_kept_after_an_unfinished_message_do_not_make_each_receive_read_more(tmp_path, monkeypatch):
    # Given member b holding the first message, and 20,000 acked after it by a
    url = _one_then(tmp_path, 40)
    with HQueue("q", url) as queue:
        with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
            b.receive(1, wait=1, lease=60)
            for _ in range(200):
                a.ack(a.receive(100, wait=1))
            # When a receives 100 more
            asked = []
            scan_columns = queue.engine.scan_columns

            def counted(name, start, stop, topics, limit, max_bytes=None):
                asked.append(limit)
                return scan_columns(name, start, stop, topics, limit, max_bytes)

            monkeypatch.setattr(queue.engine, "scan_columns", counted)
            assert len(a.receive(100, wait=1)) == 100
            # Then it reads about 100 cells from the store, not 20,100 (13 MB a receive at 100 bytes)
            assert asked and max(asked) <= 100


def test_acks_read_back_after_a_restart_are_never_dropped_by_the_cursor_s_jump(tmp_path):
    # Given M0 held by b, M1 and M2 by c, and the MAX_ACKED_AHEAD after them acked (no jump yet)
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"M%d" % i) for i in range(3)], 0)
        for _ in range(MAX_ACKED_AHEAD // 1000):
            queue.put([Message("t", b"x")] * 1000, 0)
        with queue.consumer("g", member="b") as b, queue.consumer("g", member="c") as c:
            assert len(b.receive(1, wait=1)) == 1 and len(c.receive(2, wait=1)) == 2
            with queue.consumer("g", member="a") as a:
                acked = 0
                while acked < MAX_ACKED_AHEAD:
                    acked += a.ack(a.receive(1000, wait=1))
    # When, after a restart, a member takes M0 and M1 and acks M1 (one ack past the limit,
    # with the scan below the acks read back from the store)
    with HQueue("q", url) as queue, queue.consumer("g", member="x") as x:
        assert [d.value for d in x.receive(1, wait=2)] == [b"M0"]
        second = x.receive(1, wait=2)
        assert [d.value for d in second] == [b"M1"] and x.ack(second) == 1
        # Then of what comes next, only M2 was never acked: nothing acked comes again
        rest = []
        while got := x.receive(1000, wait=0.5):
            rest += got
            x.ack(got)
        assert [d.value for d in rest] == [b"M2"]


@pytest.mark.parametrize("limits", [{"max_lease": 5}, {}, "x", 5])
def test_group_limits_of_the_wrong_type_are_refused_when_the_store_is_opened(tmp_path, limits):
    """They were taken, and the first consumer failed with AttributeError ({} went unseen)."""
    for url in (f"local://{tmp_path}/data", "memory://limits"):
        with pytest.raises(TypeError, match="'group_limits' must be a GroupLimits, not"):
            HQueueAdmin(url, group_limits=limits)
        with pytest.raises(TypeError, match="'group_limits' must be a GroupLimits"):
            HQueue("q", url, group_limits=limits)
