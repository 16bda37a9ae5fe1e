"""What wakes a waiting consumer-group receive (groups/arrivals.py)."""

from __future__ import annotations

import threading

from hqueue.groups.arrivals import Arrivals

from ..processes import wait_for


def waiting(arrivals: Arrivals, queue: str, group: str, member: str = "m") -> threading.Thread:
    """A receive of ``member`` of ``group`` on ``queue`` waiting up to 30 s in a thread, once it waits."""
    ready = threading.Event()
    before = arrivals.waiting(queue)

    def receive() -> None:
        with arrivals.receiving(queue, group, member):
            seen = arrivals.seen(queue, group, member)
            ready.set()
            arrivals.wait(queue, group, member, seen, 30.0)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    ready.wait(10)
    wait_for(lambda: arrivals.waiting(queue) == before + 1, 10, "the receive to wait")
    return thread


def test_a_write_to_its_queue_or_an_ack_in_its_group_wakes_a_receive():
    arrivals = Arrivals()
    for wake in (lambda: arrivals.written("q"), lambda: arrivals.finished("q", "g")):
        thread = waiting(arrivals, "q", "g")
        wake()
        thread.join(10)
        assert not thread.is_alive()
    assert arrivals.waiting("q") == 0  # (no condition kept for a queue nobody waits on)
    assert arrivals._waiting == {} and arrivals._members == {}


def test_another_queue_s_write_and_another_group_s_ack_leave_it_waiting():
    # Given a receive of group g waiting on queue q
    arrivals = Arrivals()
    thread = waiting(arrivals, "q", "g")
    # When another queue is written, and another group of q acks
    arrivals.written("other")
    arrivals.finished("q", "h")
    arrivals.finished("other", "g")
    # Then it still waits (not even woken: h's receives have conditions of their own)
    thread.join(0.2)
    assert thread.is_alive() and arrivals.waiting("q") == 1
    arrivals.finished("q", "g")
    thread.join(10)
    assert not thread.is_alive()


def test_a_member_s_room_wakes_its_own_receives_and_no_other():
    # (50 members waiting on a drained queue were all woken by each ack of another member
    # at its cap: 5 ms of server CPU an ack, bench/group_abuse.py)
    arrivals = Arrivals()
    a, b = waiting(arrivals, "q", "g", "a"), waiting(arrivals, "q", "g", "b")
    arrivals.freed("q", "g", {"a"})
    a.join(10)
    assert not a.is_alive()
    b.join(0.2)
    assert b.is_alive()
    arrivals.freed("q", "h", {"b"})  # another group's member of that name: not b
    b.join(0.2)
    assert b.is_alive()
    arrivals.written("q")
    b.join(10)
    assert not b.is_alive()


def test_room_for_a_member_with_no_receive_under_way_keeps_nothing():
    arrivals = Arrivals()
    for n in range(1000):
        arrivals.freed("q", "g", {f"m{n}"})
    assert arrivals._members == {} and arrivals.seen("q", "g", "m1") == (0, 0, 0, 0)


def test_what_happened_between_its_look_and_its_wait_is_not_missed():
    arrivals = Arrivals()
    seen = arrivals.seen("q", "g", "m")
    arrivals.written("q")  # (after its look, before its wait)
    arrivals.wait("q", "g", "m", seen, 30.0)  # returns at once
    with arrivals.receiving("q", "g", "m"):
        seen = arrivals.seen("q", "g", "m")
        arrivals.freed("q", "g", {"m"})  # its member's room, likewise
        arrivals.wait("q", "g", "m", seen, 30.0)
    seen = arrivals.seen("q", "g", "m")
    arrivals.forget("q")  # the queue dropped meanwhile: it looks again
    arrivals.wait("q", "g", "m", seen, 30.0)
    seen = arrivals.seen("q", "g", "m")
    arrivals.forget("q", "g")  # its group deleted (never acked in: no generation of its own)
    arrivals.wait("q", "g", "m", seen, 30.0)


def test_the_stop_wakes_every_receive_for_good():
    arrivals = Arrivals()
    threads = [waiting(arrivals, queue, "g") for queue in ("a", "b")]
    arrivals.stop()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    arrivals.wait("a", "g", "m", None, 30.0)  # (returns at once)


def test_groups_deleted_and_queues_dropped_leave_nothing_behind():
    # (a client that makes and deletes groups under new names must not grow the server)
    arrivals = Arrivals()
    for n in range(1000):
        arrivals.finished("q", f"g{n}")
        arrivals.forget("q", f"g{n}")
    arrivals.written("q")
    arrivals.finished("q", "kept")
    arrivals.forget("q")
    assert arrivals._generations == {}


def test_listeners_hear_each_group_event_by_its_queue():
    # (an asyncio receive waits on its loop, not here: it is told, and looks again)
    arrivals, heard = Arrivals(), []
    arrivals.listen(heard.append)
    arrivals.written("w")  # (writes: the engine's events say those)
    arrivals.finished("f", "g")
    arrivals.freed("m", "g", {"nobody receiving"})
    arrivals.forget("d", "g")
    assert heard == ["f", "m", "d"]
