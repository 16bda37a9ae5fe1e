"""Consumer groups (SPEC X3) with retries and dead letters (SPEC X2).

Runs on every storage backend and through a server (``make_queue``).
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from hqueue import Delivery, GroupNotFound, HQueue, HQueueAdmin, InvalidArgument, Message, MessageID, QueueDisabled
from hqueue.api import groups_of
from hqueue.engine import Engine
from hqueue.groups.handout import RECEIVE_BYTES
from hqueue.groups.limits import MEMBER_TIMEOUT
from hqueue.groups.state import assigned
from hqueue.keys.groups import state_prefix

from ..processes import drain, wait_for


def values(deliveries: list[Delivery]) -> list[bytes]:
    return [d.value for d in deliveries]


def test_each_message_goes_to_one_member_and_an_acked_one_never_comes_back(make_queue):
    queue = make_queue(partitions=4)
    for pid in range(4):
        queue.put([Message("work", b"%d-%d" % (pid, i)) for i in range(25)], pid)
    with queue.consumer("workers", member="a") as a, queue.consumer("workers", member="b") as b:
        got_a = a.receive(1, wait=0)
        got_b = b.receive(1, wait=0)  # both are members now: each has its own partitions
        got_a += drain(a, 100, timeout=1)
        got_b += drain(b, 100, timeout=1)
        assert got_a and got_b
        assert not {d.rowkey for d in got_a} & {d.rowkey for d in got_b}
        assert a.ack(got_a) == len(got_a)
        assert b.ack(got_b) == len(got_b)
        rest = drain(a, 100, timeout=1) + drain(b, 100, timeout=1)
        b.ack([d for d in rest])
        a.ack([d for d in rest])
    total = {d.value for d in got_a + got_b + rest}
    assert len(total) == 100
    with queue.consumer("workers") as again:
        assert again.receive(100, wait=0.3) == []


@pytest.mark.parametrize("bad", [None, 5, b"x", "x"])
def test_an_ack_of_something_that_is_no_delivery_says_so(make_queue, bad):
    """ack(None) raised a bare "'NoneType' object is not iterable" (an attacker's probe)."""
    queue = make_queue(partitions=1)
    with queue.consumer("g") as consumer:
        for call in (consumer.ack, consumer.nack):
            with pytest.raises(TypeError, match=r"take received Deliveries \(or Messages with IDs\), not "):
                call(bad)


def test_every_group_gets_every_message(make_queue):
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
    with queue.consumer("billing") as billing, queue.consumer("shipping") as shipping:
        assert sorted(values(drain(billing, 10))) == sorted(values(drain(shipping, 10)))


def test_within_a_partition_messages_come_in_order_and_a_slow_one_never_blocks_new_ones(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
    with queue.consumer("g") as consumer:
        first = consumer.receive(1, wait=1)
        assert values(first) == [b"0"]  # held, never acked (a slow one)
        rest = drain(consumer, 4)
        assert values(rest) == [b"1", b"2", b"3", b"4"]
        consumer.ack(rest)
        queue.put(Message("t", b"5"), 0)
        assert values(consumer.receive(10, wait=2)) == [b"5"]


def test_a_nack_hands_the_message_out_again_and_the_attempt_counts_up(make_queue):
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"flaky"), 0)
    with queue.consumer("g") as consumer:
        (first,) = consumer.receive(1, wait=2)
        assert first.attempt == 1
        assert consumer.nack(first, delay=0) == 1
        (second,) = consumer.receive(1, wait=2)
        assert (second.id, second.attempt) == (first.id, 2)
        consumer.ack(second)
        assert consumer.receive(1, wait=0.2) == []


def test_a_message_given_back_goes_out_again_at_once_counting_no_failure(make_queue):
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"job"), 0)
    with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        (held,) = a.receive(1, wait=2)
        assert b.give_back(held) == 0  # not b's to give back
        assert a.give_back(held) == 1
        (again,) = b.receive(1, wait=2)
        assert (again.id, again.attempt) == (held.id, 1)
        assert a.give_back(held) == 0  # b has it now
        assert b.ack(again) == 1


def test_an_expired_lease_goes_to_another_member(make_queue):
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"job"), 0)
    with queue.consumer("g", member="crashed") as crashed:
        (held,) = crashed.receive(1, wait=2, lease=0.3)
        crashed.closed = True  # it dies without leaving: its lease has to run out
    with queue.consumer("g", member="survivor") as survivor:
        (again,) = drain(survivor, 1)
        assert (again.id, again.attempt) == (held.id, 2)
        assert survivor.ack(again) == 1


def test_a_member_renews_its_leases_and_keeps_its_messages_past_the_first_lease(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"long job"), Message("t", b"short job")], 0)
    with queue.consumer("g", member="slow") as slow, queue.consumer("g", member="other") as other:
        (long_job, short_job) = slow.receive(2, wait=2, lease=0.5)
        assert slow.extend(long_job, lease=5) == 1  # NATS's "in progress"
        assert other.extend(long_job, lease=5) == 0  # not the other member's to renew
        time.sleep(1.0)  # past the first lease: the short job went back, the long one did not
        (again,) = drain(other, 1)
        assert (again.id, again.attempt) == (short_job.id, 2)
        assert other.receive(10, wait=0.3) == []
        assert slow.extend(short_job) == 0  # ran out first: not renewed
        assert slow.ack(long_job) == 1 and other.ack(again) == 1
        assert slow.extend(long_job) == 0  # finished
        for bad in (0, -1, float("nan"), float("inf"), 86400 * 8, True, "5"):
            with pytest.raises(InvalidArgument):
                slow.extend(long_job, lease=bad)


def test_after_max_retries_failures_the_message_goes_to_the_dead_letter_queue(make_queue):
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"ok-1"), Message("t", b"poison"), Message("t", b"ok-2")], 1)
    attempts = 0
    with queue.consumer("g", max_retries=3) as consumer:
        done = []

        def handle_a_batch() -> bool:
            nonlocal attempts
            batch = consumer.receive(10, wait=0.2)
            for delivery in batch:
                if delivery.value == b"poison":
                    attempts += 1
                    consumer.nack(delivery, delay=0)
                else:
                    done.append(delivery.value)
                    consumer.ack(delivery)
            return not batch and len(done) == 2

        wait_for(handle_a_batch, 10, "the poison message to run out of retries", interval=0)
        assert consumer.receive(10, wait=0.3) == []
    assert sorted(done) == [b"ok-1", b"ok-2"]
    assert attempts == 4  # the first delivery and 3 retries: exactly max_retries + 1 failures
    with HQueue(queue.name + ".dlq", queue.url) as dlq:
        assert [(m.value, m.partition_id) for m in dlq.scan()] == [(b"poison", 1)]
    partitions = groups_of(queue.engine).describe(queue.name, "g")["partitions"]
    assert {pid: p["dead_lettered"] for pid, p in partitions.items()} == {0: 0, 1: 1}  # the group's own count


def test_a_groups_dead_letter_count_is_stored(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue, queue.consumer("g", max_retries=0) as consumer:
        queue.put([Message("t", b"a"), Message("t", b"b")], 0)
        consumer.nack(drain(consumer, 2), delay=0)
    with HQueueAdmin(url) as admin:  # another process would see the same
        assert admin.describe_group("q", "g")["partitions"][0]["dead_lettered"] == 2


def test_a_member_dead_letters_a_message_at_once(make_queue, admin):
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"hopeless"), Message("t", b"fine")], 1)
    with queue.consumer("g") as consumer, queue.consumer("g", member="other") as other:
        got = drain(consumer, 2)
        hopeless = next(d for d in got if d.value == b"hopeless")
        assert other.dead_letter(hopeless) == 1  # whoever holds it: the group had not finished it
        assert consumer.dead_letter(hopeless) == 0  # finished now
        assert consumer.ack(hopeless) == 0
        consumer.ack([d for d in got if d.value == b"fine"])
        assert consumer.receive(10, wait=0.3) == []  # never handed out again
        partitions = admin.describe_group(queue.name, "g")["partitions"]
        assert [p["lag_messages"] for p in partitions.values()] == [0, 0]
    with HQueue(queue.name + ".dlq", queue.url) as dlq:
        assert [(m.value, m.partition_id) for m in dlq.scan()] == [(b"hopeless", 1)]


def test_progress_survives_reopening_acked_messages_stay_acked(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"%d" % i) for i in range(6)], 0)
        consumer = queue.consumer("g")
        got = drain(consumer, 6)
        consumer.ack([got[0], got[2], got[4]])  # 1, 3 and 5 are in flight when the process stops
    with HQueue("q", url) as queue, queue.consumer("g") as consumer:
        again = drain(consumer, 3)
        assert values(again) == [b"1", b"3", b"5"]
        consumer.ack(again)
        assert consumer.receive(10, wait=0.2) == []


def test_members_acking_one_partition_at_once_leave_its_stored_progress_exact(tmp_path):
    """SYNC_WAL acks let the group's lock go while they wait for their fsync: the
    partition's writes must still land in the order their state changed."""
    # Given a SYNC_WAL queue of one partition, and 8 members acking it from 8 threads at once
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1, durability="SYNC_WAL")
    total, acked, errors = 2000, [], []
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"%d" % i) for i in range(total)], 0)

        def member(n: int) -> None:
            try:
                with queue.consumer("g", member=f"m{n}") as consumer:
                    while len(acked) < total:
                        got = consumer.receive(25, wait=0.1)
                        # out of order: the later half first, then the earlier one
                        for part in (got[len(got) // 2 :], got[: len(got) // 2]):
                            assert consumer.ack(part) == len(part)
                            acked.extend(d.value for d in part)
            except Exception as e:  # the test fails on it below
                errors.append(e)

        threads = [threading.Thread(target=member, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors and sorted(acked) == sorted(b"%d" % i for i in range(total))
    # Then, read back from the store, every message is done: none comes again, the lag is 0
    with HQueue("q", url) as queue, queue.consumer("g") as consumer:
        assert consumer.receive(10, wait=0.3) == []
        zero = groups_of(queue.engine).describe("q", "g")["partitions"][0]
        assert (zero["lag_messages"], zero["acked_ahead"], zero["in_flight"]) == (0, 0, 0)


def test_describe_counts_the_lag_without_holding_up_the_group(tmp_path, monkeypatch):
    """describe_group counts every row of each partition (0.28 s a million): it held the
    group's lock all along, and every receive and ack of the group waited (on a server's
    event loop, every call of every connection: 2.8 s over 10M rows)."""
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue, queue.consumer("g") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
        got = drain(consumer, 5)
        engine = queue.engine
        scan, counting, go_on = engine.scan_columns, threading.Event(), threading.Event()

        def held(*args, **kwargs):
            if threading.current_thread().name == "describing":
                counting.set()
                go_on.wait(30)
            return scan(*args, **kwargs)

        monkeypatch.setattr(engine, "scan_columns", held)
        answers: list = []
        describing = threading.Thread(
            target=lambda: answers.append(groups_of(engine).describe("q", "g")), name="describing", daemon=True
        )
        describing.start()
        assert counting.wait(10)
        acking = threading.Thread(target=lambda: answers.append(consumer.ack(got)), daemon=True)
        acking.start()
        acking.join(10)
        assert answers == [5] and acking.is_alive() is False  # acked while the count went on
        go_on.set()
        describing.join(10)
        assert answers[1]["partitions"][0]["lag_messages"] == 10  # (as the group stood when describe read it)


def ack_held_in_its_fsync(tmp_path, monkeypatch, meanwhile):
    """A SYNC_WAL group with 6 messages, 4 received, the 2nd and 4th acked (ahead of the
    cursor: stored one by one), the ack held inside its fsync while ``meanwhile(queue)``
    runs in another thread (0.2 s, then the ack goes on)."""
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1, durability="SYNC_WAL")
    queue = HQueue("q", url)
    queue.put([Message("t", b"%d" % i) for i in range(6)], 0)
    consumer = queue.consumer("g")
    got = drain(consumer, 4)
    commit, inside, go_on = queue.engine.storage._commit.commit, threading.Event(), threading.Event()

    def held(fill):
        inside.set()
        go_on.wait(10)
        commit(fill)

    monkeypatch.setattr(queue.engine.storage._commit, "commit", held)
    acking = threading.Thread(target=lambda: consumer.ack(got[1::2]), daemon=True)
    acking.start()
    assert inside.wait(10)
    monkeypatch.setattr(queue.engine.storage._commit, "commit", commit)
    other = threading.Thread(target=meanwhile, args=(queue,), daemon=True)
    other.start()
    time.sleep(0.2)
    go_on.set()
    acking.join(10)
    other.join(10)
    assert not acking.is_alive() and not other.is_alive()
    return queue


def test_a_group_deleted_while_an_ack_waits_for_its_fsync_is_made_again_from_nothing(tmp_path, monkeypatch):
    """An ack that landed after its group's delete left its progress behind: the group
    made again under the same name started from the old cursor and skipped messages."""
    # Given an ack held inside its fsync, when the group is deleted meanwhile
    queue = ack_held_in_its_fsync(tmp_path, monkeypatch, lambda q: groups_of(q.engine).delete("q", "g"))
    # Then nothing of the old group is left, and the one made again gets every message
    assert queue.engine.storage.list_meta(state_prefix("q", "g")) == {}
    with queue.consumer("g") as again:
        assert values(drain(again, 6)) == [b"%d" % i for i in range(6)]
    queue.close()


def test_a_queue_dropped_while_an_ack_waits_for_its_fsync_leaves_no_group_progress(tmp_path, monkeypatch):
    # Given an ack held inside its fsync, when its queue is disabled and dropped meanwhile
    def drop(queue):
        with HQueueAdmin(queue.url) as admin:  # the same engine: one per store in a process
            admin.delete_queue("q", force=True)

    queue = ack_held_in_its_fsync(tmp_path, monkeypatch, drop)
    # Then nothing of the group is left: a queue and group made again under the names start afresh
    assert queue.engine.storage.list_meta(state_prefix("q", "g")) == {}
    queue.close()


def test_a_replay_set_while_an_ack_waits_for_its_fsync_replays_every_message(tmp_path, monkeypatch):
    # Given an ack held inside its fsync, when the group is set back to the start meanwhile
    queue = ack_held_in_its_fsync(
        tmp_path, monkeypatch, lambda q: groups_of(q.engine).set_position("q", "g", 0, MessageID(0, 0))
    )
    # Then the replay hands out all 6: no ack of the 4 outlives it
    with queue.consumer("g") as again:
        assert values(drain(again, 6)) == [b"%d" % i for i in range(6)]
    queue.close()


def test_describe_and_list_and_delete_groups(make_queue, admin):
    queue = make_queue(partitions=2)
    queue.put([Message("t", b"%d" % i) for i in range(4)], 0)
    with queue.consumer("g", member="m1") as consumer:
        got = drain(consumer, 4)
        consumer.ack(got[:1])
        description = admin.describe_group(queue.name, "g")
        assert description["members"] == ["m1"]
        assert sorted(description["partitions"]) == [0, 1]
        zero = description["partitions"][0]
        assert zero["in_flight"] == 3 and zero["lag_messages"] == 3 and zero["done"] == got[1].id
        assert description["dead_letters"] == 0
    assert admin.list_groups(queue.name) == ["g"]
    admin.delete_group(queue.name, "g")
    assert admin.list_groups(queue.name) == []
    with pytest.raises(GroupNotFound):
        admin.describe_group(queue.name, "g")


def test_bad_group_calls_are_refused(make_queue):
    queue = make_queue(partitions=1)
    with pytest.raises(InvalidArgument):
        queue.consumer("bad/name")
    with pytest.raises(InvalidArgument):
        queue.consumer("g", max_retries=-1)
    # Checked before any call: through a server, 1.5 and True went as the i32 1, b"g" as a name
    # and past the wire's i32 refused on every store alike (an embedded store took 2**31)
    for retries in (1.5, True, "3", 2**31, 10**12):
        with pytest.raises(InvalidArgument, match="'max_retries' must be an int in 0..2147483647"):
            queue.consumer("g", max_retries=retries)
    for name in (b"g", None, 7):
        with pytest.raises(TypeError, match="group name must be a str"):
            queue.consumer(name)
    with HQueueAdmin(queue.url) as admin:
        assert admin.list_groups(queue.name) == []  # none was made
    with pytest.raises(InvalidArgument):
        queue.consumer("g", start="yesterday")
    with queue.consumer("g", topics=["a"]) as consumer:
        with pytest.raises(InvalidArgument, match="topics"):
            queue.consumer("g", topics=["b"])
        with pytest.raises(InvalidArgument):
            consumer.receive(0)
        with pytest.raises(InvalidArgument):
            consumer.receive(1, lease=0)
        with pytest.raises(TypeError):
            consumer.ack([Message("t", b"never received")])
        with pytest.raises(TypeError):
            consumer.ack([(5, 5)])  # type: ignore[list-item]


def test_a_group_takes_only_its_topics_and_can_start_at_the_latest(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("a", b"old-a"), Message("b", b"old-b")], 0)
    with queue.consumer("only-b", topics=["b"]) as only_b:
        assert values(drain(only_b, 1)) == [b"old-b"]
    with queue.consumer("new", start="latest") as new:
        assert new.receive(1, wait=0.2) == []
        queue.put(Message("a", b"new-a"), 0)
        assert values(new.receive(1, wait=2)) == [b"new-a"]


@pytest.mark.parametrize("wait", [float("inf"), 1e308, float("nan"), -1, 301, "1", None, True])
def test_a_wait_out_of_range_is_an_invalid_argument_everywhere(make_queue, wait):
    # Through a server it was an OverflowError, a ValueError or a TypeError (or -1 was taken)
    queue = make_queue(partitions=1)
    with queue.consumer("g") as consumer:
        with pytest.raises(
            InvalidArgument, match=r"'wait' must be seconds in \[0, 300\], got " + re.escape(repr(wait))
        ):
            consumer.receive(1, wait=wait)
        assert consumer.receive(1, wait=0) == []  # and the consumer goes on


@pytest.mark.parametrize("delay", [-0.002, -0.001, -2, -5, float("inf"), float("nan"), "1", True])
def test_a_nack_delay_out_of_range_is_an_invalid_argument_everywhere(make_queue, delay):
    """Through a server, -0.002 s went as the wire's -2 (given back unseen: no attempt
    counted, so never dead-lettered) and -0.001 s as -1 (the backoff)."""
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"v"), 0)
    with queue.consumer("g") as consumer:
        got = consumer.receive(1, wait=2)
        with pytest.raises(InvalidArgument, match=r"'delay' must be seconds in \[0, 604800\] or None, got "):
            consumer.nack(got, delay=delay)
        assert consumer.nack(got, delay=0) == 1  # and the consumer goes on
        again = consumer.receive(1, wait=2)
        assert [d.attempt for d in again] == [2]


@pytest.mark.parametrize("max_messages", ["5", 5.0, None, True, 0, 10_001])
def test_a_receive_count_out_of_range_is_an_invalid_argument_everywhere(make_queue, max_messages):
    # Through a server a str or a float was a StorageError (the server could not decode the call)
    queue = make_queue(partitions=1)
    with queue.consumer("g") as consumer:
        with pytest.raises(InvalidArgument, match="'max_messages' must be an int in 1..10000, got "):
            consumer.receive(max_messages, wait=0)


@pytest.mark.parametrize("member", [5, b"m", ""])
def test_a_member_name_that_is_no_string_is_an_invalid_argument_everywhere(make_queue, member):
    queue = make_queue(partitions=1)
    with pytest.raises(InvalidArgument, match="'member' must be a non-empty string"):
        queue.consumer("g", member=member)


def test_a_member_name_is_at_most_200_characters_everywhere(make_queue):
    """A member name had no bound: with a 1 MiB name, a pending list of 1,000 leases made a
    1,000 MiB reply, and 200 such members 200 MiB of server state (an attacker's pass)."""
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"v"), 0)
    with pytest.raises(InvalidArgument, match="a member name has at most 200 characters; this one has 201"):
        queue.consumer("g", member="m" * 201)  # (when it is made, on every store)
    with queue.consumer("g", member="m" * 200) as consumer:
        assert len(consumer.receive(1, wait=2)) == 1


def test_one_topic_given_as_a_string_is_refused_not_read_as_its_letters(make_queue, admin):
    # 'orders' as topics would be the topics o, r, d, e, s: a message of topic 'o' would be delivered
    queue = make_queue(partitions=1)
    with pytest.raises(TypeError, match="collection of topics"):
        queue.consumer("g", topics="orders")
    with pytest.raises(TypeError, match="collection of topics"):
        queue.consumer("g", topics=b"orders")
    with pytest.raises(TypeError, match="collection of topics"):
        admin.add_subscriber(queue.name, "s", "orders")
    assert admin.list_groups(queue.name) == [] and admin.list_subscribers(queue.name) == []


def test_timers_reach_groups_when_due(make_queue):
    queue = make_queue(partitions=1)
    with queue.consumer("g") as consumer:
        queue.put(Message("t", b"later"), delay=0.3)
        assert consumer.receive(1, wait=0) == []
        assert values(drain(consumer, 1)) == [b"later"]


def test_partitions_are_shared_out_among_members():
    members = ["a", "b", "c"]
    shares = [assigned(members, m, 8) for m in members]
    assert sorted(p for share in shares for p in share) == list(range(8))
    assert [assigned(members, m, 2) for m in members] == [[0], [1], [0]]  # more members than partitions
    assert MEMBER_TIMEOUT > 0


def test_dropping_a_queue_forgets_its_groups(make_queue, admin):
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"x"), 0)
    with queue.consumer("g") as consumer:
        consumer.ack(drain(consumer, 1))
    admin.delete_queue(queue.name, force=True)
    admin.create_queue(queue.name, 1)
    assert admin.list_groups(queue.name) == []
    with HQueue(queue.name, queue.url) as again:
        again.put(Message("t", b"y"), 0)
        with again.consumer("g") as consumer:
            assert values(drain(consumer, 1)) == [b"y"]


def test_a_group_replays_from_a_time(make_queue, admin):
    queue = make_queue(partitions=2)
    first = queue.put([Message("t", b"a"), Message("t", b"b")], 1)
    with queue.consumer("g") as consumer:
        consumer.ack(drain(consumer, 2))
        assert consumer.receive(10, wait=0.2) == []
        admin.set_group_position(queue.name, "g", 1, first[1])  # from "b" on
        assert values(drain(consumer, 1)) == [b"b"]
        consumer.ack(consumer.receive(10, wait=0.2))
        admin.set_group_position(queue.name, "g", "all", 0)  # everything again
        assert sorted(values(drain(consumer, 2))) == [b"a", b"b"]
    with pytest.raises(InvalidArgument):
        admin.set_group_position(queue.name, "g", 7, 0)
    with pytest.raises(GroupNotFound):
        admin.set_group_position(queue.name, "nope", None, 0)


def test_lag_is_exact_past_the_metrics_cap_and_never_negative_across_ttl_and_truncate(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("big", 1)
        admin.create_queue("short", 1, ttl=1)
    with HQueue("big", url) as queue, queue.consumer("g") as consumer:
        for _ in range(125):
            queue.put([Message("t", b"x")] * 1000, 0)
        with HQueueAdmin(url) as admin:
            assert admin.describe_group("big", "g")["partitions"][0]["lag_messages"] == 125_000  # past 100,000
            consumer.ack(consumer.receive(100, wait=1))
            assert admin.describe_group("big", "g")["partitions"][0]["lag_messages"] == 124_900
            admin.truncate_queue("big")
            zero = admin.describe_group("big", "g")["partitions"][0]
            assert (zero["lag_messages"], zero["lag_millis"]) == (0, 0)
    with HQueue("short", url) as queue, queue.consumer("g") as consumer:
        queue.put([Message("t", b"x")] * 10, 0)
        with HQueueAdmin(url) as admin:
            assert admin.describe_group("short", "g")["partitions"][0]["lag_messages"] == 10
            time.sleep(1.2)  # the TTL passes: expired messages are no longer owed
            zero = admin.describe_group("short", "g")["partitions"][0]
            assert (zero["lag_messages"], zero["lag_millis"]) == (0, 0)


def test_pending_lists_what_the_group_has_in_flight_and_what_waits_to_be_retried(make_queue):
    """``queue.pending(group)``: Redis's XPENDING view, on every backend and through a server."""
    queue = make_queue(partitions=2)
    queue.put([Message("work", b"a%d" % i) for i in range(3)], 0)
    queue.put([Message("work", b"b%d" % i) for i in range(2)], 1)
    with queue.consumer("workers", member="m1", lease=60) as member:
        held = drain(member, 5, timeout=5)
        assert len(held) == 5
        retried = held[0]
        assert member.nack([retried], delay=30) == 1
        pending = queue.pending("workers")
        assert [(p.partition_id, p.id) for p in pending] == sorted((d.partition_id, d.id) for d in held)
        key = (retried.partition_id, retried.id)  # IDs are per partition: two partitions may give the same
        by_key = {(p.partition_id, p.id): p for p in pending}
        waiting = by_key[key]
        assert waiting.member is None and waiting.attempt == 2 and waiting.lease_left is None
        assert 0 < waiting.retry_in <= 30
        leased = [p for p in pending if (p.partition_id, p.id) != key]
        assert {p.member for p in leased} == {"m1"} and {p.attempt for p in leased} == {1}
        assert all(0 < p.lease_left <= 60 and p.retry_in is None for p in leased)
        assert len(queue.pending("workers", limit=2)) == 2
        member.ack([d for d in held if (d.partition_id, d.id) != key])
        assert [(p.partition_id, p.id) for p in queue.pending("workers")] == [key]
    with pytest.raises(GroupNotFound):
        queue.pending("nobody")
    with pytest.raises(InvalidArgument):
        queue.pending("workers", limit=0)


def test_lag_counts_messages_not_yet_acked_not_those_acked_ahead_of_the_cursor(make_queue):
    # Given 20 messages, 10 received, and the 5 at odd positions acked (the cursor stays put)
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    time.sleep(0.01)  # the oldest waits a measurable time (lag_millis > 0)
    with queue.consumer("g") as consumer:
        got = drain(consumer, 10)
        assert consumer.ack(got[1::2]) == 5
        # Then 15 are not acked: the lag says 15, next to the 5 acked ahead
        zero = groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]
        assert (zero["lag_messages"], zero["acked_ahead"], zero["in_flight"]) == (15, 5, 5)
        assert zero["lag_millis"] > 0
        consumer.ack(got[0::2] + drain(consumer, 10))
        zero = groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]
        assert (zero["lag_messages"], zero["lag_millis"]) == (0, 0)


def test_a_receipt_named_twice_in_one_call_is_one_message(make_queue):
    # Given 10 messages, 4 received
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
    with queue.consumer("g") as consumer:
        got = drain(consumer, 4)
        # When one ack names the first twice (and a nack the second twice)
        assert consumer.ack([got[0], got[0]]) == 1
        assert consumer.nack([got[1], got[1]], delay=60) == 1
        # Then each counted once: the lag counts the 9 not acked, 2 are in flight (the nacked one waits)
        zero = groups_of(queue.engine).describe(queue.name, "g")["partitions"][0]
        assert (zero["lag_messages"], zero["in_flight"]) == (9, 2)


def test_receipts_that_are_not_a_list_of_rowkeys_are_refused_alike_on_every_store(make_queue):
    """Only the server's wire carries receipts concatenated: a rowkey, or rowkeys joined, given
    for the list are a TypeError in process and through a server alike (the in-process store
    acked them; through a server the client checks them, as it must cut them by owner)."""
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"a"), Message("t", b"b")], 0)
    with queue.consumer("g") as consumer:
        got = drain(consumer, 2)
        groups = groups_of(queue.engine)
        wrong = [(got[0].rowkey, TypeError), (got[0].rowkey + got[1].rowkey, TypeError), (["x" * 12], TypeError)]
        for receipts, error in [*wrong, ([got[0].rowkey[:11]], InvalidArgument)]:
            with pytest.raises(error, match="12-byte rowkey"):
                groups.ack(queue.name, "g", receipts)
        assert consumer.ack(got) == 2


def test_a_member_calling_while_its_group_is_deleted_gets_group_not_found(tmp_path, monkeypatch):
    """A call that came while a delete was writing found the group's key still stored and
    made the group again in memory, then wrote its progress back after the delete."""
    # Given a group with a member, and a delete held inside its store write
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"%d" % i) for i in range(6)], 0)
        member = queue.consumer("g", member="m")
        drain(member, 2)
        storage = queue.engine.storage
        write_meta, inside, go_on = storage.write_meta, threading.Event(), threading.Event()

        def held(puts, deletes=(), *args, **kwargs):
            if "groups/q/g" in deletes:  # the delete's own write
                inside.set()
                go_on.wait(10)
            return write_meta(puts, deletes, *args, **kwargs)

        monkeypatch.setattr(storage, "write_meta", held)
        deleting = threading.Thread(target=lambda: groups_of(queue.engine).delete("q", "g"))
        deleting.start()
        assert inside.wait(10)
        # When the member calls meanwhile (it waits for the delete), then the delete lands
        results: list = []
        calling = threading.Thread(target=lambda: results.append(_outcome(lambda: member.receive(2, wait=0))))
        calling.start()
        time.sleep(0.2)
        go_on.set()
        deleting.join(10)
        calling.join(10)
        # Then it was told the group is gone, and nothing of the group is stored
        assert isinstance(results[0], GroupNotFound)
        assert storage.list_meta(state_prefix("q", "g")) == {}
        with queue.consumer("g") as again:
            assert values(drain(again, 6)) == [b"%d" % i for i in range(6)]


def _outcome(call):
    try:
        return call()
    except Exception as e:
        return e


@pytest.mark.parametrize("affinity", [None, "partition"])
def test_a_receive_of_big_messages_hands_out_a_bounded_reply_and_the_rest_later(make_queue, affinity):
    """A receive of 1,000 messages of 4 MiB made one 4 GB reply in the server's memory:
    one receive hands out at most RECEIVE_BYTES (16 MiB) and the message that passes them,
    new ones, retried ones and, with key affinity, each key's in order."""
    queue = make_queue(partitions=1, max_message_bytes=2 << 20)
    big = [Message("t", b"%04d" % i + b"x" * ((1 << 20) - 4)) for i in range(20)]  # 20 MiB in all
    for message in big:
        queue.put(message, key=b"k%d" % (int(message.value[:4]) % 3))  # one partition: three keys in it
    with queue.consumer("g", key_affinity=affinity) as member:
        first = member.receive(20, wait=0)
        assert 1 <= len(first) <= RECEIVE_BYTES // (1 << 20) + 1
        assert sum(len(d.value) for d in first) <= RECEIVE_BYTES + (1 << 20)
        rest = drain(member, 20 - len(first))
        assert sorted(d.value[:4] for d in first + rest) == [b"%04d" % i for i in range(20)]
        # Given back all at once, they come again in bounded replies too, each once
        assert member.nack(first + rest, delay=0) == 20
        again = member.receive(20, wait=1)
        assert 1 <= len(again) < 20
        again += drain(member, 20 - len(again))
        assert sorted(d.value[:4] for d in again) == [b"%04d" % i for i in range(20)]
        assert all(d.attempt == 2 for d in again)
        assert member.ack(again) == 20
        assert member.receive(20, wait=0) == []


def test_held_back_big_messages_go_out_in_bounded_replies_each_key_in_order(make_queue):
    """With key affinity, messages held back while another member held their key are
    handed out later: more than one reply's bytes of them go out over several, in order."""
    queue = make_queue(partitions=1, max_message_bytes=2 << 20)
    for i in range(40):
        queue.put(Message("t", b"%04d" % i + b"x" * ((1 << 20) - 4)), partition_id=0)
    with (
        queue.consumer("g", key_affinity="partition", member="a") as a,
        queue.consumer("g", key_affinity="partition", member="b") as b,
    ):
        held = a.receive(40, wait=0)  # a holds the partition's key
        assert 1 <= len(held) <= RECEIVE_BYTES // (1 << 20) + 1
        assert b.receive(40, wait=0) == []  # b finds the rest, and they wait for the key
        assert a.ack(held) == len(held)
        got = held + drain(b, 40 - len(held))
        assert [d.value[:4] for d in got] == [b"%04d" % i for i in range(40)]


@pytest.mark.parametrize("affinity", [None, "partition"])
def test_a_receive_reads_about_its_reply_of_the_store_whatever_came_before(make_queue, monkeypatch, affinity):
    """Reads were sized by the partition's last cells: 16 tiny ones, then 200 of 1 MiB, and
    a receive read 200 MiB of the store for its 16 MiB reply (a review found it)."""
    reads: list[int] = []
    scan_columns = Engine.scan_columns

    def measured(self, *args, **kwargs):
        keys, values = scan_columns(self, *args, **kwargs)
        reads.append(sum(map(len, keys)) + sum(map(len, values)))
        return keys, values

    monkeypatch.setattr(Engine, "scan_columns", measured)
    queue = make_queue(partitions=1, max_message_bytes=2 << 20)
    queue.put([Message("t", b"s%03d" % i) for i in range(16)], partition_id=0)
    for i in range(200):
        queue.put(Message("t", b"B%03d" % i + b"x" * ((1 << 20) - 4)), partition_id=0)
    with queue.consumer("g", key_affinity=affinity) as member:
        got = member.receive(1000, wait=0)
        assert sum(len(d.value) for d in got) <= RECEIVE_BYTES + (1 << 20)
        assert max(reads) <= RECEIVE_BYTES + (1 << 20), [r >> 20 for r in reads]
        rest = drain(member, 216 - len(got))
        assert len({d.id for d in got + rest}) == 216


def test_leaving_a_for_loop_over_a_member_early_hands_back_the_rest_of_its_batch(make_queue):
    queue = make_queue(partitions=1)
    queue.put([Message("t", b"m%d" % i) for i in range(10)])
    with queue.consumer("g", member="a", lease=60) as a:
        for delivery in a:
            a.ack(delivery)
            break
        got = a.receive(20, wait=5)
        assert sorted(d.value for d in got) == [b"m%d" % i for i in range(1, 10)]
        a.ack(got)


def test_a_receive_waiting_when_its_store_closes_returns_nothing_not_queue_not_found(tmp_path):
    """Closing the last handle woke a waiting receive, which read the closing store and
    raised QueueNotFound for a queue that exists (an acceptance probe)."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
    queue = HQueue("q", data_dir=tmp_path)
    consumer = queue.consumer("g", member="m")
    assert consumer.receive(wait=0) == []
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(_outcome(lambda: consumer.receive(wait=5))))
    waiting.start()
    time.sleep(0.5)
    queue.close()
    waiting.join(10)
    assert got == [[]]


def _outcome(call):
    try:
        return call()
    except Exception as e:
        return e


def test_closing_the_queue_closes_the_consumers_made_there(api_url, queue_name):
    """A consumer left open kept its heartbeat thread beating a closed queue; the queue's
    close ends it, and on a store in this process it leaves its group: what it held goes
    back at once, no failure counted, while another handle keeps the store open."""
    with HQueueAdmin(api_url) as admin:  # (the store stays open in this process)
        admin.create_queue(queue_name, 1)
        queue = HQueue(queue_name, api_url)
        queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
        consumer = queue.consumer("g", lease=60)
        assert len(consumer.receive(5, wait=2)) == 5
        queue.close()
        assert consumer.closed
        assert consumer._heartbeats is not None
        consumer._heartbeats.join(5)
        assert not consumer._heartbeats.is_alive()
        with HQueue(queue_name, api_url) as again, again.consumer("g") as other:
            got = other.receive(5, wait=2)
            assert len(got) == 5 and {d.attempt for d in got} == {1}


@pytest.fixture
def local_queue(store_url):
    """A 1-partition queue on each store, in this process (the group's state is here)."""
    with HQueueAdmin(store_url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", store_url) as queue:
        yield queue


def test_a_group_of_some_topics_reads_rows_of_other_topics_once(local_queue):
    """A group for some topics went on from after the last message of its topics: each receive
    read every row of other topics after it again, to the partition's end (1.3-1.7 s a receive
    over 5M rows; an attacker pass). Its scan now goes on from where the last read ended."""
    queue = local_queue
    queue.put([Message("other", b"%d" % i) for i in range(500)], partition_id=0)
    engine = queue.engine
    starts: list[bytes] = []
    scan_columns = engine.scan_columns

    def recording(name, start, stop, topics, *args):
        if topics is not None:
            starts.append(start)
        return scan_columns(name, start, stop, topics, *args)

    engine.scan_columns = recording
    try:
        with queue.consumer("g", topics=["wanted"]) as consumer:
            assert consumer.receive(10, wait=0) == []
            assert consumer.receive(10, wait=0) == []  # went through the 500 once
            last = max(m.id for m in queue.scan())
            assert starts and starts[-1][2:12] > last.to_bytes()
            queue.put(Message("wanted", b"w"), partition_id=0)
            (got,) = drain(consumer, 1)
            assert got.value == b"w" and consumer.ack(got) == 1
    finally:
        del engine.scan_columns


@pytest.mark.parametrize("affinity", [None, "topic"])
def test_a_message_of_the_groups_topics_written_during_a_receive_goes_out_once(local_queue, affinity):
    """Going past the rows of other topics, the scan went back to the partition's end as it
    was before the read: a message of the group's topics written in between was handed out
    again after its ack (47 of 11,561 in a review's stress probe)."""
    queue = local_queue
    queue.put([Message("a", b"a1")] + [Message("b", b"b%d" % i) for i in range(5)], 0)
    storage = queue.engine.storage
    last_rowkey, armed = storage.last_rowkey, [True]

    def racing(name, pid):  # another producer writes between the end's read and the scan
        last = last_rowkey(name, pid)
        if armed.pop() if armed else False:
            queue.put(Message("a", b"a2"), 0)
        return last

    storage.last_rowkey = racing
    try:
        with queue.consumer("g", topics=["a"], key_affinity=affinity) as consumer:
            first = consumer.receive(10, wait=0.2)  # (asking for more than there is: the read ends)
            assert sorted(d.value for d in first) == [b"a1", b"a2"] and consumer.ack(first) == 2
            assert consumer.receive(10, wait=0.3) == []  # nothing again
    finally:
        del storage.last_rowkey


def test_a_member_of_a_disabled_queue_makes_no_group(make_queue, admin):
    """`hqueue consume` on a disabled queue failed, and had made its group all the same, with
    the topics it asked for: the next consume with other topics was refused (an attacker pass)."""
    queue = make_queue(partitions=1)
    admin.disable_queue(queue.name)
    with pytest.raises(QueueDisabled), queue.consumer("g", topics=["only"]) as consumer:
        consumer.receive(1, wait=0)
    admin.enable_queue(queue.name)
    assert admin.list_groups(queue.name) == []
    with queue.consumer("g", topics=["other"]) as consumer:
        assert consumer.receive(1, wait=0) == []


def test_messages_in_flight_when_their_queue_is_truncated_are_finished_at_once(make_queue, admin):
    """They showed as in flight, then (their leases out) as retrying with attempt 2, in
    describe_group, pending() and the metrics until a member next received from their
    partition (an attacker's pass)."""
    queue = make_queue(partitions=1)
    with queue.consumer("g", lease=60) as consumer:
        queue.put([Message("t", b"old%d" % i) for i in range(5)], 0)
        got = consumer.receive(10, wait=2)
        assert len(got) == 5
        consumer.nack(got[:1], delay=30)  # one waiting to go out again
        consumer.ack(got[1:3])
        admin.truncate_queue(queue.name)

        def finished() -> bool:
            partition = admin.describe_group(queue.name, "g")["partitions"][0]
            return (partition["in_flight"], partition["retrying"], partition["lag_messages"]) == (0, 0, 0)

        wait_for(finished, 10, "the truncated messages to be finished")
        assert queue.pending("g") == []
        queue.put([Message("t", b"new%d" % i) for i in range(3)], 0)
        fresh = consumer.receive(10, wait=2)
        assert [(d.value, d.attempt) for d in fresh] == [(b"new0", 1), (b"new1", 1), (b"new2", 1)]
        assert consumer.ack(fresh) == 3


def test_messages_held_back_for_their_key_when_their_queue_is_truncated_are_finished_at_once(make_queue, admin):
    """With key affinity, the messages a receive held back (their key out with another
    member) showed as held back, and held the group's completion, until a receive took them
    back and found them gone."""
    queue = make_queue(partitions=1)
    with (
        queue.consumer("g", lease=60, key_affinity="topic") as first,
        queue.consumer("g", lease=60, key_affinity="topic") as second,
    ):
        queue.put([Message("k", b"old%d" % i) for i in range(5)], 0)
        assert [d.value for d in first.receive(1, wait=2)] == [b"old0"]
        assert second.receive(10, wait=0) == []  # the rest of key k: held back for first
        assert admin.describe_group(queue.name, "g")["partitions"][0]["held_back"] == 4
        admin.truncate_queue(queue.name)

        def finished() -> bool:
            partition = admin.describe_group(queue.name, "g")["partitions"][0]
            return (partition["in_flight"], partition["held_back"], partition["lag_messages"]) == (0, 0, 0)

        wait_for(finished, 10, "the truncated messages to be finished")
        assert queue.pending("g") == []
        queue.put([Message("k", b"new%d" % i) for i in range(3)], 0)
        fresh = second.receive(10, wait=2)
        assert [(d.value, d.attempt) for d in fresh] == [(b"new0", 1), (b"new1", 1), (b"new2", 1)]
        assert second.ack(fresh) == 3
