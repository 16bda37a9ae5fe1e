"""The subscription manager: runs the push workers this server owes (delivery.py),
reconciled with the registrations and with partition ownership on every
change, and every second."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from ..auth import PushPolicy
from ..coordination import Coordinator
from ..engine import Engine
from ..errors import HQueueError
from ..metrics import ServerMetrics
from ..rpc.connections import RateLimitedLog
from .delivery import Key, PartitionWorker
from .loops import DEFAULT_PUSH_THREADS, PushPool, SubscriberLoop
from .registry import Registration, SubscriberRegistry

logger = logging.getLogger(__name__)


#: Subscribers one server pushes to at most (``--max-subscribers``).
DEFAULT_MAX_SUBSCRIBERS = 1000
#: A push checkpoint is saved after this many messages delivered since the last save, or
#: after this many seconds, whichever first (``--checkpoint-messages``, ``--checkpoint-interval``):
#: a crash pushes again at most that many messages per subscriber and partition (delivery.py).
DEFAULT_CHECKPOINT_MESSAGES = 1000
DEFAULT_CHECKPOINT_INTERVAL = 1.0


class SubscriptionManager:
    """Runs the workers this server owes: attached subscribers x owned partitions.

    At most ``max_subscribers`` subscribers are pushed to; the others wait
    (with a warning each minute) until one leaves.
    """

    def __init__(
        self,
        engine: Engine,
        coordinator: Coordinator,
        registry: SubscriberRegistry,
        *,
        batch_size: int = 1000,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        checkpoint_messages: int = DEFAULT_CHECKPOINT_MESSAGES,
        idle_wakeup: float = 1.0,
        send_timeout: float = 60.0,
        push_policy: PushPolicy | None = None,
        metrics: ServerMetrics | None = None,
        require_tls: bool = False,
        push_threads: int = DEFAULT_PUSH_THREADS,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
    ) -> None:
        self.engine, self.coordinator, self.registry = engine, coordinator, registry
        self.metrics = metrics or ServerMetrics()
        self.push_policy = push_policy or PushPolicy()
        self.batch_size, self.checkpoint_interval, self.idle_wakeup = batch_size, checkpoint_interval, idle_wakeup
        self.checkpoint_messages = checkpoint_messages
        self.send_timeout_ms = int(send_timeout * 1000)
        self.require_tls, self.max_subscribers = require_tls, max_subscribers
        self.pool = PushPool(push_threads)
        self._over = RateLimitedLog(60.0, logger)
        self.workers: dict[Key, PartitionWorker] = {}
        self.loops: dict[tuple[str, str], SubscriberLoop] = {}
        self._by_partition: dict[tuple[str, int], tuple[PartitionWorker, ...]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hqueue-subscriptions", daemon=True)
        engine.events.on_write(self._on_write)
        registry.on_change(self._changed.set)
        coordinator.add_listener(lambda gained, lost: self._changed.set())

    def start(self) -> None:
        self._thread.start()

    def _on_write(self, queue: str, partition_id: int) -> None:
        for worker in self._by_partition.get((queue, partition_id), ()):
            loop = self.loops.get((worker.queue, worker.name))
            if loop is not None:
                loop.wake(worker)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.reconcile()
            except Exception:
                logger.warning("reconciling subscription workers failed; retrying", exc_info=True)
            self._changed.wait(1.0)
            self._changed.clear()

    def reconcile(self) -> None:
        """Start the workers owed, stop the others."""
        wanted: dict[Key, Registration] = {}
        attached = self.registry.attached()
        if len(attached) > self.max_subscribers:
            self._over.warning(
                "max", "%d subscribers are attached; this server pushes to %d (--max-subscribers)",
                len(attached), self.max_subscribers,
            )  # fmt: skip
            attached = fair_share(attached, self.max_subscribers, self.loops)
        for registration in attached:
            try:
                partitions = self.engine.queue_info(registration.queue).partitions
            except HQueueError:
                continue  # the queue is gone or unreadable now
            for pid in range(partitions):
                if registration.takes(pid) and self.coordinator.owns(registration.queue, pid):
                    wanted[(registration.queue, registration.name, pid)] = registration
        with self._lock:
            self._stop_workers(
                [
                    key
                    for key, worker in self.workers.items()
                    if (want := wanted.get(key)) is None
                    or _identity(want) != _identity(worker.registration)
                    or not worker.is_alive()
                ]
            )
            started: dict[SubscriberLoop, list[PartitionWorker]] = {}
            for key, registration in wanted.items():
                if key not in self.workers:
                    # attached() read the registration in this pass: its checkpoints
                    # are as stored now, including those another server moved.
                    worker = PartitionWorker(self, registration, key[2])
                    self.workers[key] = worker
                    # Copy on write: _on_write iterates these tuples without the lock.
                    partition = (key[0], key[2])
                    self._by_partition[partition] = (*self._by_partition.get(partition, ()), worker)
                    loop = self.loops.get((key[0], key[1]))
                    if loop is None:
                        loop = self.loops[(key[0], key[1])] = SubscriberLoop(self, self.pool, key[0], key[1])
                    started.setdefault(loop, []).append(worker)
                    logger.info("delivering %s partition %d to %s at %s", key[0], key[2], key[1], registration.address)
            for loop, workers in started.items():  # a subscriber's together (its tiers' order from the first push)
                loop.add(*workers)
            owed = {(queue, name) for queue, name, _ in self.workers}
            for loop_key in [k for k in self.loops if k not in owed]:
                self.loops.pop(loop_key).stop()
                self.metrics.forget_subscriber(*loop_key)  # (bounded by the subscribers pushed to)

    def running(self) -> list[PartitionWorker]:
        """The workers now (a copy: reconcile changes the map on its own thread)."""
        with self._lock:
            return list(self.workers.values())

    def settled(self) -> bool:
        """Whether every worker has pushed all it read and waits for writes:
        nothing more would be delivered now (what tests wait for, not a sleep)."""
        return all(worker.idle and not worker.buffer for worker in self.running())

    def _stop_workers(self, keys: list[Key]) -> None:
        """Stop the workers of ``keys``: each asked first, then each waited for. One by one,
        a slow subscriber's other workers went on pushing between the stops, and each stop
        waited for its push (a hostile subscriber's 16 workers held this thread, and every
        other subscriber's start, for 35-50 s: an attacker's pass)."""
        stopped = []
        for key in keys:
            worker = self.workers.pop(key)
            partition = (key[0], key[2])
            self._by_partition[partition] = tuple(w for w in self._by_partition[partition] if w is not worker)
            loop = self.loops[(key[0], key[1])]
            loop.stopping(worker)
            stopped.append((key, loop, worker))
        for key, loop, worker in stopped:
            loop.removed(worker)
            logger.info("paused delivery of %s partition %d to %s", key[0], key[2], key[1])

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        self._thread.join(timeout=10)
        with self._lock:
            self._stop_workers(list(self.workers))
            for loop in self.loops.values():
                loop.stop()
            self.loops.clear()
        self.pool.stop()


def _identity(registration: Registration) -> tuple:
    """What a running worker depends on: a change means a restart."""
    return (
        registration.address, registration.effective_topics, registration.epoch, registration.dead_letter_after,
        registration.push, registration.approved, registration.made,
    )  # fmt: skip


def fair_share(attached: list[Registration], limit: int, pushed: Collection[tuple[str, str]]) -> list[Registration]:
    """``limit`` of ``attached``, dealt to their queues in turn (one a queue, then a second
    each...), so the subscribers of one queue cannot take every place from the others'
    (a token that manages one queue's subscribers heartbeat 60 names, and another queue's
    subscriber got nothing); within a queue, those ``pushed`` to already go first."""
    by_queue: dict[str, list[Registration]] = {}
    for registration in sorted(attached, key=lambda r: ((r.queue, r.name) not in pushed, r.name)):
        by_queue.setdefault(registration.queue, []).append(registration)
    queues = [by_queue[queue] for queue in sorted(by_queue)]
    chosen: list[Registration] = []
    for turn in range(max(map(len, queues), default=0)):
        for registrations in queues:
            if turn < len(registrations):
                if len(chosen) == limit:
                    return chosen
                chosen.append(registrations[turn])
    return chosen
