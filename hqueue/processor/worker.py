"""A Processor's worker thread: handles the keys it is given, one message of a key at a time."""

from __future__ import annotations

import heapq
import logging
import queue as queue_module
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..backoff import doubled
from ..consumer import Delivery
from ..message import MessageID

if TYPE_CHECKING:
    pass

logger = logging.getLogger("hqueue.processor")


class Worker:
    """One worker queue and the thread draining it; keys set aside wait in ``parked``."""

    def __init__(self, processor: Any, index: int) -> None:
        self.processor, self.index = processor, index
        #: Messages and their keys, from the reader.
        self.inbox: queue_module.Queue[tuple[Delivery, bytes]] = queue_module.Queue(processor.queue_size)
        #: key -> messages of a key set aside after a failure, in order, and when to try again.
        self.parked: dict[bytes, deque[Delivery]] = {}
        self.parked_until: list[tuple[float, int, bytes]] = []
        self.failures: dict[MessageID, int] = {}
        #: Messages whose retries are spent and whose dead-letter write failed, with why they go.
        self.unburied: dict[MessageID, str] = {}
        self.busy_since: float | None = None
        self.current: Delivery | None = None
        self.current_key = b""
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
        while generation == self.generation and not processor.abandoned.is_set():
            delivery, key, resumed = self._next()
            if delivery is not None and processor.abandoned.is_set():
                return  # (stopped past its timeout: what is not started goes back to the group)
            if delivery is None:
                if processor.stopping.is_set() and not self.parked and self.inbox.empty():
                    return
                continue
            if key in self.parked and not resumed:  # behind a failed message of its key: keep the order
                self.parked[key].append(delivery)
                continue
            if not self._due(delivery) or not processor.renewed_lately():  # stopping: not started
                return  # (it goes back to the group)
            if not processor.claim(delivery):  # its lease is gone: another process has it
                if resumed and key in self.parked:
                    self.inbox_front(key)  # (the rest of its key, set aside behind it, goes on: each is checked so)
                continue
            try:
                self._handle(delivery, key, generation)
            except Exception:  # the dead-letter queue could not be written: keep the message, try again
                self._not_finished(delivery, key)
            finally:
                processor.unclaim(delivery)

    def _not_finished(self, delivery: Delivery, key: bytes) -> None:
        """Its dead-letter write failed: it waits first among its key's, and the write is tried
        again in a second (:meth:`_handle`, which sees it in :attr:`unburied`)."""
        logger.exception("processor: message %s could not be finished; trying again in 1s", delivery.id)
        self._set_aside(delivery, key, 1.0)

    def _set_aside(self, delivery: Delivery, key: bytes, delay: float) -> None:
        """Put ``delivery`` first among its key's set-aside messages, its turn ``delay`` seconds from now."""
        self.parked.setdefault(key, deque()).appendleft(delivery)
        heapq.heappush(self.parked_until, (time.monotonic() + delay, next(self.processor.counter), key))

    def _next(self) -> tuple[Delivery | None, bytes, bool]:
        """The next delivery, its key, and whether it is a set-aside key's turn again."""
        now = time.monotonic()
        if self.parked_until and self.parked_until[0][0] <= now:
            _, _, key = heapq.heappop(self.parked_until)
            waiting = self.parked.get(key)
            if waiting:
                return self._resume(key, waiting), key, True
        timeout = min(0.1, self.parked_until[0][0] - now) if self.parked_until else 0.1
        try:
            delivery, key = self.inbox.get(timeout=max(0.001, timeout))
        except queue_module.Empty:
            return None, b"", False
        return delivery, key, False

    def _resume(self, key: bytes, waiting: deque[Delivery]) -> Delivery:
        delivery = waiting.popleft()
        if not waiting:
            del self.parked[key]
        else:  # the rest of the key follows once this one is through
            self.parked[key] = waiting
        return delivery

    def _due(self, delivery: Delivery) -> bool:
        """Wait for ``delivery``'s turn under the processor's ``delay`` (before the renewal
        check, which a pause during the wait would have made stale: a review); False if
        the processor stopped past its timeout meanwhile."""
        processor = self.processor
        due = delivery.id.timestamp / 1000 + processor.delay if processor.delay else 0.0
        return not (due > time.time() and processor.abandoned.wait(due - time.time()))

    def _handle(self, delivery: Delivery, key: bytes, generation: int) -> None:
        processor = self.processor
        message = delivery.message
        why = self.unburied.get(message.id)  # type: ignore[arg-type]
        if why is not None:  # its retries are spent and its dead-letter write failed: that again, not the handler
            self._bury(delivery, key, why)
            return
        with self.lock:
            self.current, self.current_key, self.busy_since = delivery, key, time.monotonic()
        error: BaseException | None = None
        try:
            processor.handler(message)
        except BaseException as e:  # (SystemExit, KeyboardInterrupt too: they ended the thread,
            error = e  # and its keys, their leases renewed, stalled for good; a failure, retried)
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

    def _failed(self, delivery: Delivery, key: bytes, error: BaseException) -> None:
        processor = self.processor
        message_id = delivery.message.id
        assert message_id is not None
        count = self.failures[message_id] = self.failures.get(message_id, 0) + 1
        if count > processor.max_retries:
            self.failures.pop(message_id, None)
            self.unburied[message_id] = f"failed {count} times (the last: {error!r})"
            self._bury(delivery, key, self.unburied[message_id])
            return
        delay = doubled(processor.retry_delay, count - 1)
        logger.info("processor: message %s failed (%r); retry %d in %.2fs", message_id, error, count, delay)
        self._set_aside(delivery, key, delay)

    def _bury(self, delivery: Delivery, key: bytes, why: str) -> None:
        """Dead-letter a message whose retries are spent; raises if the write fails (the worker
        loop sets it aside and comes back to the write: the handler ran all its retries
        again each time before)."""
        self.processor.dead_letter(delivery, why)
        self.unburied.pop(delivery.message.id, None)  # type: ignore[arg-type]
        if key in self.parked:
            self.inbox_front(key)

    def timed_out(self, delivery: Delivery, started: float) -> None:
        """The handler ran past the timeout: fail its message without a retry, and go on
        in a new thread (the stuck call is abandoned: a thread cannot be killed)."""
        with self.lock:
            if self.current is not delivery or self.busy_since != started:
                return  # it finished meanwhile
            self.generation += 1  # the stuck thread's result is ignored from now on
            self.current, self.busy_since, key = None, None, self.current_key
        # No worker thread runs now: the set-aside keys are this thread's to touch.
        why = self.unburied[delivery.message.id] = f"timed out after {self.processor.timeout}s"  # type: ignore[index]
        try:
            self._bury(delivery, key, why)
        except Exception:  # as a message whose retries are spent (the watching thread died of it)
            self._not_finished(delivery, key)
        finally:
            self._start()
