"""Timer messages (SPEC X1): put now, delivered at their time, once, and cancellable.

Runs on every storage backend and through a server (``make_queue``). Nothing
here asserts a duration: lateness is measured in bench/timers.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from hqueue import HQueue, HQueueAdmin, InvalidArgument, Message, QueueDisabled, Timer
from hqueue.coordination.local import LocalCoordinator
from hqueue.engine import Engine
from hqueue.ids import wall_clock_ms
from hqueue.keys.requests import Request
from hqueue.server import HQueueServer
from hqueue.timers import TimerService

from ..processes import wait_for


def test_a_timer_message_is_invisible_until_due_then_written_with_a_fresh_id(make_queue):
    queue = make_queue(partitions=2)
    (timer,) = queue.put(Message("orders", b"cancel order 7"), partition_id=1, delay=0.5)
    assert isinstance(timer, Timer) and timer.partition_id == 1
    assert list(queue.scan()) == []
    (fired,) = wait_for(lambda: list(queue.scan()))
    assert (fired.topic, fired.value, fired.partition_id) == (b"orders", b"cancel order 7", 1)
    assert fired.id.timestamp >= timer.due  # never early
    assert fired.id > timer.id
    time.sleep(0.2)
    assert len(list(queue.scan())) == 1  # and once


def test_a_cancelled_timer_never_fires(make_queue):
    queue = make_queue(partitions=1)
    doomed = queue.put(Message("t", b"doomed"), delay=0.3)[0]
    assert queue.cancel(doomed) is True
    assert queue.cancel(doomed) is False
    later = queue.put(Message("t", b"later"), delay=0.6)[0]
    wait_for(lambda: list(queue.scan()))
    assert [m.value for m in queue.scan()] == [b"later"]
    assert queue.cancel(later) is False  # fired already
    assert queue.cancel(str(doomed)) is False  # the printed form works too


def test_a_batch_of_timers_with_one_due_time_fires_every_message_once_in_order(make_queue):
    queue = make_queue(partitions=1)
    due = wall_clock_ms() + 300
    timers = queue.put([Message("t", b"%04d" % i) for i in range(1500)], deliver_at=due)
    assert len(timers) == 1500 and len({t.id for t in timers}) == 1500
    wait_for(lambda: len(list(queue.scan())) == 1500)
    time.sleep(0.2)
    fired = list(queue.scan())
    assert [m.value for m in fired] == [b"%04d" % i for i in range(1500)]
    assert min(m.id.timestamp for m in fired) >= due


def test_deliver_at_takes_a_datetime_and_a_due_time_in_the_past_fires_at_once(make_queue):
    queue = make_queue(partitions=1)
    queue.put(Message("t", b"past"), deliver_at=datetime.now(UTC) - timedelta(hours=1))
    wait_for(lambda: list(queue.scan()))
    (timer,) = queue.put(Message("t", b"future"), deliver_at=datetime.now(UTC) + timedelta(days=365 * 100))
    assert timer.due_datetime.year >= 2126  # no maximum delay
    assert queue.cancel(timer)


def test_timers_outlive_a_queue_ttl_shorter_than_their_delay(make_queue):
    queue = make_queue(partitions=1, ttl=1)
    queue.put(Message("t", b"after the ttl"), delay=1.5)
    (fired,) = wait_for(lambda: list(queue.scan()), timeout=15)
    assert fired.value == b"after the ttl"


def test_a_queue_refuses_another_queues_timer_whose_partition_due_time_and_id_are_its_own(make_queue):
    # Given two queues with timers of the same partition, due time and ID (IDs are per partition)
    first, second = make_queue(partitions=1), make_queue(partitions=1)
    due = wall_clock_ms() + 600_000
    for _ in range(200):
        (mine,) = first.put(Message("t", b"first's"), deliver_at=due)
        (theirs,) = second.put(Message("t", b"second's"), deliver_at=due)
        if mine == theirs:
            break
    else:
        pytest.skip("no two timers of the same millisecond and sequence came in 200 tries")
    # When the second queue is given the first queue's timer, it refuses it, and cancels nothing
    assert mine.queue == first.name and theirs.queue == second.name
    for given in (mine, mine):
        with pytest.raises(InvalidArgument, match=f"timer of queue '{first.name}', not of '{second.name}'"):
            second.cancel(given)
    with pytest.raises(InvalidArgument, match="timer of queue"):
        second.find_timer(mine)
    # And each queue's own timer is still pending, and cancelled through its own queue
    assert second.cancel(theirs) is True and first.cancel(mine) is True
    # A handle read back from its text does not say its queue: it is taken as the queue's own
    assert Timer.parse(str(mine)) == mine and Timer.parse(str(mine)).queue is None


def test_timers_due_in_the_past_on_a_queue_with_a_ttl_fire_at_once_none_lost(make_queue):
    # Given a queue whose messages live 3 s
    queue = make_queue(partitions=2, ttl=3)
    now = wall_clock_ms()
    # When timers are put due in the past: further back than the TTL (seconds for ms, epoch 0),
    # and just inside it, a batch too big for one firing pass
    far = queue.put(
        [Message("t", b"far %d" % i) for i in range(3)], partition_id=0, deliver_at=[now - 61_000, 0, now // 1000]
    )
    edge = queue.put([Message("t", b"edge %d" % i) for i in range(3000)], partition_id=1, deliver_at=now - 3000 + 5)
    # Then each is kept as due when it was written (its ID's time), and fires at once: none expires unfired
    assert all(t.due == t.id.timestamp >= now for t in far + edge)
    wait_for(lambda: len(list(queue.scan())) == 3003, 30, "every timer to fire")


def test_handles_of_past_due_timers_on_a_ttl_queue_are_the_ones_kept_and_a_put_sent_again_gets_them(tmp_path):
    """The remote clients made a past due time their own clock's now, and the server its own:
    a millisecond apart (or a clock skew) the handle named a timer that was never written, so
    its cancel said "not pending"; a put sent again was answered with the unclamped due times."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1, 3)  # messages live 3 s
    engine = Engine.acquire(url)  # no firing loop: what is kept stays pending
    try:
        now, request = wall_clock_ms(), Request(b"T" * 16, 1)
        asked = [now - 60_000, now + 60_000, 0]
        timers = engine.schedule("q", [Message("t", b"%d" % i) for i in range(3)], 0, asked, request)
        again = engine.schedule(
            "q", [Message("t", b"%d" % i) for i in range(3)], 0, asked, request._replace(resent=True)
        )
        assert again == timers and [t.due for t in again] == [t.due for t in timers]
        assert [t.due for t in timers] == [max(a, t.id.timestamp) for a, t in zip(asked, timers, strict=True)]
        assert all(engine.cancel_timer("q", t) for t in timers)  # each handle names what was kept
    finally:
        engine.release()


def test_bad_timer_arguments_are_refused_and_write_nothing(make_queue, admin):
    queue = make_queue(partitions=1)
    with pytest.raises(TypeError, match="not both"):
        queue.put(Message("t", b"x"), delay=1, deliver_at=wall_clock_ms())
    for delay in (-1, float("inf"), float("nan")):  # (inf was an OverflowError)
        with pytest.raises(InvalidArgument, match="'delay' must be finite seconds >= 0"):
            queue.put(Message("t", b"x"), delay=delay)
    with pytest.raises(TypeError, match="deliver_at"):
        queue.put(Message("t", b"x"), deliver_at="tomorrow")
    with pytest.raises(InvalidArgument, match="timer handle"):
        queue.cancel("not/a/timer/handle")
    with pytest.raises(TypeError):
        queue.cancel(42)
    admin.disable_queue(queue.name)
    with pytest.raises(QueueDisabled):
        queue.put(Message("t", b"x"), delay=1)
    admin.enable_queue(queue.name)
    assert list(queue.scan()) == []


def test_pending_timers_survive_closing_and_reopening_the_store(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=2)
    with HQueue("q", url) as queue:
        queue.put(Message("t", b"after restart"), delay=1.0)
        queue.put(Message("t", b"never"), delay=1.0)  # cancelled after the restart
        cancel_me = queue.put(Message("t", b"never"), delay=1.0)[0]
    with HQueue("q", url) as queue:  # the store was closed: a new engine reads the timers back
        assert queue.cancel(cancel_me)
        values = wait_for(lambda: [m.value for m in queue.scan()])
        time.sleep(0.1)
        assert sorted(m.value for m in queue.scan()) == [b"after restart", b"never"]
        assert values


def test_ids_stay_above_pending_timers_after_a_restart(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue:
        (timer,) = queue.put(Message("t", b"x"), delay=3600)
    with HQueue("q", url) as queue:
        (message_id,) = queue.put(Message("t", b"y"))
        assert message_id > timer.id


def test_pending_timers_are_listed_found_by_handle_and_their_next_due_known(make_queue):
    # Given two pending timers on two partitions (on every store, and through a server)
    with make_queue(partitions=2) as queue:
        first = queue.put(Message("a", b"one"), 0, delay=3600)[0]
        second = queue.put(Message("b", b"two"), 1, delay=7200)[0]
        # Then they are listed (per partition, earliest first), found by handle, and the next due is known
        assert [(t, m.value) for t, m in queue.timers()] == [(first, b"one"), (second, b"two")]
        assert [t for t, _ in queue.timers(1)] == [second]
        assert queue.next_due() == first.due
        assert queue.find_timer(str(first)).value == b"one"
        # And a cancelled one is no longer found
        assert queue.cancel(first)
        assert queue.find_timer(first) is None and queue.next_due() == second.due
        assert queue.count_timers() == (1, False) and queue.count_timers(limit=1) == (1, False)
        with pytest.raises(InvalidArgument, match="limit"):
            queue.timers(limit=0)
        with pytest.raises(InvalidArgument, match="timer handle"):
            queue.find_timer("nonsense")
        # A handle made up wrong is refused alike on every store (through a server a bool
        # partition was sent as 1, a float due as an int, and a str failed in the client)
        for made_up, error in (
            (Timer(True, second.due, second.id), TypeError),
            (Timer("1", second.due, second.id), TypeError),  # type: ignore[arg-type]
            (Timer(1, second.due + 0.5, second.id), InvalidArgument),  # type: ignore[arg-type]
            (Timer(1, second.due, second.id.timestamp), TypeError),  # type: ignore[arg-type]
            (Timer(40_000, second.due, second.id), InvalidArgument),
        ):
            for call in (queue.cancel, queue.find_timer):
                with pytest.raises(error):
                    call(made_up)
        assert queue.cancel(second) and queue.timers() == [] and queue.next_due() is None


def test_pending_timers_are_listed_through_a_server_in_answers_of_bounded_bytes(tmp_path, monkeypatch):
    """Pending timers were listed only where the store was open (an embedded store's first
    process, or the server's console): through hqueue:// and in a shared store's other
    processes, timers(), count_timers(), next_due() and find_timer() raised InvalidArgument.
    A server answers them now, each answer bounded in bytes (the client asks on after the
    last timer of a short one), counts without holding more than a chunk of messages, and
    only for tokens that may read the queue's messages."""
    from hqueue import NotAuthorized
    from hqueue.rpc import wire

    monkeypatch.setattr(wire, "STRUCT_REPLY_BYTES", 3000)  # (the server is in this process)
    monkeypatch.setattr("hqueue.engine.TIMER_COUNT_BYTES", 3000)
    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[tokens.ops]\nsecret = "ops-secret-0123456789"\nadmin = ["*"]\n'
        '[tokens.feeder]\nsecret = "feeder-secret-0123456789"\nproducer = ["*"]\n'
    )
    from hqueue.auth import AuthPolicy

    server = HQueueServer("local://" + str(tmp_path / "data"), port=0, auth=AuthPolicy.load(auth)).start()
    try:
        url = f"hqueue://ops-secret-0123456789@{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", partitions=2)
        with HQueue("q", url) as queue:
            due = wall_clock_ms() + 3_600_000
            handles = queue.put([Message("t", b"%04d" % i + b"x" * 1000) for i in range(30)], 0, deliver_at=due)
            listed = queue.timers(0, limit=25)  # some 10 answers of 3 KB
            assert [t for t, _ in listed] == handles[:25]
            assert [m.value[:4] for _, m in listed] == [b"%04d" % i for i in range(25)]
            assert queue.count_timers(limit=20) == (20, True) and queue.count_timers(limit=100) == (30, False)
            assert queue.next_due() == due and queue.find_timer(handles[7]).value[:4] == b"0007"
        with HQueue("q", f"hqueue://feeder-secret-0123456789@{server.address}") as producer_only:
            for read in (producer_only.timers, producer_only.count_timers, producer_only.next_due):
                with pytest.raises(NotAuthorized, match="read the pending timers of"):
                    read()
    finally:
        server.stop()


def test_a_batch_with_a_due_time_per_message_fires_each_at_its_own_time_in_due_order(make_queue):
    # Given one put of five timers, each with its own due time, out of order
    queue = make_queue(partitions=1)
    now = wall_clock_ms()
    offsets = [900, 300, 600, 0, 1200]
    timers = queue.put([Message("t", b"%d" % o) for o in offsets], deliver_at=[now + o for o in offsets])
    # Then each handle carries its message's due time, and the IDs are the batch's, in its order
    assert [t.due for t in timers] == [now + o for o in offsets]
    assert [t.id for t in timers] == sorted(t.id for t in timers)
    # When they fall due, each fires once, never early, earliest due first
    fired = wait_for(lambda: (ms := list(queue.scan())) and len(ms) == 5 and ms)
    time.sleep(0.2)
    assert [m.value for m in queue.scan()] == [b"0", b"300", b"600", b"900", b"1200"]
    assert all(m.id.timestamp >= now + int(m.value) for m in fired)
    # And a cancel takes the handle of one of them
    (later,) = queue.put([Message("t", b"x")], deliver_at=[now + 3_600_000])
    assert queue.cancel(later) and not queue.cancel(later)


def test_due_times_that_are_not_one_per_message_are_refused_and_write_nothing(make_queue):
    queue = make_queue(partitions=1)
    now = wall_clock_ms()
    with pytest.raises(InvalidArgument, match="2 due times for 3 messages"):
        queue.put([Message("t", b"x")] * 3, deliver_at=[now, now])
    with pytest.raises(InvalidArgument, match="due time"):
        queue.put([Message("t", b"x")] * 2, deliver_at=[now, -5])
    with pytest.raises(TypeError, match="deliver_at"):
        queue.put([Message("t", b"x")] * 2, deliver_at=[now, "soon"])
    time.sleep(0.5)  # due now: had any been written, it would have fired
    assert list(queue.scan()) == []


def test_a_timer_put_below_the_floor_while_a_pass_fires_still_fires(tmp_path):
    # Given an embedded store whose firing loop, in the middle of a pass (its write done,
    # its floor not yet moved past now), hears of a timer due an hour ago
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    with HQueue("q", url) as queue:
        late: list[Timer] = []

        def put_one_in_the_past(name: str, pid: int) -> None:
            if not late:
                late.extend(queue.put(Message("t", b"late"), 0, deliver_at=wall_clock_ms() - 3_600_000))

        queue.engine.events.on_write(put_one_in_the_past)
        # When the first timer fires (and the pass ends with its floor at now + 1)
        queue.put(Message("t", b"first"), 0, delay=0.1)
        # Then the one put meanwhile fires too: the pass did not move the floor above it
        assert wait_for(lambda: sorted(m.value for m in queue.scan()) == [b"first", b"late"], timeout=10)


def test_a_restart_fires_what_fell_due_while_down_in_due_order_then_keeps_firing(tmp_path):
    # Given 2,500 timers due while no process has the store open (over the 1,000 a pass fires),
    # and one due later
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions=1)
    now = wall_clock_ms()
    with HQueue("q", url) as queue:
        dues = [now + 400 + (i * 7919) % 2500 for i in range(2500)]  # shuffled, 0.4-2.9 s ahead
        queue.put([Message("t", b"%d" % d) for d in dues], 0, deliver_at=dues)
        queue.put(Message("t", b"later"), 0, delay=5)
        assert list(queue.scan()) == []  # closed before any is due
    time.sleep(max(0.0, (now + 3000 - wall_clock_ms()) / 1000))
    # When a process opens the store again
    with HQueue("q", url) as queue:
        # Then every one that came due fires, once, in due order, and the later one fires at its time
        fired = wait_for(lambda: (ms := list(queue.scan())) and len(ms) == 2501 and ms, timeout=20)
        assert [m.value for m in fired[:2500]] == [b"%d" % d for d in sorted(dues)]
        assert fired[-1].value == b"later"
        time.sleep(0.2)
        assert len(list(queue.scan())) == 2501


def test_timers_due_together_on_every_partition_of_a_sync_wal_queue_each_fire_once(make_queue):
    # Given a SYNC_WAL queue (whose due partitions fire side by side, sharing fsyncs),
    # 200 timers on each of its 8 partitions, all due in the same millisecond
    queue = make_queue(partitions=8, durability="SYNC_WAL")
    due = wall_clock_ms() + 400
    for pid in range(8):
        queue.put([Message("t", b"%d-%03d" % (pid, i)) for i in range(200)], pid, deliver_at=due)
    # When they fall due, then each fires once, on its own partition, in order within it
    wait_for(lambda: len(list(queue.scan())) == 1600)
    time.sleep(0.3)
    fired = list(queue.scan())
    assert len(fired) == 1600 and min(m.id.timestamp for m in fired) >= due
    for pid in range(8):
        mine = [m.value for m in fired if m.partition_id == pid]
        assert mine == [b"%d-%03d" % (pid, i) for i in range(200)]


def test_the_latest_due_time_a_timer_may_have_is_still_listed_and_counted(make_queue):
    from hqueue.keys.timers import MAX_DUE

    # Given a timer due at the latest time allowed, and one past it refused
    queue = make_queue()
    far = queue.put(Message("far", b"v"), 0, deliver_at=MAX_DUE)[0]
    with pytest.raises(InvalidArgument, match="due time"):
        queue.put(Message("far", b"v"), 0, deliver_at=MAX_DUE + 1)
    # Then the allowed one is pending where every pending timer is: listed, counted, next due
    assert [t for t, _ in queue.timers()] == [far]
    assert queue.next_due() == MAX_DUE


@pytest.fixture
def refreshing(tmp_path):
    """A timer loop (not started) on an embedded store with queue ``q``, and a way to put a
    timer due at a given time while the loop reads the partition's next due time."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    engine = Engine.acquire(url)
    service = TimerService(engine, LocalCoordinator("x"), lambda: [("q", 1)])
    engine.events.on_schedule(service.scheduled)
    read = engine.next_timer

    def put_during_the_read(due: int) -> None:
        def next_timer(queue, pid, since=0):
            found = read(queue, pid, since)  # what the store held when read ...
            engine.schedule(queue, [Message("t", b"v")], pid, due)  # ... and a timer put meanwhile
            return found

        engine.next_timer = next_timer

    yield service, engine, put_during_the_read
    engine.events.off(service.scheduled)
    engine.release()


def test_a_timer_put_while_the_loop_reads_the_store_keeps_its_wake_up(refreshing):
    """The loop read "no timer" from the store, a put scheduled a wake-up meanwhile, and the
    loop's answer erased it: the timer stayed unfired until something else woke the partition."""
    service, _, put_during_the_read = refreshing
    due = wall_clock_ms() + 3_600_000
    put_during_the_read(due)
    service._refresh("q", 0)
    assert service._next[("q", 0)] == due


def test_a_timer_put_while_the_loop_reads_a_later_one_keeps_its_earlier_wake_up(refreshing):
    service, engine, put_during_the_read = refreshing
    later = wall_clock_ms() + 7_200_000
    engine.schedule("q", [Message("t", b"later")], 0, later)
    put_during_the_read(later - 3_600_000)
    service._refresh("q", 0)
    assert service._next[("q", 0)] == later - 3_600_000


def test_a_read_with_no_put_meanwhile_says_what_is_stored(refreshing):
    # A wake-up left from a timer since cancelled goes, when nothing was put during the read
    service, engine, _ = refreshing
    (timer,) = engine.schedule("q", [Message("t", b"v")], 0, wall_clock_ms() + 3_600_000)
    assert service._next[("q", 0)] == timer.due
    assert engine.cancel_timer("q", timer)
    service._refresh("q", 0)
    assert ("q", 0) not in service._next
