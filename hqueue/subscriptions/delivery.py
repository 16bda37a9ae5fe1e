"""Push delivery to subscribers, server side (SPEC C7).

For every attached subscriber this server owes messages to, one
:class:`~hqueue.subscriptions.loops.SubscriberLoop` holds a
:class:`PartitionWorker` for each partition the subscriber takes that this
server owns, and one connection to the subscriber; a fixed pool of threads
runs the loops' steps in turn (loops.py), so a queue of 4,000 partitions
and 300 subscribers cost the pool's threads, not 4,000 or 300. Each worker
does three jobs:

* MessageScanner: reads the next batch after the checkpoint into its buffer
  (at most ``batch_size`` messages). When there is nothing new it waits for
  the engine's write listener, which wakes it at once on a put to its
  partition; it also wakes every ``idle_wakeup`` seconds.
* MessageSender: sends the buffer with ``consumePacked`` (``consumeMessages``
  to a subscriber that does not know it) and waits for the
  status. A non-zero status or a transport error is retried with
  exponential backoff (10 ms up to 5 s), the same batch again, never
  skipped; other partitions of the subscriber go on meanwhile.
* CheckpointUpdater: saves the checkpoint once ``checkpoint_messages``
  messages were delivered since the last save, or ``checkpoint_interval``
  seconds after it, whichever comes first, and when the worker stops.

A checkpoint is the first ID not yet delivered. Delivery is at least once:
after a crash (of this server, or a failover), delivery resumes from the
last saved checkpoint, so what comes again is what was delivered (or was
being pushed) since the last save. The bound that holds under any load is
the count: **at most ``checkpoint_messages`` (1,000 by default) duplicates
per subscriber and partition**. A batch is cut so that it never crosses the
count, and a worker whose save fails pushes nothing more until a save
works. The time bound (``checkpoint_interval``, 1 s) is a target, not a
promise: the save comes after the push under way ends, and on a loaded
machine both take longer.

With topic filters, a scan examines every row up to the partition's last
ID and then moves the checkpoint past the whole range, so rows of other
topics are never read twice.

``manager.py``'s :class:`SubscriptionManager` reconciles workers with the
registrations and with partition ownership on every change, and every second.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ..auth import PushPolicy
from ..coordination import Coordinator
from ..deadletters import dead_letter, dead_letter_queue
from ..engine import Engine
from ..errors import HQueueError, SubscriberNotFound
from ..keys.requests import LANE_LENGTH
from ..message import Message, MessageID, id_bytes, messages_from_columns, successor
from ..metrics import ServerMetrics
from ..scanner import Scan
from .registry import Registration, SubscriberRegistry

logger = logging.getLogger(__name__)

Key = tuple[str, str, int]  # (queue, subscriber, partition)


#: What a worker's step asks for next.
AGAIN, IDLE, FINISHED = 0.0, -1.0, -2.0


class Manager(Protocol):
    """What a worker and a loop need of the manager running them (manager.py)."""

    engine: Engine
    coordinator: Coordinator
    registry: SubscriberRegistry
    metrics: ServerMetrics
    push_policy: PushPolicy
    batch_size: int
    checkpoint_interval: float
    checkpoint_messages: int
    idle_wakeup: float
    send_timeout_ms: int
    #: Whether pushes must travel over TLS (the server serves TLS).
    require_tls: bool


class Sender(Protocol):
    """The subscriber's connection a worker pushes through (loops.py)."""

    def send(self, worker: PartitionWorker) -> bool | None: ...


class Batch:
    """The messages a worker pushes next, as the store holds them: cell keys (rowkey and
    topic) and values, in ID order; no object per message."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: Sequence[bytes] = (), values: Sequence[bytes] = ()) -> None:
        self.keys, self.values = list(keys), list(values)

    def __len__(self) -> int:
        return len(self.keys)

    def head(self) -> Batch:
        """The first message alone."""
        return Batch(self.keys[:1], self.values[:1])

    def last_id(self) -> MessageID:
        return MessageID.from_bytes(id_bytes(self.keys[-1]))

    def messages(self) -> list[Message]:
        return messages_from_columns(self.keys, self.values)


class PartitionWorker:
    """Delivers one partition of one queue to one subscriber, in order, one step at a time."""

    def __init__(self, manager: Manager, registration: Registration, partition_id: int) -> None:
        self.manager, self.registration, self.partition_id = manager, registration, partition_id
        self.queue, self.name = registration.queue, registration.name
        self.checkpoint = registration.checkpoints.get(partition_id, MessageID(0))
        self.saved = self.checkpoint
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.buffer = Batch()
        #: Where the checkpoint moves once the buffer is delivered.
        self.reached = self.checkpoint
        self.backoff = 0.01
        self._last_save = time.monotonic()
        #: Messages delivered since the last saved checkpoint: what a crash now would push again.
        self.unsaved = 0
        #: Failed pushes of the current buffer; and, while isolating a poison
        #: message, where one-at-a-time delivery ends.
        self.failures = 0
        self.careful_until: MessageID | None = None
        #: Messages delivered (or dead-lettered) by this worker, and with the checkpoint
        #: as one tuple, read at one instant by the metrics' lag book (lag.py).
        self.finished = 0
        self.progress = (self.checkpoint.to_bytes(), 0)
        self.lag_seed: Any = None
        # Scheduling state, kept under the push pool's lock.
        self.queued = self.idle = self.dirty = False

    def is_alive(self) -> bool:
        return not self.done.is_set()

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
        # One message at a time while looking for a poison message (see _refused); and never
        # past checkpoint_messages unsaved, so that a crash repeats at most that many.
        size = 1 if self.careful_until is not None and self.checkpoint < self.careful_until else self.manager.batch_size
        size = max(1, min(size, self.manager.checkpoint_messages - self.unsaved))
        self.buffer = Batch(*engine.scan_columns(self.queue, start_key, stop_key, scan.topics, size))
        # A short batch examined every row up to `last`; a full one stops at its last message.
        if len(self.buffer) < size:
            return stop
        return successor(self.buffer.last_id())

    # -- CheckpointUpdater --------------------------------------------------------------

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        due = (
            force
            or self.unsaved >= self.manager.checkpoint_messages
            or now - self._last_save >= self.manager.checkpoint_interval
        )
        if self.checkpoint == self.saved:
            self.unsaved = 0
            return
        if not due:
            return
        try:
            # Only while this server still holds the partition's fence (SPEC C10): a paused
            # former owner's checkpoint would move the new owner's subscriber back or on.
            self.manager.engine.writers.check(self.queue, self.partition_id)
            registry = self.manager.registry
            if not registry.save_checkpoints(
                self.queue, self.name, {self.partition_id: self.checkpoint}, self.registration
            ):
                self.stopping.set()  # replayed (or registered again) meanwhile: the manager starts a new worker
                registry.changed()
            self.saved, self._last_save, self.unsaved = self.checkpoint, now, 0
        except SubscriberNotFound:
            self.stopping.set()  # deleted meanwhile
        except HQueueError:
            logger.warning("%s: saving the checkpoint failed; will retry", self.name, exc_info=True)

    # -- one step -------------------------------------------------------------------------

    def step(self, loop: Sender) -> float:
        """Scan, send (MessageSender) or save; AGAIN, IDLE, FINISHED or a backoff in seconds."""
        if self.stopping.is_set():
            self._save(force=True)
            return FINISHED
        if not self.buffer and self.unsaved >= self.manager.checkpoint_messages:
            self._save()  # the count is reached, and the last save failed: push nothing more until one works
            if self.unsaved:
                backoff, self.backoff = self.backoff, min(self.backoff * 2, 5.0)
                return backoff
        try:
            if not self.buffer:
                reached = self._fill()
                if reached is None:
                    self._save()
                    return IDLE
                self.reached = reached
                if not self.buffer:
                    self._move(reached, 0)  # only rows of other topics: skip them for good
                    return AGAIN
            sent = loop.send(self)
            if sent:
                self._passed()
                self._save()
                return AGAIN
            if sent is False and self._refused():  # None: the subscriber was not reached; that never counts
                return AGAIN
        except Exception:  # one bad turn never kills delivery
            logger.exception("%s partition %d: delivery failed; retrying", self.name, self.partition_id)
        backoff, self.backoff = self.backoff, min(self.backoff * 2, 5.0)
        return backoff

    def _passed(self) -> None:
        """The buffer is done with (delivered, or dead-lettered): the checkpoint moves past it."""
        self._move(self.reached, len(self.buffer))
        self.unsaved += len(self.buffer)
        self.buffer, self.backoff, self.failures = Batch(), 0.01, 0

    def _move(self, checkpoint: MessageID, finished: int) -> None:
        self.checkpoint, self.finished = checkpoint, self.finished + finished
        self.progress = (checkpoint.to_bytes(), self.finished)

    # -- dead letters ----------------------------------------------------------------------

    def _refused(self) -> bool:
        """Count a push the subscriber refused; past ``dead_letter_after`` refusals,
        isolate the poison message (one message at a time) and dead-letter it.
        True: go on now."""
        self.failures += 1
        limit = self.registration.dead_letter_after
        if limit is None or self.failures < limit:
            return False
        self.failures = 0
        if len(self.buffer) > 1:  # which one is it? retry them one by one up to the batch's end
            self.careful_until = self.reached
            self.buffer = self.buffer.head()
            self.reached = successor(self.buffer.last_id())
            return True
        if not self._dead_letter(self.buffer.messages()[0]):
            return False
        self._passed()
        self._save(force=True)
        return True

    def _burial(self, message: Message) -> bytes | None:
        """The lane of ``message``'s dead letter's idempotent put (requests.py), named by the
        registration (``made``, ``epoch``), the partition and the message: a server killed
        between the dead letter and its checkpoint's save pushes the message again after its
        restart and, refused again, buries it again; that put is answered with the first one's
        ID. A replay (a new epoch), or the subscriber registered again, gives a new one."""
        registration = self.registration
        if not registration.made or message.id is None:  # (registered before hqueue kept it: at least once)
            return None
        named = f"{self.queue}\0{self.name}\0{registration.made}\0{registration.epoch}\0{self.partition_id}"
        return hashlib.blake2b(f"{named}\0{message.id}".encode(), digest_size=LANE_LENGTH).digest()

    def _dead_letter(self, message: Message) -> bool:
        """Put the message on ``<queue>.dlq``, in a partition this server writes; False: not yet
        (no partition of it here yet, or it cannot take the message now: disabled, its name
        illegal, the store failing; the message stays first, and is tried again)."""
        try:
            placed = dead_letter(
                self.manager.engine,
                self.manager.coordinator,
                self.queue,
                self.partition_id,
                message,
                by=f"subscriber {self.name}",
                attempts=self.registration.dead_letter_after or 0,
                lane=self._burial(message),
            )
        except HQueueError as e:
            logger.warning("%s: message %s of %s stays: %s", self.name, message.id, self.queue, e)
            return False
        if placed is None:
            return False
        self.manager.metrics.dead_lettered.labels(self.queue, self.name).inc()
        logger.warning(
            "%s: message %s of %s partition %d failed %d deliveries; moved to %s partition %d as %s",
            self.name, message.id, self.queue, self.partition_id,
            self.registration.dead_letter_after, dead_letter_queue(self.queue), *placed,
        )  # fmt: skip
        return True
