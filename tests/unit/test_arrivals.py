"""What wakes a waiting consumer-group receive (groups/arrivals.py)."""

from __future__ import annotations

import threading

from hqueue.groups.arrivals import Arrivals

from ..processes import wait_for


def waiting(arrivals: Arrivals, queue: str, group: str) -> threading.Thread:
    """A receive of ``group`` on ``queue`` waiting up to 30 s in a thread, once it waits."""
    seen = arrivals.seen(queue, group)
    thread = threading.Thread(target=arrivals.wait, args=(queue, group, seen, 30.0), daemon=True)
    thread.start()
    wait_for(lambda: arrivals.waiting(queue) == 1, 10, "the receive to wait")
    return thread


def test_a_write_to_its_queue_or_an_ack_in_its_group_wakes_a_receive():
    arrivals = Arrivals()
    for wake in (lambda: arrivals.written("q"), lambda: arrivals.finished("q", "g")):
        thread = waiting(arrivals, "q", "g")
        wake()
        thread.join(10)
        assert not thread.is_alive()
    assert arrivals.waiting("q") == 0  # (no condition kept for a queue nobody waits on)


def test_another_queue_s_write_and_another_group_s_ack_leave_it_waiting():
    # Given a receive of group g waiting on queue q
    arrivals = Arrivals()
    thread = waiting(arrivals, "q", "g")
    # When another queue is written, and another group of q acks
    arrivals.written("other")
    arrivals.finished("q", "h")
    arrivals.finished("other", "g")
    # Then it still waits (woken by h's ack, it went back to waiting without looking)
    thread.join(0.2)
    assert thread.is_alive() and arrivals.waiting("q") == 1
    arrivals.finished("q", "g")
    thread.join(10)
    assert not thread.is_alive()


def test_what_happened_between_its_look_and_its_wait_is_not_missed():
    arrivals = Arrivals()
    seen = arrivals.seen("q", "g")
    arrivals.written("q")  # (after its look, before its wait)
    arrivals.wait("q", "g", seen, 30.0)  # returns at once
    seen = arrivals.seen("q", "g")
    arrivals.forget("q")  # the queue dropped meanwhile: it looks again
    arrivals.wait("q", "g", seen, 30.0)


def test_the_stop_wakes_every_receive_for_good():
    arrivals = Arrivals()
    threads = [waiting(arrivals, queue, "g") for queue in ("a", "b")]
    arrivals.stop()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    arrivals.wait("a", "g", None, 30.0)  # (returns at once)


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
