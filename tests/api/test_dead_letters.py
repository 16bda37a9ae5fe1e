"""Consumer groups' dead letters when the dead-letter queue cannot take them (SPEC X2).

A message past its retries whose ``<queue>.dlq`` write fails (the dead-letter
queue is disabled, or the queue's ``.dlq`` name is illegal) is kept: it is not
handed out again, the write is retried with a backoff, no other member of the
group sees an error, and it reaches the dead-letter queue once the write works.

Runs on every storage backend and through a server (``make_queue``).
"""

from __future__ import annotations

import pytest

from hqueue import HQueue, HQueueAdmin, InvalidArgument, Message, QueueDisabled, QueueNotFound

from ..processes import drain, wait_for


def dead_letters(queue: HQueue) -> list[bytes]:
    with HQueue(queue.name + ".dlq", queue.url) as dlq:
        return sorted(m.value for m in dlq.scan())


@pytest.mark.parametrize("affinity", [None, "topic"])
def test_a_message_the_disabled_dead_letter_queue_refuses_waits_and_goes_once_it_is_enabled(
    make_queue, admin, affinity
):
    # Given a group with max_retries=0 (with key affinity or not) whose dead-letter queue is disabled
    queue = make_queue(partitions=2)
    dlq = queue.name + ".dlq"
    admin.create_queue(dlq, 2)
    admin.disable_queue(dlq)
    with (
        queue.consumer("g", member="a", max_retries=0, key_affinity=affinity) as failing,
        queue.consumer("g", member="b") as other,
    ):
        assert other.receive(1, wait=0) == failing.receive(1, wait=0) == []  # a reads partition 0, b 1
        queue.put([Message("t", b"poison-1"), Message("t", b"poison-2")], 0)
        queue.put(Message("t", b"fine"), 1)
        poison = failing.receive(10, wait=2)
        assert sorted(d.value for d in poison) == [b"poison-1", b"poison-2"]

        # When the member nacks them: they cannot be dead-lettered
        assert failing.nack(poison, delay=0) == 2  # no error for the member that failed them

        # Then no member sees an error, and the messages are not handed out again
        (fine,) = other.receive(10, wait=2)
        assert other.ack(fine) == 1
        assert failing.receive(10, wait=0.3) == []
        description = admin.describe_group(queue.name, "g")
        assert description["partitions"][0]["dead_letter_waiting"] == 2
        assert description["partitions"][0]["lag_messages"] == 2

        # When the dead-letter queue is enabled again: both reach it (the receives drive the retries)
        admin.enable_queue(dlq)

        def moved() -> bool:
            assert failing.receive(10, wait=0.2) == [] and other.receive(10, wait=0) == []
            return dead_letters(queue) == [b"poison-1", b"poison-2"]

        wait_for(moved, 10, "the waiting dead letters to reach the enabled dead-letter queue", interval=0)
        partition = admin.describe_group(queue.name, "g")["partitions"][0]
        assert (partition["dead_letter_waiting"], partition["lag_messages"]) == (0, 0)


def test_a_dead_letter_the_disabled_dead_letter_queue_refuses_spends_no_retry(make_queue, admin):
    """The member keeps the lease and may try again (docs/dead-letters.md): the refused call
    counted a failed delivery all the same, so the retry a nack promised never came."""
    queue = make_queue(partitions=1)
    dlq = queue.name + ".dlq"
    admin.create_queue(dlq, 1)
    queue.put(Message("t", b"m"), 0)
    with queue.consumer("g", member="a", max_retries=1) as member:
        got = member.receive(1, wait=2)
        admin.disable_queue(dlq)
        for _ in range(3):
            with pytest.raises(QueueDisabled) as refused:
                member.dead_letter(got)
            assert refused.value.name == dlq  # the queue that refused, not the group's
        (pending,) = queue.pending("g")
        assert (pending.attempt, pending.member) == (1, "a")
        admin.enable_queue(dlq)
        assert member.nack(got, delay=0) == 1  # the first failed delivery: max_retries=1 allows a retry
        (again,) = member.receive(1, wait=3)
        assert (again.value, again.attempt) == (b"m", 2)
        assert member.dead_letter([again]) == 1
    assert dead_letters(queue) == [b"m"]


def test_a_message_of_a_queue_whose_dead_letter_queue_name_is_illegal_stays_without_error(
    make_queue, admin, queue_name
):
    # Given a dead-letter queue of 200 characters: its own '.dlq' would be 204, an illegal name
    long_name = queue_name + "d" * (196 - len(queue_name)) + ".dlq"
    queue = make_queue(partitions=1, name=long_name)
    queue.put(Message("t", b"stuck"), 0)
    with queue.consumer("g", member="a", max_retries=0) as failing, queue.consumer("g", member="b") as other:
        (stuck,) = failing.receive(1, wait=2, lease=0.3)

        # When its lease runs out: it failed, and cannot be dead-lettered
        def kept() -> bool:
            assert other.receive(10, wait=0.1) == []  # an unrelated member's receive: no error
            return admin.describe_group(long_name, "g")["partitions"][0]["dead_letter_waiting"] == 1

        wait_for(kept, 10, "the run-out message to wait for its dead-letter queue", interval=0)

        # Then it is kept (not lost, not acked), and a late ack of it still finishes it
        assert failing.receive(10, wait=0.2) == []
        assert [p.id for p in queue.pending("g")] == [stuck.id]
        assert failing.ack(stuck) == 1
        partition = admin.describe_group(long_name, "g")["partitions"][0]
        assert (partition["dead_letter_waiting"], partition["lag_messages"]) == (0, 0)
    # And it has no dead letters to list or replay (through a server these raised InvalidQueueName)
    assert admin.dead_letters(long_name) == [] and admin.replay_dead_letters(long_name) == 0


def test_dead_letters_are_listed_with_their_origin_and_replayed_at_a_rate(tmp_path):
    # Given three dead letters of a 2-partition queue, sent there by a group
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", 2)
        with admin.queue("orders") as orders:
            orders.put([Message("t", b"a"), Message("t", b"b")], 1)
            (c_id,) = orders.put(Message("t", b"c"), 0)
            with orders.consumer("g", max_retries=0) as group:
                group.dead_letter(drain(group, 3))
        # Then each is listed with the partition of the queue it goes back to, and its note:
        # where it was, who sent it there, after how many attempts
        listed = admin.dead_letters("orders")
        assert sorted((m.value, origin) for m, origin, _ in listed) == [(b"a", 1), (b"b", 1), (b"c", 0)]
        for _, origin, note in listed:
            assert note is not None and (note.origin_partition, note.by, note.attempts) == (origin, "group g", 1)
        assert [note.origin_id for m, _, note in listed if m.value == b"c"] == [c_id]
        assert len(admin.dead_letters("orders", limit=1)) == 1
        # And a replay at a rate puts them all back
        assert admin.replay_dead_letters("orders", rate=1000) == 3
        for rate in (0, -1, "fast", True):
            with pytest.raises(InvalidArgument, match="'rate'"):
                admin.replay_dead_letters("orders", rate=rate)
        with pytest.raises(InvalidArgument, match="'limit'"):
            admin.dead_letters("orders", limit=0)
        # And truncating the dead-letter queue drops the notes with the messages
        admin.truncate_queue("orders.dlq")
        assert admin.engine.storage.list_meta("dlq-note/") == {}


def test_a_replay_ends_at_the_dead_letters_there_when_it_began(make_queue, admin):
    """Without a stop it read on to the live end: a consumer that failed the copies again
    sent them back to it, and a replay of 5 dead letters put back 46, for as long as the
    consumer ran (a helper's pass on the console)."""
    import threading

    queue = make_queue(partitions=2)
    queue.put([Message("t", b"poison-%d" % i) for i in range(5)], 0)
    with queue.consumer("g") as failing:
        failing.dead_letter(drain(failing, 5))
        sent_back = [0]
        stop = threading.Event()

        def fail_every_copy() -> None:  # (bounded: without the fix the replay went on with it)
            while not stop.is_set() and sent_back[0] < 40:
                copies = failing.receive(10, wait=0.1)
                sent_back[0] += failing.dead_letter(copies) if copies else 0

        thread = threading.Thread(target=fail_every_copy, daemon=True)
        thread.start()
        try:
            assert admin.replay_dead_letters(queue.name, rate=2) == 5  # (2 a second: the copies fail meanwhile)
        finally:
            stop.set()
            thread.join(10)
    assert sent_back[0] >= 1  # (they did come back while it ran)


def test_a_queue_that_never_had_dead_letters_replays_and_lists_none(tmp_path):
    """Its <queue>.dlq is made by the first dead letter: before, replay-dlq and dead_letters
    said "queue 'orders.dlq' does not exist" (a fresh user's probe)."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("orders", 2)
        assert admin.replay_dead_letters("orders") == 0
        assert admin.dead_letters("orders") == []
        with pytest.raises(QueueNotFound):  # a queue that does not exist still says so
            admin.replay_dead_letters("nosuch")


def test_a_replay_stops_at_a_dead_letter_queue_made_again_and_copies_none_of_it(tmp_path, monkeypatch):
    """Each partition of <queue>.dlq was read on whatever queue had its name: one deleted and
    made again mid-replay had its messages copied onto the queue (an attacker's probe)."""
    from hqueue import QueueNotFound

    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
        admin.create_queue("q.dlq", 2)
        with HQueue("q.dlq", data_dir=tmp_path) as letters:
            for pid in (0, 1):
                letters.put([Message("t", b"old")] * 5, partition_id=pid)
        engine, put = admin.engine, admin.engine.put

        def put_then_remake(name, messages, pid):  # the first replayed batch in, the DLQ made again
            ids = put(name, messages, pid)
            monkeypatch.setattr(engine, "put", put)
            admin.delete_queue("q.dlq", force=True)
            admin.create_queue("q.dlq", 2)
            with HQueue("q.dlq", data_dir=tmp_path) as again:
                again.put([Message("t", b"new")] * 5, partition_id=1)
            return ids

        monkeypatch.setattr(engine, "put", put_then_remake)
        with pytest.raises(QueueNotFound, match="deleted and created again"):
            admin.replay_dead_letters("q")
        with HQueue("q", data_dir=tmp_path) as queue:
            assert [m.value for m in queue.scan()] == [b"old"] * 5


_BURY_AND_DIE = """
import os, sys
import hqueue.groups.acks as acks
from hqueue import HQueue

real = acks.dead_letter


def dead_letter_and_die(*args, **kwargs):
    real(*args, **kwargs)
    os._exit(9)  # killed between the dead letter's write and the group's record that it is finished


acks.dead_letter = dead_letter_and_die
with HQueue("q", sys.argv[1]) as queue, queue.consumer("g", lease=60) as member:
    member.dead_letter(member.receive(1, wait=5))
"""


def test_a_message_buried_again_after_a_kill_between_its_dead_letter_and_its_finish_is_one_dead_letter(tmp_path):
    """A dead letter's write and its group's record that the message is finished are two
    writes: a process killed between them handed the message out again after the restart,
    and it was buried twice (4001-4002 dead letters of 4000 under kill -9, an attacker's
    pass). The burial's lane is stored before it (groups/acks.py, _burial): the second
    write is answered with the first one's ID."""
    import subprocess
    import sys

    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"poison"), Message("t", b"fine")], 0)
    child = subprocess.run([sys.executable, "-c", _BURY_AND_DIE, url], capture_output=True, timeout=60)
    assert child.returncode == 9, child.stderr.decode()[-2000:]
    with HQueue("q", url) as queue, queue.consumer("g", lease=60) as member:
        assert dead_letters(queue) == [b"poison"]
        again = member.receive(2, wait=5)
        assert sorted((d.value, d.attempt) for d in again) == [(b"fine", 1), (b"poison", 2)]
        assert member.dead_letter([d for d in again if d.value == b"poison"]) == 1
        assert dead_letters(queue) == [b"poison"]
        with HQueueAdmin(url) as admin:
            assert admin.describe_group("q", "g")["partitions"][0]["dead_lettered"] == 1


def test_a_message_buried_again_after_a_rewind_a_group_made_again_or_a_truncated_dlq_is_a_new_dead_letter(
    make_queue, admin
):
    """What makes a burial written once after a crash must not hide a second legitimate one
    (a review: the same message dead-lettered again after a replay, by a group made again,
    or after its first dead letter was truncated away, which that lost)."""
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"poison"), 0)

    def bury() -> None:
        with queue.consumer("g", lease=60) as member:
            got = member.receive(1, wait=5)
            assert [d.value for d in got] == [b"poison"]
            assert member.dead_letter(got) == 1

    bury()
    admin.set_group_position(queue.name, "g", 0, 0)  # a replay
    bury()
    assert dead_letters(queue) == [b"poison", b"poison"]
    admin.delete_group(queue.name, "g")  # a group made again
    bury()
    assert dead_letters(queue) == [b"poison"] * 3
    admin.truncate_queue(queue.name + ".dlq")
    admin.set_group_position(queue.name, "g", 0, 0)
    bury()
    assert dead_letters(queue) == [b"poison"]
