"""The push pool's turns (subscriptions/loops.py): slow subscribers share a quarter of the
threads, and a worker's stop never waits behind them."""

from __future__ import annotations

import threading
import time
from unittest import mock

from hqueue.subscriptions.delivery import FINISHED
from hqueue.subscriptions.loops import PushPool, SubscriberLoop


class Worker:
    """A partition's worker whose push takes ``work`` seconds; stopped, it only finishes."""

    def __init__(self, partition_id: int, work: float) -> None:
        self.partition_id, self.work = partition_id, work
        self.stopping, self.done = threading.Event(), threading.Event()
        self.queued = self.idle = self.dirty = False
        self.stopped_at: float | None = None

    def step(self, loop: SubscriberLoop) -> float:
        if self.stopping.is_set():
            self.stopped_at = time.monotonic()
            return FINISHED
        time.sleep(self.work)
        return 3600.0  # (again in an hour)


def test_a_worker_s_stop_runs_at_once_though_its_subscriber_waits_for_a_slow_thread():
    """A slow subscriber's loop held back (the slow threads taken) was not looked at again
    when one of its workers was asked to stop: the stop waited for another subscriber's
    slow push to end (5.4 s here; up to the send timeout, a minute), the manager's thread
    with it (a review)."""
    manager = mock.MagicMock(idle_wakeup=3600.0)
    manager.engine.queue_info.return_value = None
    pool = PushPool(4)  # one thread for slow subscribers
    try:
        busy = SubscriberLoop(manager, pool, "q", "busy")
        held = SubscriberLoop(manager, pool, "q", "held")
        busy.slow = held.slow = True
        busy.add(Worker(0, 3.0))  # takes the slow thread for 3 s
        time.sleep(0.3)
        stopping = Worker(1, 0.0)
        with pool.cond:
            held.workers[1] = stopping  # (idle)
        held.add(Worker(0, 3.0))  # held back: the slow thread is taken
        time.sleep(0.3)
        asked = time.monotonic()
        held.stopping(stopping)
        assert stopping.done.wait(10)
        assert stopping.stopped_at is not None and stopping.stopped_at - asked < 1.0
    finally:
        pool.stop()
