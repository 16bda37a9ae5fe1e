"""Push delivery to subscribers, server side (SPEC C7).

For every attached subscriber and every partition it takes that this server
owns, a :class:`SubscriptionWorker` runs. Each worker does three jobs:

* MessageScanner: reads the next batch after the checkpoint into its buffer
  (at most ``batch_size`` messages). When there is nothing new it sleeps
  on an event that the engine sets on every write to the partition, so a
  put wakes it at once. It also wakes every ``idle_wakeup`` seconds.
* MessageSender: sends the buffer with ``consumeMessages`` and waits for the
  status. A non-zero status or a transport error is retried with
  exponential backoff (10 ms up to 5 s), the same batch again, never
  skipped.
* CheckpointUpdater: saves the checkpoint every ``checkpoint_interval``
  seconds and when the worker stops.

A checkpoint is the first ID not yet delivered. Delivery is at least once:
after a crash (of this server, or a failover), delivery resumes from the
last saved checkpoint, so the duplicates are at most what was delivered in
the last ``checkpoint_interval`` (1 s by default), per partition.

With topic filters, a scan examines every row up to the partition's last
ID and then moves the checkpoint past the whole range, so rows of other
topics are never read twice.

The :class:`SubscriptionManager` reconciles workers with the registrations
and with partition ownership on every change, and every second.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TException
from thriftpy2.transport import TFramedTransportFactory

from ..coordination import Coordinator
from ..coordination.registry import Registration, SubscriberNotFound, SubscriberRegistry, successor
from ..engine import Engine
from ..errors import HQueueError
from ..message import MessageID
from ..rpc import wire
from ..scanner import Scan

logger = logging.getLogger(__name__)

Key = tuple[str, str, int]  # (queue, subscriber, partition)


class SubscriptionWorker(threading.Thread):
    """Delivers one partition of one queue to one subscriber, in order."""

    def __init__(self, manager: SubscriptionManager, registration: Registration, partition_id: int) -> None:
        super().__init__(daemon=True, name=f"hqueue-push-{registration.name}-{partition_id}")
        self.manager, self.registration, self.partition_id = manager, registration, partition_id
        self.queue, self.name = registration.queue, registration.name
        self.checkpoint = registration.checkpoints.get(partition_id, MessageID(0))
        self.saved = self.checkpoint
        self.wakeup = threading.Event()
        self.stopping = threading.Event()
        self.buffer: list[Any] = []
        #: Where the checkpoint moves once the buffer is delivered.
        self.reached = self.checkpoint
        self._client: Any = None
        self._last_save = time.monotonic()

    # -- MessageScanner --------------------------------------------------------------

    def _fill(self) -> MessageID | None:
        """Read the next batch into the buffer; return where the scan got to."""
        engine = self.manager.engine
        last = engine.last_id(self.queue, self.partition_id)
        if last is None or last < self.checkpoint:
            return None
        stop = successor(last)
        scan = Scan(self.checkpoint, stop, self.registration.effective_topics)
        start_key, stop_key = scan.key_range(self.partition_id)
        messages = engine.scan(self.queue, start_key, stop_key, scan.topics, self.manager.batch_size)
        self.buffer = wire.to_tmessages(messages)
        # A short batch examined every row up to `last`; a full one stops at its last message.
        return stop if len(messages) < self.manager.batch_size else successor(MessageID.from_bytes(messages[-1][0]))

    # -- MessageSender ----------------------------------------------------------------

    def _send(self) -> bool:
        try:
            if self._client is None:
                host, _, port = str(self.registration.address).rpartition(":")
                self._client = make_client(
                    wire.T.HQueueSubscriberService, host, int(port),
                    proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(),
                    timeout=self.manager.send_timeout_ms,
                )  # fmt: skip
            status = self._client.consumeMessages(self.buffer)
        except (TException, OSError) as e:
            logger.info("%s: sending %d message(s) failed: %s", self.name, len(self.buffer), e)
            self._drop_client()
            return False
        if status != 0:
            logger.info("%s: subscriber returned status %s for %d message(s)", self.name, status, len(self.buffer))
        return status == 0

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- CheckpointUpdater --------------------------------------------------------------

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.checkpoint == self.saved or (not force and now - self._last_save < self.manager.checkpoint_interval):
            return
        try:
            registry = self.manager.registry
            if not registry.save_checkpoints(
                self.queue, self.name, {self.partition_id: self.checkpoint}, self.registration.epoch
            ):
                self.stopping.set()  # replayed meanwhile: the manager starts a worker of the new epoch
                registry.changed()
            self.saved, self._last_save = self.checkpoint, now
        except SubscriberNotFound:
            self.stopping.set()  # deleted meanwhile
        except HQueueError:
            logger.warning("%s: saving the checkpoint failed; will retry", self.name, exc_info=True)

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.01
        while not self.stopping.is_set():
            try:
                if not self.buffer:
                    self.wakeup.clear()  # before the scan: a write after it sets it again
                    reached = self._fill()
                    if reached is None:
                        self._save()
                        self.wakeup.wait(self.manager.idle_wakeup)
                        continue
                    self.reached = reached
                    if not self.buffer:
                        self.checkpoint = reached  # only rows of other topics: skip them for good
                        continue
                if self._send():
                    self.checkpoint, self.buffer, backoff = self.reached, [], 0.01
                    self._save()
                else:
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
            except Exception:  # one bad turn never kills delivery
                logger.exception("%s partition %d: delivery failed; retrying", self.name, self.partition_id)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._save(force=True)
        self._drop_client()

    def stop(self) -> None:
        self.stopping.set()
        self.wakeup.set()


class SubscriptionManager:
    """Runs the workers this server owes: attached subscribers x owned partitions."""

    def __init__(
        self,
        engine: Engine,
        coordinator: Coordinator,
        registry: SubscriberRegistry,
        *,
        batch_size: int = 1000,
        checkpoint_interval: float = 1.0,
        idle_wakeup: float = 1.0,
        send_timeout: float = 60.0,
    ) -> None:
        self.engine, self.coordinator, self.registry = engine, coordinator, registry
        self.batch_size, self.checkpoint_interval, self.idle_wakeup = batch_size, checkpoint_interval, idle_wakeup
        self.send_timeout_ms = int(send_timeout * 1000)
        self.workers: dict[Key, SubscriptionWorker] = {}
        self._by_partition: dict[tuple[str, int], tuple[SubscriptionWorker, ...]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hqueue-subscriptions", daemon=True)
        engine.add_write_listener(self._on_write)
        registry.on_change(self._changed.set)
        coordinator.add_listener(lambda gained, lost: self._changed.set())

    def start(self) -> None:
        self._thread.start()

    def _on_write(self, queue: str, partition_id: int) -> None:
        for worker in self._by_partition.get((queue, partition_id), ()):
            worker.wakeup.set()

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
        for registration in self.registry.attached():
            try:
                partitions = self.engine.queue_info(registration.queue).partitions
            except HQueueError:
                continue  # the queue is gone or unreadable now
            for pid in range(partitions):
                if registration.takes(pid) and self.coordinator.owns(registration.queue, pid):
                    wanted[(registration.queue, registration.name, pid)] = registration
        with self._lock:
            for key, worker in list(self.workers.items()):
                want = wanted.get(key)
                if want is None or _identity(want) != _identity(worker.registration) or not worker.is_alive():
                    self._stop_worker(key)
            for key, registration in wanted.items():
                if key not in self.workers:
                    # attached() read the registration in this pass: its checkpoints
                    # are as stored now, including those another server moved.
                    worker = SubscriptionWorker(self, registration, key[2])
                    self.workers[key] = worker
                    # Copy on write: _on_write iterates these tuples without the lock.
                    partition = (key[0], key[2])
                    self._by_partition[partition] = (*self._by_partition.get(partition, ()), worker)
                    worker.start()
                    logger.info("delivering %s partition %d to %s at %s", key[0], key[2], key[1], registration.address)

    def _stop_worker(self, key: Key) -> None:
        worker = self.workers.pop(key)
        partition = (key[0], key[2])
        self._by_partition[partition] = tuple(w for w in self._by_partition[partition] if w is not worker)
        worker.stop()
        worker.join(timeout=10)
        logger.info("paused delivery of %s partition %d to %s", key[0], key[2], key[1])

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        self._thread.join(timeout=10)
        with self._lock:
            for key in list(self.workers):
                self._stop_worker(key)


def _identity(registration: Registration) -> tuple:
    """What a running worker depends on: a change means a restart."""
    return registration.address, registration.effective_topics, registration.epoch
