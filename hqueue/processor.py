"""The key-ordered processing framework (SPEC X5).

A :class:`Processor` reads a queue as a member of a consumer group and runs
a handler on every message, in parallel across keys and in order within a
key::

    def handle(message):                      # raise to fail it
        charge(message.value)

    with HQueue("orders") as queue:
        with Processor(queue, "billing", handle, key=lambda m: m.value[:8], workers=8) as processor:
            processor.wait_idle()             # or run until processor.stop()

* **Key order.** Each message's key (default: its topic) is hashed onto one
  of ``workers`` worker queues: messages with one key are handled one after
  another, in the order of their partition; different keys run in parallel.
  Put a key's messages with ``queue.put(..., key=k)`` so they share a
  partition.
* **Commits.** Messages complete out of order; the processor acks a
  partition's messages only up to the highest one below which everything
  has completed (:class:`CommitTracker`), so the group's completion cursor
  never passes an unfinished message. After a crash, what was in hand comes
  again: at least once.
* **Backpressure.** Worker queues hold at most ``queue_size`` messages; when
  they are full the reader waits, instead of reading ahead into memory.
* **Failures.** A handler that raises is retried ``max_retries`` times,
  ``retry_delay`` seconds apart (doubling); meanwhile its key is set aside,
  so other keys of the same worker go on, and the key's later messages wait
  behind it, in order. After the last retry the message goes to
  ``<queue>.dlq`` and its key resumes.
* **Timeouts.** A handler running longer than ``timeout`` seconds fails its
  message at once, without a retry (it goes to the dead-letter queue); the
  worker is replaced and the key goes on. The stuck call is abandoned, not
  killed: Python threads cannot be.
* **Delay.** With ``delay=S`` a message is handled no sooner than S seconds
  after it was written.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import queue as queue_module
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .consumer import Delivery
from .deadletters import dead_letter_queue
from .errors import InvalidArgument, NoPartitionOwner, NotPartitionOwner, ServerUnavailable
from .message import Message, MessageID

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import HQueue

logger = logging.getLogger(__name__)

__all__ = ["CommitTracker", "Processor"]

#: Tries to dead-letter a message, a second apart, while the dead-letter queue's partitions find their server.
DEAD_LETTER_TRIES = 10


class CommitTracker:
    """Which of one partition's messages may be committed, as they complete out of order.

    ``received`` messages enter in ID order; ``completed`` ones leave in any
    order; :meth:`committable` gives those below the lowest message still
    incomplete (the highest contiguous completed run), once each.
    """

    def __init__(self) -> None:
        self._pending: list[MessageID] = []  # received, in ID order
        self._held: dict[MessageID, Delivery] = {}
        self._completed: set[MessageID] = set()
        self._lock = threading.Lock()

    def received(self, delivery: Delivery) -> bool:
        """Track a message; False if it is tracked already (a redelivery of one in hand)."""
        with self._lock:
            if delivery.id in self._held:
                return False
            bisect.insort(self._pending, delivery.id)
            self._held[delivery.id] = delivery
            return True

    def completed(self, message_id: MessageID) -> None:
        with self._lock:
            if message_id in self._held:
                self._completed.add(message_id)

    def committable(self) -> list[Delivery]:
        """The completed messages below the first incomplete one, oldest first; forgotten once returned."""
        with self._lock:
            count = 0
            for message_id in self._pending:
                if message_id not in self._completed:
                    break
                count += 1
            done, self._pending = self._pending[:count], self._pending[count:]
            self._completed.difference_update(done)
            return [self._held.pop(message_id) for message_id in done]

    @property
    def in_hand(self) -> int:
        with self._lock:
            return len(self._pending)


class _Worker:
    """One worker queue and the thread draining it; keys set aside wait in ``parked``."""

    def __init__(self, processor: Processor, index: int) -> None:
        self.processor, self.index = processor, index
        self.inbox: queue_module.Queue[Delivery | None] = queue_module.Queue(processor.queue_size)
        #: key -> messages of a key set aside after a failure, in order, and when to try again.
        self.parked: dict[bytes, deque[Delivery]] = {}
        self.parked_until: list[tuple[float, int, bytes]] = []
        self.failures: dict[MessageID, int] = {}
        self.busy_since: float | None = None
        self.current: Delivery | None = None
        #: Bumped when a stuck handler is abandoned: the old thread's results are ignored.
        self.generation = 1
        self.lock = threading.Lock()  # the handler's end against its timeout
        self._start()

    def _start(self) -> None:
        """Run the worker loop in a new thread, as generation ``self.generation``."""
        self.thread = threading.Thread(
            target=self._run, args=(self.generation,), name=f"hqueue-processor-{self.index}", daemon=True
        )
        self.thread.start()

    def _run(self, generation: int) -> None:
        processor = self.processor
        while generation == self.generation:
            delivery, resumed = self._next()
            if delivery is None:
                if processor.stopping.is_set() and not self.parked and self.inbox.empty():
                    return
                continue
            key = processor.key(delivery.message)
            if key in self.parked and not resumed:  # behind a failed message of its key: keep the order
                self.parked[key].append(delivery)
                continue
            try:
                self._handle(delivery, key, generation)
            except Exception:  # the dead-letter queue could not be written: keep the message, try again
                logger.exception("processor: message %s could not be finished; trying again in 1s", delivery.id)
                self.parked.setdefault(key, deque()).appendleft(delivery)
                heapq.heappush(self.parked_until, (time.monotonic() + 1.0, next(processor.counter), key))

    def _next(self) -> tuple[Delivery | None, bool]:
        """The next delivery, and whether it is a set-aside key's turn again."""
        now = time.monotonic()
        if self.parked_until and self.parked_until[0][0] <= now:
            _, _, key = heapq.heappop(self.parked_until)
            waiting = self.parked.get(key)
            if waiting:
                return self._resume(key, waiting), True
        timeout = min(0.1, self.parked_until[0][0] - now) if self.parked_until else 0.1
        try:
            return self.inbox.get(timeout=max(0.001, timeout)), False
        except queue_module.Empty:
            return None, False

    def _resume(self, key: bytes, waiting: deque[Delivery]) -> Delivery:
        delivery = waiting.popleft()
        if not waiting:
            del self.parked[key]
        else:  # the rest of the key follows once this one is through
            self.parked[key] = waiting
        return delivery

    def _handle(self, delivery: Delivery, key: bytes, generation: int) -> None:
        processor = self.processor
        message = delivery.message
        due = delivery.id.timestamp / 1000 + processor.delay if processor.delay else 0.0
        if due > time.time():
            time.sleep(due - time.time())
        with self.lock:
            self.current, self.busy_since = delivery, time.monotonic()
        error: Exception | None = None
        try:
            processor.handler(message)
        except Exception as e:
            error = e
        with self.lock:
            if generation != self.generation:
                return  # it timed out meanwhile: failed already, and another thread goes on
            self.current, self.busy_since = None, None
        if error is not None:
            self._failed(delivery, key, error)
            return
        self.failures.pop(message.id, None)  # type: ignore[arg-type]
        processor.complete(delivery)
        waiting = self.parked.get(key)
        if waiting is not None and not any(k == key for _, _, k in self.parked_until):
            self.inbox_front(key)

    def inbox_front(self, key: bytes) -> None:
        """A key that was set aside and is through its failed message: go on with it now."""
        heapq.heappush(self.parked_until, (0.0, next(self.processor.counter), key))

    def _failed(self, delivery: Delivery, key: bytes, error: Exception) -> None:
        processor = self.processor
        message_id = delivery.message.id
        assert message_id is not None
        count = self.failures[message_id] = self.failures.get(message_id, 0) + 1
        if count > processor.max_retries:
            logger.warning("processor: message %s failed %d times (%s); dead-lettered", message_id, count, error)
            self.failures.pop(message_id, None)
            processor.dead_letter(delivery, f"failed {count} times: {error!r}")
            if key in self.parked:
                self.inbox_front(key)
            return
        delay = processor.retry_delay * 2 ** (count - 1)
        logger.info("processor: message %s failed (%r); retry %d in %.2fs", message_id, error, count, delay)
        waiting = self.parked.setdefault(key, deque())
        waiting.appendleft(delivery)
        heapq.heappush(self.parked_until, (time.monotonic() + delay, next(processor.counter), key))

    def timed_out(self, delivery: Delivery, started: float) -> None:
        """The handler ran past the timeout: fail its message without a retry, and go on
        in a new thread (the stuck call is abandoned: a thread cannot be killed)."""
        with self.lock:
            if self.current is not delivery or self.busy_since != started:
                return  # it finished meanwhile
            self.generation += 1  # the stuck thread's result is ignored from now on
            self.current, self.busy_since = None, None
        # No worker thread runs now: the set-aside keys are this thread's to touch.
        key = self.processor.key(delivery.message)
        try:
            self.processor.dead_letter(delivery, f"timed out after {self.processor.timeout}s")
        finally:
            if key in self.parked:
                self.inbox_front(key)
            self._start()


class Processor:
    """Key-ordered, parallel processing of a queue (SPEC X5).

    Args:
        queue: The queue to read.
        group: The consumer group the processor reads as (made on first use,
            from the earliest message unless ``start`` says otherwise).
        handler: Called with each :class:`~hqueue.Message`; raise to fail it.
        key: The key of a message (default: its topic).
        workers: Worker queues, each with its thread.
        queue_size: Messages each worker queue holds before the reader waits.
        max_retries: Retries of a failing message before it is dead-lettered.
        retry_delay: Seconds before the first retry (doubling after).
        timeout: Seconds a handler may run before its message fails, without
            a retry (None: no limit).
        delay: Handle each message no sooner than this many seconds after it was written.
        lease: The group lease of messages in hand; make it longer than a
            message may wait in a queue plus its handling (default 600 s).
        commit_interval: Seconds between acks of committable messages.
        start: Where a new group starts (see :meth:`HQueue.consumer`).
    """

    def __init__(
        self,
        queue: HQueue,
        group: str,
        handler: Callable[[Message], Any],
        *,
        key: Callable[[Message], bytes | str] | None = None,
        workers: int = 4,
        queue_size: int = 100,
        max_retries: int = 3,
        retry_delay: float = 1.0,
        timeout: float | None = None,
        delay: float = 0.0,
        lease: float = 600.0,
        commit_interval: float = 0.2,
        start: str = "earliest",
    ) -> None:
        if not callable(handler):
            raise TypeError("'handler' must be callable")
        for name, value, low in (
            ("workers", workers, 1),
            ("queue_size", queue_size, 1),
            ("max_retries", max_retries, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidArgument(f"{name!r} must be an int >= {low}, got {value!r}")
        if timeout is not None and not timeout > 0:
            raise InvalidArgument(f"'timeout' must be seconds > 0 or None, got {timeout!r}")
        if not delay >= 0 or not retry_delay >= 0:
            raise InvalidArgument("'delay' and 'retry_delay' must be seconds >= 0")
        self.queue, self.handler = queue, handler
        self._key = key
        self.queue_size, self.max_retries, self.retry_delay = queue_size, max_retries, retry_delay
        self.timeout, self.delay, self.lease, self.commit_interval = timeout, delay, lease, commit_interval
        self.consumer: Consumer = queue.consumer(group, start=start, lease=lease)
        self.trackers: dict[int, CommitTracker] = {}
        self.counter = itertools.count()
        self.stopping = threading.Event()
        self._stop_reading = threading.Event()
        self.completed = 0
        self.dead_lettered = 0
        self._lock = threading.Lock()
        self._workers = [_Worker(self, i) for i in range(workers)]
        self._threads = [
            threading.Thread(target=self._read, name="hqueue-processor-reader", daemon=True),
            threading.Thread(target=self._commit_loop, name="hqueue-processor-commits", daemon=True),
        ]
        if timeout is not None:
            self._threads.append(threading.Thread(target=self._watch, name="hqueue-processor-timeouts", daemon=True))
        for thread in self._threads:
            thread.start()

    def key(self, message: Message) -> bytes:
        if self._key is None:
            return message.topic
        key = self._key(message)
        return key.encode() if isinstance(key, str) else key

    # -- the reader -----------------------------------------------------------------------

    def _read(self) -> None:
        while not self._stop_reading.is_set():
            try:
                deliveries = self.consumer.receive(self.queue_size, wait=0.5)
            except Exception:
                logger.exception("processor: receive failed; retrying")
                time.sleep(1.0)
                continue
            for delivery in deliveries:
                tracker = self._tracker(delivery.partition_id)
                if not tracker.received(delivery):
                    continue  # in hand already (its lease ran out and it came back)
                worker = self._workers[zlib.crc32(self.key(delivery.message)) % len(self._workers)]
                while not self.stopping.is_set():
                    try:
                        worker.inbox.put(delivery, timeout=0.1)  # a full queue: the reader waits (backpressure)
                        break
                    except queue_module.Full:
                        continue

    def _tracker(self, partition_id: int) -> CommitTracker:
        with self._lock:
            tracker = self.trackers.get(partition_id)
            if tracker is None:
                tracker = self.trackers[partition_id] = CommitTracker()
            return tracker

    # -- completions and commits ----------------------------------------------------------

    def complete(self, delivery: Delivery) -> None:
        self._tracker(delivery.partition_id).completed(delivery.id)
        with self._lock:
            self.completed += 1

    def dead_letter(self, delivery: Delivery, why: str) -> None:
        """Move a failed message to ``<queue>.dlq`` through its group (the partition's
        owner writes it: no admin right needed, and a message whose lease ran
        out meanwhile goes too); then it is complete."""
        for attempt in range(DEAD_LETTER_TRIES):
            try:
                self.consumer.dead_letter(delivery)  # 0: finished already (dead-lettered or acked)
                break
            except (NotPartitionOwner, NoPartitionOwner, ServerUnavailable) as e:
                if attempt == DEAD_LETTER_TRIES - 1:
                    raise
                logger.info("processor: dead-lettering %s must wait: %s", delivery.id, e)
                time.sleep(1.0)
        dlq = dead_letter_queue(self.queue.name)
        with self._lock:
            self.dead_lettered += 1
        logger.warning("processor: message %s dead-lettered to %s: %s", delivery.id, dlq, why)
        self.complete(delivery)

    def commit(self) -> int:
        """Ack every message below the first incomplete one of its partition; return how many."""
        with self._lock:
            trackers = list(self.trackers.values())
        done = [delivery for tracker in trackers for delivery in tracker.committable()]
        if done:
            self.consumer.ack(done)
        return len(done)

    def _commit_loop(self) -> None:
        while not self.stopping.wait(self.commit_interval):
            try:
                self.commit()
            except Exception:
                logger.exception("processor: commit failed; retrying")

    def _watch(self) -> None:
        assert self.timeout is not None
        while not self.stopping.wait(min(0.05, self.timeout / 4)):
            now = time.monotonic()
            for worker in self._workers:
                since, current = worker.busy_since, worker.current
                if since is not None and current is not None and now - since > self.timeout:
                    worker.timed_out(current, since)

    # -- lifetime -------------------------------------------------------------------------

    @property
    def in_hand(self) -> int:
        """Messages received and not yet committed."""
        with self._lock:
            return sum(t.in_hand for t in self.trackers.values())

    def wait_idle(self, timeout: float | None = None, settle: float = 0.5) -> bool:
        """Wait until nothing is in hand and nothing has come for ``settle`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        quiet_since = None
        while deadline is None or time.monotonic() < deadline:
            if self.in_hand == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= settle:
                    return True
            else:
                quiet_since = None
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop reading, let the workers finish what they hold (up to ``timeout``), commit, leave the group.

        What is still in hand after the timeout is not acked: the group hands
        it out again.
        """
        if self.stopping.is_set():
            return
        deadline = time.monotonic() + timeout
        self._stop_reading.set()
        self._threads[0].join(timeout=timeout)
        self.wait_idle(timeout=max(0.0, deadline - time.monotonic()), settle=0.0)
        self.stopping.set()
        for thread in [*self._threads, *(w.thread for w in self._workers)]:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        self.commit()
        self.consumer.close()

    def __enter__(self) -> Processor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
