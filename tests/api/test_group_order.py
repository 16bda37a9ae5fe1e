"""Key order in a consumer group (issue 19.3): key affinity, members that are gone, nacks.

Runs on every storage backend and through a server (``make_queue``); the
liveness timeout runs on an embedded store and on a server started with a
short one, and a closed connection on a server.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict

import pytest

from hqueue import GroupLimits, GroupNotFound, HQueue, HQueueAdmin, InvalidArgument, Message
from hqueue.api import groups_of
from hqueue.server import HQueueServer

from ..processes import drain, queue_with_group_limits, wait_for


def topics(deliveries) -> list[str]:
    return [d.value.decode() for d in deliveries]


def test_a_key_s_later_messages_go_only_to_the_member_holding_an_earlier_one(make_queue):
    # Given a group keeping topics in order, and two members sharing one partition
    queue = make_queue(partitions=1)
    queue.put([Message(t, b"%s%d" % (t.encode(), i)) for i in (1, 2) for t in ("a", "b")], 0)
    with (
        queue.consumer("g", member="m1", key_affinity="topic") as m1,
        queue.consumer("g", member="m2") as m2,
    ):
        # When m1 takes a1 and m2 asks for everything
        first = m1.receive(1, wait=2)
        assert topics(first) == ["a1"]
        # Then m2 gets b's messages only: a2 waits for the member holding a1
        assert topics(m2.receive(10, wait=0.5)) == ["b1", "b2"]
        assert m2.receive(10, wait=0.3) == []
        described = groups_of(queue.engine).describe(queue.name, "g")  # the state this process holds
        assert described["key_affinity"] == "topic" and described["partitions"][0]["held_back"] == 1
        later = m1.receive(10, wait=2)
        assert topics(later) == ["a2"]
        # And once m1 has acked a's messages, anyone may have the next of a
        assert m1.ack(first + later) == 2
        queue.put(Message("a", b"a3"), 0)
        assert topics(drain(m2, 1)) == ["a3"]


def test_a_nacked_message_holds_its_key_back_until_it_is_acked(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("a", b"a%d" % i) for i in range(1, 4)] + [Message("b", b"b1")], 0)
    with (
        queue.consumer("g", member="m1", key_affinity="topic") as m1,
        queue.consumer("g", member="m2") as m2,
    ):
        (a1,) = m1.receive(1, wait=2)
        # When m1 fails a1, to be retried in a second
        assert m1.nack(a1, delay=1.0) == 1
        # Then nobody gets a2 or a3 meanwhile; other keys go on
        assert topics(m2.receive(10, wait=0.3)) == ["b1"]
        described = groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]
        assert (described["retrying"], described["held_back"]) == (1, 2)
        # And a1 comes back first, then the rest, in order
        again = drain(m2, 3, timeout=10)
        assert topics(again) == ["a1", "a2", "a3"] and again[0].attempt == 2


def test_a_member_that_leaves_gives_its_keys_to_the_next_in_order(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("k", b"%d" % i) for i in range(6)], 0)
    m2 = queue.consumer("g", member="m2", key_affinity="partition")
    with queue.consumer("g", member="m1") as m1:
        assert topics(m1.receive(3, wait=2)) == ["0", "1", "2"]
        assert m2.receive(10, wait=0.3) == []  # the partition's messages are m1's while it holds some
    assert topics(drain(m2, 6)) == ["0", "1", "2", "3", "4", "5"]  # m1 left: from its first, in order
    m2.close()


def test_an_existing_group_keeps_its_key_affinity(make_queue):
    queue = make_queue(partitions=1)
    queue.consumer("plain").close()
    with pytest.raises(InvalidArgument, match="key order"):
        queue.consumer("plain", key_affinity="topic")
    with pytest.raises(InvalidArgument, match="key_affinity"):
        queue.consumer("other", key_affinity="value")
    queue.consumer("ordered", key_affinity="topic").close()
    queue.consumer("ordered").close()  # None: as the group is


def test_members_that_come_and_go_nack_and_ack_never_put_a_key_out_of_order(make_queue):
    # Given a group keeping topics in order, 400 messages of 8 keys on 2 partitions, and
    # members that handle what they hold in order: on a failure they nack it, and give
    # back the later messages of its key they hold (a Processor keeps those itself)
    queue = make_queue(partitions=2)
    for pid in (0, 1):
        queue.put([Message(f"k{i % 8}", b"%d:%03d" % (i % 8, i)) for i in range(200)], pid)
    rng = random.Random(19)
    queue.consumer("g", key_affinity="topic", max_retries=10_000).close()  # failures never dead-letter here
    members = {name: queue.consumer("g", member=name) for name in ("m0", "m1", "m2")}
    held: dict[str, list] = defaultdict(list)
    acked: dict[tuple[int, bytes], list] = defaultdict(list)
    inversions = 0

    def step() -> bool:
        nonlocal inversions
        name = rng.choice(sorted(members))
        member = members[name]
        roll = rng.random()
        if roll < 0.03:  # the member leaves: what it holds goes back
            member.close()
            held.pop(name, None)
            members[name] = queue.consumer("g", member=name)
            return False
        if roll < 0.4 or not held[name]:
            # a short wait: the members share this thread, and one with nothing to take only idles it
            held[name] += member.receive(rng.randint(1, 20), wait=0.01)
            return False
        delivery = held[name].pop(0)
        key = (delivery.partition_id, delivery.topic)
        if rng.random() < 0.1:  # it fails: retried later, and its key's later messages wait behind it
            same = [d for d in held[name] if (d.partition_id, d.topic) == key]
            held[name] = [d for d in held[name] if d not in same]
            member.nack([delivery], delay=rng.choice([0, 0.05]))
            if same:
                member.nack(same, delay=0)
            return False
        if member.ack(delivery):
            done = acked[key]
            inversions += bool(done and done[-1] > delivery.id)
            done.append(delivery.id)
        return sum(map(len, acked.values())) == 400

    # When they work until every message is acked
    wait_for(step, 120, "every message acked", interval=0)
    for member in members.values():
        member.close()
    # Then each key's messages were acked in order
    assert inversions == 0
    assert all(ids == sorted(ids) for ids in acked.values())


# -- members that are gone --------------------------------------------------------------------


@pytest.fixture(params=["embedded", "remote"])
def short_timeout(request, tmp_path):
    """A URL whose group members are gone after 3 s of silence (leases of a minute)."""
    limits = GroupLimits(member_timeout=3.0)
    with queue_with_group_limits(request, tmp_path, limits) as (queue, _):
        yield queue


def test_a_silent_member_s_leases_end_after_the_member_timeout_not_the_lease(short_timeout):
    queue = short_timeout
    queue.put([Message("k", b"%d" % i) for i in range(4)], 0)
    queue.consumer("g", key_affinity="topic").close()
    groups = groups_of(queue.engine)
    # Given a member that took two messages for a minute, and then went silent (no heartbeat)
    assert len(groups.receive("q", "g", "ghost", 2, 60.0, 2.0)) == 2
    with queue.consumer("g", member="alive") as alive:
        assert alive.receive(10, wait=0.5) == []  # its key is the ghost's
        # Then after the member timeout they go out again, first, as failed deliveries
        got = drain(alive, 4, timeout=30)
        assert topics(got) == ["0", "1", "2", "3"]
        assert [d.attempt for d in got] == [2, 2, 1, 1]


def test_a_member_heartbeating_keeps_its_leases_while_it_works(short_timeout):
    queue = short_timeout
    queue.put([Message("k", b"0")], 0)
    with queue.consumer("g", member="slow", key_affinity="topic") as slow:
        (held,) = slow.receive(1, wait=2)
        with queue.consumer("g", member="other") as other:
            assert other.receive(1, wait=5) == []  # past the member timeout: slow is still there
        assert slow.ack(held) == 1


def test_a_member_whose_connection_closes_is_gone_within_seconds(tmp_path):
    # Given a server whose members would be found silent only after a minute
    limits = GroupLimits(member_timeout=60.0)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, group_limits=limits).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue, queue.consumer("g", member="alive", key_affinity="topic") as alive:
            queue.put([Message("k", b"%d" % i) for i in range(3)], 0)
            # When a member takes messages, and its process's connections close (no leave)
            dying = HQueue("q", url)
            assert len(groups_of(dying.engine).receive("q", "g", "dying", 2, 60.0, 2.0)) == 2
            assert alive.receive(10, wait=0.3) == []
            dying.close()
            # Then its leases end after the grace (GONE_GRACE): well before the lease or the member timeout
            got = drain(alive, 3, timeout=10)
            assert topics(got) == ["0", "1", "2"] and [d.attempt for d in got] == [2, 2, 1]
    finally:
        server.stop()


def test_a_member_that_calls_again_on_another_connection_keeps_its_leases(tmp_path):
    """The asyncio client's pool keeps 16 idle connections and closes the others: when it
    closed the one a member had called on, the server took the member for dead and counted a
    failed delivery for each message it held (an attack: 100 of 100 at attempt 2, given to
    others while the member still worked on them; its leave came after its connection's close)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, group_limits=GroupLimits(member_timeout=60.0)).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue, HQueue("q", url) as other:
            queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
            queue.consumer("g").close()  # (the group)
            # Given a member that took messages on one connection, which then closed
            first = HQueue("q", url)
            assert len(groups_of(first.engine).receive("q", "g", "worker", 2, 60.0, 2.0)) == 2
            first.close()
            # When the member calls again at once, on another connection (its heartbeat)
            groups_of(other.engine).heartbeat("q", "g", "worker")
            time.sleep(3.5)  # past the grace
            # Then it still holds its leases: another member gets only the third message, first delivery
            with queue.consumer("g", member="next") as later:
                got = drain(later, 1, timeout=5)
                assert topics(got) == ["2"] and got[0].attempt == 1
                assert later.receive(10, wait=0.5) == [] and later.ack(got) == 1
            assert {(p.member, p.attempt) for p in queue.pending("g")} == {("worker", 1)}
    finally:
        server.stop()


def test_hostile_group_calls_get_typed_errors_over_the_wire(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            engine = queue.engine
            with pytest.raises(InvalidArgument, match="key_affinity"):
                engine._call("openGroup", "q", "g", None, 0, 16, "value", queue="q")
            with pytest.raises(GroupNotFound):
                engine._call("groupHeartbeat", "q", "nobody", "m", queue="q")
            queue.consumer("g").close()
            with pytest.raises(InvalidArgument, match="member"):
                engine._call("groupHeartbeat", "q", "g", "", queue="q")
            for i in range(50):  # made-up members on one connection: answered, nothing held
                engine._call("groupHeartbeat", "q", "g", f"ghost-{i}", queue="q")
            assert queue.put(Message("t", b"still"), 0)  # the server goes on
    finally:
        server.stop()


def test_a_held_back_message_gone_past_its_ttl_leaves_the_others_in_place(make_queue):
    """Handing out held-back messages, one found gone (TTL) was finished at once, while the
    others taken with it were neither leased nor held back yet: the group's cursor moved
    past them, and the ack of one just handed out counted for nothing (a review)."""
    queue = make_queue(partitions=1, ttl=1)
    queue.put(Message("t", b"m1"), partition_id=0)
    queue.put(Message("t", b"m2"), partition_id=0)
    time.sleep(0.7)
    queue.put(Message("t", b"m3"), partition_id=0)
    with (
        queue.consumer("g", key_affinity="partition", member="a") as a,
        queue.consumer("g", key_affinity="partition", member="b") as b,
    ):
        (m1,) = a.receive(1, wait=0)  # a holds the partition's key
        assert m1.value == b"m1"
        assert b.receive(10, wait=0) == []  # m2 and m3 are read, and held back
        time.sleep(0.5)  # m2 is past its TTL, m3 is not
        assert a.ack(m1) == 1
        got = a.receive(10, wait=0)
        assert [d.value for d in got] == [b"m3"]
        assert a.ack(got) == 1


def test_no_note_of_held_back_messages_is_kept_once_the_marks_are_cleared(tmp_path):
    """After a clean stop or a hand-over cleared the hand-out marks, receives that hold
    messages back kept a list of them to note with a mark never written again."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put([Message("a", b"a%d" % i) for i in range(50)], 0)
        with (
            queue.consumer("g", member="x", key_affinity="topic") as x,
            queue.consumer("g", member="y") as y,
        ):
            assert topics(x.receive(1, wait=2)) == ["a0"]
            groups = groups_of(queue.engine)
            groups._clear_out_marks()  # (what a clean stop, or a rebalance's hand-over, does)
            assert y.receive(100, wait=0) == []
            state = groups._groups[("q", "g")].partitions[0]
            assert state.affinity is not None and len(state.affinity.back_ids) == 49
            assert state.back_unmarked == []
