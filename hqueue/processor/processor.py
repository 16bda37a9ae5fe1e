"""The Processor (see the package's docstring)."""

from __future__ import annotations

import itertools
import logging
import math
import queue as queue_module
import threading
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..consumer import Delivery
from ..deadletters import dead_letter_queue
from ..errors import InvalidArgument, NoPartitionOwner, NotPartitionOwner, ServerUnavailable
from ..groups.limits import ASKED_LEASE_LIMIT, DEFAULT_LEASE, MAX_RECEIVE, MAX_RETRIES
from ..message import Message
from .commits import CommitTracker
from .worker import Worker

if TYPE_CHECKING:
    from ..consumer import Consumer
    from ..queue import HQueue

logger = logging.getLogger("hqueue.processor")


def _seconds(value: object) -> bool:
    """Whether ``value`` is a number of seconds (a finite int or float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: Worker threads one Processor runs at most (each is a thread: thousands of them, each
#: polling its inbox, kept the constructor from returning for minutes).
MAX_WORKERS = 1024
#: Tries to dead-letter a message, a second apart, while the dead-letter queue's partitions find their server.
DEAD_LETTER_TRIES = 10
#: Seconds between two renewals of the leases in hand, at most (a third of the lease asked
#: for when that is less): a server grants no more than its --max-lease (60 s by default),
#: and renewing on the lease asked for let a longer one run out under a handler.
RENEW_EVERY = 1.0
#: Seconds before an ack that failed is tried again, at most (its commit interval if shorter).
RETRY_COMMIT = 1.0
#: Seconds since the last renewal that went through past which no handler starts before the
#: next one does (two renewal periods if less: a lease under 3 s): a process paused (SIGSTOP,
#: a long GC) past its lease lost its leases, and what it held runs elsewhere now; that
#: renewal says which (Processor.renew).
STALE_AFTER = 2.0
#: The shortest ``timeout`` and ``commit_interval``: less kept a thread turning without a
#: pause, taking a core (a helper's pass: a commit interval of 1 ns).
MIN_SECONDS = 0.001


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
        lease: The group lease of messages in hand (default 30 s; the server
            gives at most its ``--max-lease``, 60 s by default), renewed every
            third of it while the process holds them, so a message may wait
            behind slow ones or be handled for longer than the lease. A
            member holds at most the server's ``--max-member-in-flight``
            (1,000) messages: behind a slow message, the reader waits. If the
            process dies its leases end at once (its connections close, or
            its heartbeats stop for the server's ``--member-timeout``).
        commit_interval: Seconds between acks of committable messages, at
            most: once ``queue_size`` messages have become committable, or
            any has while the reader gets fewer than it asks for (a member
            holds at most the server's ``--max-member-in-flight``, 1,000 by
            default, until they are acked: acks on the interval alone held a
            processor to that many per interval), the next ack goes at once.
            Leases are renewed every second whatever the interval.
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
        lease: float = DEFAULT_LEASE,
        commit_interval: float = 0.2,
        start: str = "earliest",
    ) -> None:
        if not callable(handler):
            raise TypeError("'handler' must be callable")
        if key is not None and not callable(key):
            raise TypeError("'key' must be callable (a message's key: bytes or str), or None for the topic")
        if not callable(getattr(queue, "consumer", None)):
            raise TypeError(f"'queue' must be an HQueue, not {type(queue).__name__}")
        for name, value, low, high in (
            ("workers", workers, 1, MAX_WORKERS),
            ("queue_size", queue_size, 1, MAX_RECEIVE),  # (what one receive may ask for)
            ("max_retries", max_retries, 0, MAX_RETRIES),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidArgument(f"{name!r} must be an int in {low}..{high}, got {value!r}")
        if timeout is not None and not (_seconds(timeout) and timeout >= MIN_SECONDS):
            raise InvalidArgument(f"'timeout' must be seconds >= {MIN_SECONDS} or None, got {timeout!r}")
        for name, seconds in (("delay", delay), ("retry_delay", retry_delay)):
            if not (_seconds(seconds) and 0 <= seconds <= ASKED_LEASE_LIMIT):
                raise InvalidArgument(f"{name!r} must be seconds in [0, {ASKED_LEASE_LIMIT}], got {seconds!r}")
        if not (_seconds(commit_interval) and MIN_SECONDS <= commit_interval <= ASKED_LEASE_LIMIT):
            raise InvalidArgument(
                f"'commit_interval' must be seconds in [{MIN_SECONDS}, {ASKED_LEASE_LIMIT}], got {commit_interval!r}"
            )
        self.queue, self.handler = queue, handler
        self._key = key
        self.queue_size, self.max_retries, self.retry_delay = queue_size, max_retries, retry_delay
        self.timeout, self.delay, self.lease, self.commit_interval = timeout, delay, lease, commit_interval
        # The group keeps each key in order across processes: by topic, the default key; by
        # partition for a key the server cannot read (a key's messages share a partition).
        affinity = "topic" if key is None else "partition"
        self.consumer: Consumer = queue.consumer(group, start=start, lease=lease, key_affinity=affinity)
        self.trackers: dict[int, CommitTracker] = {}
        self.counter = itertools.count()
        self.stopping = threading.Event()
        self._stop_reading = threading.Event()
        #: stop() was called; its stop is through.
        self._stop_asked, self._stopped = False, threading.Event()
        #: Set by stop() past its timeout: workers start no handler from then on.
        self.abandoned = threading.Event()
        #: Deliveries in workers' hands whose leases are gone, by identity (renew).
        self._lost: dict[int, Delivery] = {}
        #: When a renewal last went through (monotonic), told to workers waiting for one.
        self._renewed_at = time.monotonic()
        self._renewal = threading.Condition()
        #: Partitions' drops (:meth:`renew`): how many so far, and the last one of each
        #: partition. What a receive brings of a partition dropped since it began goes back.
        self._drops = 0
        self._dropped: dict[int, int] = {}
        #: Deliveries whose handler runs (by identity): a drop keeps them in hand (given back,
        #: another member had one while its handler ran here, and later ones of its key).
        self._running: dict[int, Delivery] = {}
        #: Seconds renewals may go unrenewed before handlers wait for the next (within the lease).
        self._stale_after = min(STALE_AFTER, 2 * self._renew_every)
        #: Messages the key function failed on whose dead-letter write failed, and why they go.
        self._unkeyed: list[tuple[Delivery, str]] = []
        self.completed = 0
        self.dead_lettered = 0
        #: Committable since the commit loop's last turn; ``queue_size`` of them start the next at once.
        self._committable = 0
        #: Whether the reader's last receive came back short (the member at its cap, or the
        #: queue drained): then any message that becomes committable starts a turn at once.
        self._short = False
        self._commit_due = threading.Event()
        self._lock = threading.Lock()
        self._workers = [Worker(self, i) for i in range(workers)]
        self._threads = [
            threading.Thread(target=self._read, name="hqueue-processor-reader", daemon=True),
            threading.Thread(target=self._commit_loop, name="hqueue-processor-commits", daemon=True),
        ]
        if timeout is not None:
            self._threads.append(threading.Thread(target=self._watch, name="hqueue-processor-timeouts", daemon=True))
        for thread in self._threads:
            thread.start()

    @property
    def _renew_every(self) -> float:
        """Seconds between renewals (a server may grant less than was asked: --max-lease)."""
        return min(self.lease / 3, RENEW_EVERY)

    def key(self, message: Message) -> bytes:
        """``message``'s key, as bytes. Raises what the key function raises, or TypeError
        when it returns something else than bytes or str."""
        if self._key is None:
            return message.topic
        key = self._key(message)
        if isinstance(key, str):
            return key.encode()
        if isinstance(key, (bytes, bytearray, memoryview)):
            return bytes(key)
        raise TypeError(f"the key function returned {type(key).__name__}, not bytes or str")

    # -- the reader -----------------------------------------------------------------------

    def _read(self) -> None:
        while not self._stop_reading.is_set():
            self._retry_unkeyed()
            # Every message of the batch is in hand before any goes to a worker: a renewal that
            # finds their leases gone drops them all. Tracked one at a time as each went, the
            # rest of a batch the reader waited to hand over started after the renewal had
            # dropped the others, while another process had their keys (an attacker's pass).
            with self._lock:
                drops = self._drops
            try:
                deliveries = self.consumer.receive(self.queue_size, wait=0.5)
            except Exception:
                logger.exception("processor: receive failed; retrying")
                time.sleep(1.0)
                continue
            batch = self._take_in_hand(deliveries, drops)
            with self._lock:
                self._short = len(deliveries) < self.queue_size
                if self._short and self._committable:
                    self._commit_due.set()
            for delivery in batch:
                if self.lost(delivery):  # its lease went while the reader waited: another process has it
                    continue
                try:
                    key = self.key(delivery.message)
                except BaseException as e:  # (it stopped the reader: nothing more was handled, of any key;
                    # SystemExit or KeyboardInterrupt too, as a handler's: a failure of this message)
                    logger.error("processor: the key function failed on message %s", delivery.id, exc_info=True)
                    self._dead_letter_unkeyed(delivery, f"its key function failed ({type(e).__name__}: {e})")
                    continue
                worker = self._workers[zlib.crc32(key) % len(self._workers)]
                while not self.stopping.is_set():
                    try:
                        worker.inbox.put((delivery, key), timeout=0.1)  # a full queue: the reader waits
                        break
                    except queue_module.Full:
                        continue

    def _take_in_hand(self, deliveries: list[Delivery], drops: int) -> list[Delivery]:
        """Track what a receive brought (not what is in hand already: a redelivery), all at
        once; what it brought of a partition dropped since it began (``drops``: the count
        then) goes back to the group, to come again in order after what the drop gave back.
        (A renewal waited for the receive instead: a second, for each drop.)"""
        batch, late = [], []
        with self._lock:
            for delivery in deliveries:
                tracker = self._tracker_held(delivery.partition_id)
                if self._dropped.get(delivery.partition_id, -1) > drops:
                    if not tracker.holds(delivery.id):  # (one whose handler ran through the drop: kept)
                        late.append(delivery)
                elif tracker.received(delivery):
                    batch.append(delivery)
        if late:
            self._give_back(late)
        return batch

    def _retry_unkeyed(self) -> None:
        """Dead-letter again the messages without a key whose dead-letter write failed."""
        waiting, self._unkeyed = self._unkeyed, []
        for delivery, why in waiting:
            self._dead_letter_unkeyed(delivery, why)

    def _dead_letter_unkeyed(self, delivery: Delivery, why: str) -> None:
        """A message without a key cannot be handled in its key's order: it goes to the
        dead-letter queue at once (if that cannot take it now, again at the reader's next turn)."""
        try:
            self.dead_letter(delivery, why)
        except Exception:
            logger.exception("processor: message %s could not be dead-lettered; trying again", delivery.id)
            self._unkeyed.append((delivery, why))

    def _tracker(self, partition_id: int) -> CommitTracker:
        with self._lock:
            return self._tracker_held(partition_id)

    def _tracker_held(self, partition_id: int) -> CommitTracker:
        """:meth:`_tracker`, under ``self._lock``."""
        tracker = self.trackers.get(partition_id)
        if tracker is None:
            tracker = self.trackers[partition_id] = CommitTracker()
        return tracker

    # -- completions and commits ----------------------------------------------------------

    def complete(self, delivery: Delivery, *, finished: bool = False) -> None:
        """``delivery`` is done (``finished``: the group finished it already, dead-lettered)."""
        with self._lock:
            self._lost.pop(id(delivery), None)  # (one in a handler when its lease went: not acked)
        ready = self._tracker(delivery.partition_id).completed(delivery.id, finished=finished)
        with self._lock:
            self.completed += 1
            self._committable += ready
            if self._committable >= self.queue_size or (ready and (self._short or self._stop_reading.is_set())):
                self._commit_due.set()  # (stopping: each as it can go; stop() waits for them)

    def dead_letter(self, delivery: Delivery, why: str) -> None:
        """Move a failed message to ``<queue>.dlq`` through its group (the partition's
        owner writes it: no admin right needed, and a message whose lease ran
        out meanwhile goes too); then it is complete.

        From before the group finishes it until it is complete here, it is renewed still,
        but a renewal's second look, which tells leases gone, leaves it out (one between the
        two dropped every message of the partition in hand here as though their leases had
        gone: an attacker's pass saw a Processor alone drop 35-40 at once, about once in
        250-1000 dead letters, and handle them after later messages of their keys)."""
        tracker = self._tracker(delivery.partition_id)
        tracker.finishing(delivery.id)
        try:
            for attempt in range(DEAD_LETTER_TRIES):
                try:
                    self.consumer.dead_letter(delivery)  # 0: finished already (dead-lettered or acked)
                    break
                except (NotPartitionOwner, NoPartitionOwner, ServerUnavailable) as e:
                    if attempt == DEAD_LETTER_TRIES - 1:
                        raise
                    logger.info("processor: dead-lettering %s must wait: %s", delivery.id, e)
                    time.sleep(1.0)
        except BaseException:
            tracker.finishing(delivery.id, False)
            raise
        dlq = dead_letter_queue(self.queue.name)
        with self._lock:
            self.dead_lettered += 1
        logger.warning(
            "processor: message %s of %s partition %d %s; moved to %s",
            delivery.id, self.queue.name, delivery.partition_id, why, dlq,
        )  # fmt: skip
        self.complete(delivery, finished=True)

    def commit(self) -> int:
        """Ack every message below the first incomplete one of its partition; return how many.
        An ack that fails keeps them in hand, to be acked (and renewed) next time: they were
        dropped, and their leases ran out, and they were handled again after later ones."""
        with self._lock:
            trackers = list(self.trackers.values())
        taken = [(tracker, tracker.committable()) for tracker in trackers]
        done = [delivery for _, deliveries in taken for delivery in deliveries]
        if done:
            try:
                self.consumer.ack(done)
            except BaseException:
                for tracker, deliveries in taken:
                    tracker.restore(deliveries)
                raise
        return len(done)

    def renew(self) -> int:
        """Renew the leases of every message in hand (waiting behind others, or being
        handled): they stay with this process while it lives. Returns how many.

        Fewer renewed than held means some leases are gone (this process was paused past
        the lease, and the group has them back, or another process has them now): each
        partition is asked again, and a partition short of its count has its messages not
        yet completed dropped here, so that none of them starts in this process beside the
        one that has it now; those whose leases it still holds go back to the group with
        them, so that the partition comes again in order, whoever has it. (Kept, unhandled,
        until their leases ran out, they came back after later messages of their keys that
        this process had received meanwhile, and were handled after them: 2 to 7 keys of 20
        out of order in a process paused 3 s, four times, past a 2 s lease.)"""
        asked = time.monotonic()  # (a pause after the server answered is not counted as fresh)
        with self._lock:
            trackers = list(self.trackers.values())
        held = [delivery for tracker in trackers for delivery in tracker.held()]
        renewed = self.consumer.extend(held) if held else 0
        if renewed < len(held):
            for tracker in trackers:
                mine = tracker.firm()  # (those being dead-lettered were renewed above, with the rest)
                if mine and self.consumer.extend(mine) < len(mine):
                    self._drop(tracker, mine[0].partition_id)
        with self._renewal:
            self._renewed_at = max(self._renewed_at, asked)
            self._renewal.notify_all()
        return renewed

    def _drop(self, tracker: CommitTracker, partition_id: int) -> None:
        """Drop the messages of a partition not yet completed (some of their leases are gone),
        but those whose handler runs, and give back to the group the leases of these this
        member still holds. (A handler under way keeps its lease, and with it its key here:
        given back, another member had the message while the handler ran, and the later ones
        of its key: a helper's pass.)"""
        with self._lock:  # (no handler starts meanwhile, and no receive is taken in: see _take_in_hand)
            self._drops += 1
            self._dropped[partition_id] = self._drops
            running = {d.id for d in self._running.values() if d.partition_id == partition_id}
            gone = tracker.forget_incomplete(keep=running)
            self._lost.update((id(d), d) for d in gone)
        logger.warning(
            "processor: the leases of some of the %d message(s) of partition %d in hand are gone (the "
            "process paused past its lease?): they go back to the group, to come again in order", len(gone),
            partition_id,
        )  # fmt: skip
        self._give_back(gone)

    def _give_back(self, deliveries: list[Delivery]) -> None:
        try:
            self.consumer.give_back(deliveries)
        except Exception:  # (the server out of reach: their leases run out instead)
            partitions = sorted({d.partition_id for d in deliveries})
            logger.exception("processor: giving back the messages of partitions %s failed", partitions)

    def claim(self, delivery: Delivery) -> bool:
        """A worker is about to run ``delivery``'s handler: False if it was dropped for its lease
        (:meth:`lost`), else it is running until :meth:`unclaim`."""
        with self._lock:
            if self._lost.pop(id(delivery), None) is not None:
                return False
            self._running[id(delivery)] = delivery
            return True

    def unclaim(self, delivery: Delivery) -> None:
        with self._lock:
            self._running.pop(id(delivery), None)

    def renewed_lately(self) -> bool:
        """Whether a handler may start now: a renewal went through within STALE_AFTER, or,
        if not (paused, or the server out of reach), once one does (what it found gone is
        then :meth:`lost`). False if the processor stops meanwhile."""
        with self._renewal:
            while time.monotonic() - self._renewed_at > self._stale_after:
                if self.stopping.is_set() or self.abandoned.is_set():
                    return False
                self._renewal.wait(0.1)
        return True

    def lost(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` was dropped for its lease (:meth:`renew`): not to be handled."""
        with self._lock:
            return self._lost.pop(id(delivery), None) is not None

    def _commit_loop(self) -> None:
        """Ack every ``commit_interval``, or sooner when a turn is due (see :meth:`complete`);
        renew the leases in hand every ``every`` seconds, whatever the interval."""
        renewed = committed = time.monotonic()
        every = self._renew_every
        while not self.stopping.is_set():
            now = time.monotonic()
            due = self._commit_due.wait(max(0.0, min(committed + self.commit_interval, renewed + every) - now))
            if self.stopping.is_set():
                break
            now = time.monotonic()
            if due or now - committed >= self.commit_interval:
                with self._lock:
                    self._committable = 0
                    self._commit_due.clear()
                committed = now
                try:
                    self.commit()
                except Exception:  # (what it took is back in hand: tried again within a second)
                    logger.exception("processor: commit failed; retrying")
                    committed = now - self.commit_interval + min(self.commit_interval, RETRY_COMMIT)
            if now - renewed >= every:
                renewed = now
                try:
                    self.renew()
                except Exception:
                    logger.exception("processor: lease renewal failed; retrying")

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
        it out again. Called from a handler (or the key function), it returns at once and
        the stop goes on in a thread of its own, once that handler is through (it cannot
        wait for its own thread). A second call waits for the first one's stop.
        """
        with self._lock:
            first, self._stop_asked = not self._stop_asked, True
        if threading.current_thread() in self._own_threads():
            if first:
                threading.Thread(  # (no daemon, unlike the worker it starts from: the program's exit
                    # waits for its commit and leave, within the stop's timeout)
                    target=self._stop,
                    args=(timeout,),
                    name="hqueue-processor-stop",
                    daemon=False,
                ).start()
            return
        if first:
            self._stop(timeout)
        else:
            self._stopped.wait(timeout)

    def _own_threads(self) -> list[threading.Thread]:
        return [*self._threads, *(w.thread for w in self._workers)]

    def _stop(self, timeout: float) -> None:
        try:
            self._stopping(timeout)
        finally:
            self._stopped.set()

    def _stopping(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._stop_reading.set()
        self._threads[0].join(timeout=timeout)
        self._retry_unkeyed()  # (no reader tries them again now: once more, then those still refused
        for delivery, _ in self._unkeyed:  # go back with the leave; stop waited its whole timeout for them)
            self._tracker(delivery.partition_id).forget(delivery.id)
        self._commit_due.set()  # what completed already, now, not at the commit interval
        self.wait_idle(timeout=max(0.0, deadline - time.monotonic()), settle=0.0)
        self.stopping.set()
        self._commit_due.set()  # (the commit loop ends now, not at its interval)
        end = max(deadline, time.monotonic() + 0.1)  # (a moment for each to see the stop, all in one)
        for thread in self._own_threads():
            thread.join(timeout=max(0.0, end - time.monotonic()))  # (0.1 s each overran by 0.1 s a stuck worker)
        # Past the timeout, workers start nothing more: what they hold goes back with the
        # leave below (they went on handling it after stop() had returned, while another
        # process handled the same messages).
        self.abandoned.set()
        try:
            self.commit()
        finally:
            self.consumer.close()

    def __enter__(self) -> Processor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
