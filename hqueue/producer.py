"""Producer: many threads' single sends packed into few put calls (Kafka's model).

``queue.producer()`` returns a :class:`Producer`. Each :meth:`Producer.send`
adds one message to its partition's open batch and returns a
:class:`concurrent.futures.Future` of its :class:`~hqueue.MessageID` at once.
A batch goes out as one put call (one atomic write, one fsync for a
SYNC_WAL queue) when it is full (``max_batch`` messages or ``max_bytes``),
``linger_ms`` after its first message, or on :meth:`Producer.flush`; while a
partition's batch is under way the next one fills, so a busy producer sends
big batches whatever ``linger_ms`` is. A batch smaller than its partition's
previous one waits up to :data:`GATHER_SECONDS` more for company: threads
that each wait for their Future come back together, and travel together.

State of a batch::

    open (filling) --full / linger / flush--> ready --sender--> in flight --> done
                                                                  (its futures resolved)

Order: one batch per partition is in flight at a time, so the IDs of one
partition's sends follow the order in which they were sent (from one thread;
threads racing get some order). Errors: a failed put fails exactly its
batch's futures, with the put's error (``OutcomeUnknown`` when the put was
sent to a server and no answer came by its deadline: it may be stored).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from . import forks
from .checks import choose_partition, message_columns
from .config import INFO_CACHE_SECONDS, MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, QueueInfo
from .errors import (
    DeadlineExceeded,
    HQueueError,
    InvalidArgument,
    InvalidMessage,
    InvalidPartition,
    MessageTooLarge,
    ProducerBufferFull,
    ProducerClosed,
    QueueNotFound,
)
from .message import Message, MessageID

if TYPE_CHECKING:
    from .api import EngineAPI

__all__ = ["Producer", "SendFuture"]

logger = logging.getLogger(__name__)

#: Defaults, after Kafka's linger.ms, batch.size (here messages and bytes), buffer.memory, max.block.ms.
#: No linger: batches form while a partition's put is under way (threads that wait on
#: their Future would each wait out a linger).
DEFAULT_LINGER_MS = 0.0
DEFAULT_MAX_BATCH = 1000
DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_BUFFER_BYTES = 32 * 1024 * 1024
DEFAULT_BLOCK_TIMEOUT = 60.0
#: The longest ``block_timeout``: a year.
MAX_BLOCK_TIMEOUT = 365 * 86400.0
#: How long a batch smaller than its partition's previous one may wait for company
#: beyond its linger: threads that each wait for their Future come back together.
GATHER_SECONDS = 0.001
#: Puts to different partitions under way at once.
MAX_IN_FLIGHT_PARTITIONS = 8
#: What keeping one message costs the producer's buffer besides its topic and value (its
#: Message and Future: about 1.8 KB measured with tracemalloc). Counting topics and values
#: alone, empty messages filled 546 MB of memory under a 300 KB buffer_bytes.
SEND_OVERHEAD = 2048


#: A put refused with one of these may mean the queue was made again (dropped, then created
#: with fewer partitions or a smaller message size; or any new one: a put says the definition
#: it was routed by, config.check_routed) under its producer: the producer reads its
#: definition again, so that ``send`` checks, and routes, the next messages by the new one.
REDEFINED = (InvalidPartition, MessageTooLarge, InvalidMessage, QueueNotFound)


class SendFuture(Future[MessageID]):
    """The Future :meth:`Producer.send` returns: its result is the message's ID, and
    ``partition_id`` is the partition it goes to (an ID is unique within its partition)."""

    def __init__(self, partition_id: int) -> None:
        super().__init__()
        self.partition_id = partition_id


#: Where a send goes: its partition, and the ``created`` of the definition that chose it.
Routed = tuple[int, str | None]


class Batch:
    """One put's worth of messages, with a future each (whatever kind its producer uses)."""

    __slots__ = ("messages", "futures", "size", "held", "created", "deadline", "forced", "done", "routed_by")

    def __init__(self, created: float, linger: float, routed_by: str | None = None) -> None:
        #: The ``created`` of the queue definition its messages were routed by (its put says so).
        self.routed_by = routed_by
        self.messages: list[Message] = []
        self.futures: list[Any] = []
        self.size = 0  # bytes of topics and values (max_bytes)
        self.held = 0  # of the buffer: those and SEND_OVERHEAD a message
        self.created, self.deadline = created, created + linger  # it goes by then, full or not
        self.forced = False  # flushed: it goes now
        self.done = threading.Event()


class Batches:
    """The plan of one producer's batches, shared by the threaded :class:`Producer` and the
    asyncio one (hqueue/aio/producer.py): where each send goes, when each batch is due, and
    how much of the buffer they hold. Not locked: its producer serializes every call.

    Args:
        info: The queue's definition (None until the producer has it: set before the first send).
        linger_ms, max_batch, max_bytes, buffer_bytes, block_timeout: As :class:`Producer`'s
            (checked here).
    """

    def __init__(
        self,
        info: QueueInfo | None,
        linger_ms: float,
        max_batch: int,
        max_bytes: int,
        buffer_bytes: int,
        block_timeout: float,
    ) -> None:
        _check_number("linger_ms", linger_ms, 0, 3_600_000)
        _check_number("max_batch", max_batch, 1, MAX_BATCH_MESSAGES, integer=True)
        _check_number("max_bytes", max_bytes, 1, MAX_BATCH_BYTES, integer=True)
        _check_number("buffer_bytes", buffer_bytes, SEND_OVERHEAD + 1, float("inf"), integer=True)
        _check_number("block_timeout", block_timeout, 0, MAX_BLOCK_TIMEOUT)  # (a thread waits at most TIMEOUT_MAX)
        self.info = info
        self.read_at = time.monotonic()  # when ``info`` was read
        self.linger = linger_ms / 1000
        self.max_batch, self.max_bytes = max_batch, max_bytes
        self.buffer_bytes, self.block_timeout = buffer_bytes, block_timeout
        self.open: dict[int, deque[Batch]] = {}  # partition -> batches, oldest first
        self.in_flight: dict[int, Batch] = {}
        self.buffered = 0  # the buffer's bytes held (cost of every message not yet stored)
        self.closed = False
        self._sticky: int | None = None  # where sends without a key or partition go (Kafka's sticky partitioner)
        self._last_size: dict[int, int] = {}  # messages in each partition's latest batch

    def check(self, message: Message, key: bytes | str | None, partition: int | None) -> tuple[int, Routed | None]:
        """(what ``message`` costs of the buffer, the partition ``key`` or ``partition`` names
        and the ``created`` of the definition that named it): refused as a put would refuse
        it, before anything is queued."""
        if type(message) is not Message:
            raise TypeError(f"'message' must be a Message, not {type(message).__name__}")
        assert self.info is not None, "the producer's queue is not known yet"
        message_columns(self.info, [message])
        cost = len(message.topic) + len(message.value) + SEND_OVERHEAD
        if cost > self.buffer_bytes:
            raise InvalidArgument(
                f"a message of {cost - SEND_OVERHEAD} bytes (and {SEND_OVERHEAD} for its keeping) is over the "
                f"producer's buffer_bytes={self.buffer_bytes}"
            )
        if key is not None and partition is not None:
            raise TypeError("give 'partition' or 'key', not both")
        # The same choice as HQueue.put (priority tier 0's band on a queue with tiers).
        if key is None and partition is None:
            return cost, None
        return cost, (choose_partition(self.info, partition, key), self.info.created)

    def has_room(self, cost: int) -> bool:
        return self.buffered + cost <= self.buffer_bytes

    def add(
        self, message: Message, cost: int, chosen: Routed | None, make_future: Callable[[int], Any]
    ) -> tuple[Any, bool]:
        """Queue ``message`` (room for it taken) in a batch of its partition routed by the same
        definition (the one :meth:`check` chose it by: the definition may have been read again
        since, as the send waited for room): (its future, from ``make_future(partition)``;
        whether the sender is to look again: a batch began, or one filled)."""
        self.buffered += cost
        if chosen is None:
            assert self.info is not None
            pid, routed_by = self._sticky_partition(cost), self.info.created
        else:
            pid, routed_by = chosen
        future = make_future(pid)
        size = cost - SEND_OVERHEAD
        batches = self.open.setdefault(pid, deque())
        began = not batches or not self._fits(batches[-1], size) or batches[-1].routed_by != routed_by
        if began:
            batches.append(Batch(time.monotonic(), self.linger, routed_by))
        batch = batches[-1]
        batch.messages.append(message)
        batch.futures.append(future)
        batch.size += size
        batch.held += cost
        count = len(batch.messages)
        full = count >= self.max_batch or batch.size >= self.max_bytes or count == self._last_size.get(pid)
        return future, began or full

    def _fits(self, batch: Batch, size: int) -> bool:
        return len(batch.messages) < self.max_batch and batch.size + size <= self.max_bytes

    def _sticky_partition(self, cost: int) -> int:
        """Where a send without key or partition goes: the partition of the last such send,
        until its open batch is full; then another, with no put under way if there is one."""
        sticky = self._sticky
        if sticky is not None:
            batches = self.open.get(sticky)
            if not batches or self._fits(batches[-1], cost - SEND_OVERHEAD):
                return sticky
        assert self.info is not None
        chosen = choose_partition(self.info, None, None)
        for _ in range(3):
            if chosen not in self.in_flight and chosen not in self.open:
                break
            chosen = choose_partition(self.info, None, None)
        self._sticky = chosen
        return chosen

    def renew(self, info: QueueInfo) -> None:
        """The queue's definition as read again (REDEFINED, or :meth:`due`): the next sends
        are checked, and routed, by it."""
        if info != self.info:
            self.info, self._sticky = info, None

    def due(self) -> bool:
        """Whether the producer's sender is to read the definition again (its client's cached
        copy), as a handle's puts do: once every INFO_CACHE_SECONDS (True once: the caller
        reads it). Each put says the definition its batch was routed by, and one made by a
        queue deleted and made again since is refused (config.check_routed): reading it
        again routes the next sends right to begin with."""
        now = time.monotonic()
        if now - self.read_at < INFO_CACHE_SECONDS:
            return False
        self.read_at = now
        return True

    def held_beside(self, pid: int) -> int:
        """Bytes of the buffer that batches of partitions other than ``pid`` hold: room that
        comes back without ``pid``'s next put."""
        held = sum(b.held for other, queued in self.open.items() if other != pid for b in queued)
        return held + sum(b.held for other, b in self.in_flight.items() if other != pid)

    def _every(self) -> list[Batch]:
        return [b for queued in self.open.values() for b in queued] + list(self.in_flight.values())

    def unsent(self) -> int:
        """Messages sent and not yet stored (nor failed): lost if the producer goes now."""
        return sum(len(batch.messages) for batch in self._every())

    def pending(self) -> list[Batch]:
        """Every batch not done yet, each marked to go now (a flush)."""
        batches = self._every()
        now = time.monotonic()
        for batch in batches:
            batch.deadline, batch.forced = min(batch.deadline, now), True
        return batches

    def take_ready(self) -> list[tuple[int, Batch]]:
        """Batches due (full, lingered, flushed, or closing) whose partition has none under
        way, now under way."""
        now, ready = time.monotonic(), []
        for pid, batches in list(self.open.items()):
            if pid in self.in_flight:
                continue
            batch = batches[0]
            full = len(batch.messages) >= self.max_batch or batch.size >= self.max_bytes or len(batches) > 1
            if full or batch.forced or self.closed or self._due(pid, batch) <= now:
                batches.popleft()
                if not batches:
                    del self.open[pid]
                self.in_flight[pid] = batch
                self._last_size[pid] = len(batch.messages)
                ready.append((pid, batch))
        return ready

    def _due(self, pid: int, batch: Batch) -> float:
        """When a batch goes unless it fills: its linger's end, or, while it is smaller than
        its partition's previous batch, up to GATHER_SECONDS after its first message."""
        if len(batch.messages) >= self._last_size.get(pid, 0):
            return batch.deadline
        return max(batch.deadline, batch.created + GATHER_SECONDS)

    def next_wake(self) -> float | None:
        """Seconds until the next batch falls due (None: none waits)."""
        waiting = [self._due(pid, b[0]) for pid, b in self.open.items() if pid not in self.in_flight]
        return max(0.0, min(waiting) - time.monotonic()) if waiting else None

    def finished(self, pid: int, batch: Batch) -> None:
        """``batch``'s put is over: its partition may send the next; its room is free."""
        if self.in_flight.get(pid) is batch:  # (a close that gave up on it dropped it already)
            del self.in_flight[pid]
        self.free_room(batch)

    def free_room(self, batch: Batch) -> None:
        """``batch``'s room in the buffer is free (its put is over; freed once)."""
        self.buffered -= batch.held
        batch.held = 0

    def drop(self) -> list[Batch]:
        """Every batch not done yet, taken out and its room freed (a close that gave up on
        them: their sends are to fail)."""
        batches = self._every()
        self.open.clear()
        self.in_flight.clear()
        for batch in batches:
            self.free_room(batch)
        return batches

    def idle(self) -> bool:
        return not self.open and not self.in_flight


#: A put is not sent with less time than this left (or a twentieth of the timeout): it would
#: end without an answer, its outcome unknown, where "not sent" says nothing was stored.
MIN_PUT_TIME = 0.05


def read_deadline(engine: Any, block_timeout: float) -> float:
    """The ``extra`` of ``engine.deadline(extra)`` for the sender's read of its queue's
    definition (:meth:`Batches.due`): at most ``block_timeout`` (at least 0.1 s), not the
    engine's call timeout: the batches due wait no longer on it than a send on room."""
    timeout = getattr(engine, "timeout", None)
    return min(0.0, max(0.1, block_timeout) - timeout) if isinstance(timeout, (int, float)) else 0.0


def put_deadline(engine: Any, batch: Batch) -> float:
    """The ``extra`` of the put's ``engine.deadline(extra)``: its engine's call timeout counts
    from when ``batch`` was due (its linger's end, or its flush; an engine in this process
    has no timeout: 0). A put waits behind its partition's put under way, so timed from its
    own start, each one queued behind a dead server would wait a whole timeout more; counted
    from when it was due, every send ends within about its linger and one timeout.

    Raises:
        DeadlineExceeded: that time is up already: the put is not sent.
    """
    timeout = getattr(engine, "timeout", None)
    if not isinstance(timeout, (int, float)):
        return 0.0
    extra = min(0.0, batch.deadline - time.monotonic())
    if timeout + extra <= min(MIN_PUT_TIME, timeout / 20):  # (sent with a sliver left: OutcomeUnknown, surely)
        raise DeadlineExceeded(
            f"not sent: its partition's puts before it took the call's {timeout:g}s timeout; nothing of it was stored"
        )
    return extra


_T = TypeVar("_T")


def fail_sends(futures: Iterable[Any], error: BaseException) -> None:
    """``error`` on each of ``futures`` not done yet (a put that failed, or a producer closed)."""
    settle(futures, lambda future: future.done() or future.set_exception(error))


def settle(items: Iterable[_T], resolve: Callable[[_T], object]) -> None:
    """``resolve(item)`` for each item, though a future's callback raise what a Future passes
    on (SystemExit, KeyboardInterrupt: the rest of the batch's futures were left pending for
    ever, and flush() said all was done). Such an error is logged: the producer's thread
    has no caller to raise it to."""
    for item in items:
        try:
            resolve(item)
        except BaseException as e:  # noqa: BLE001 - logged: every other future still resolves
            logger.error("a producer future's callback raised %r: the other futures resolve all the same", e)


class Producer:
    """Sends messages in batches, from any number of threads.

    Use :meth:`HQueue.producer <hqueue.HQueue.producer>` to make one; close it
    (or use it as a context manager) to send what is buffered.

    Args:
        engine, name: The queue's engine and name (from the HQueue).
        linger_ms: How long a batch waits for more messages after its first (0: it goes
            as soon as its partition has no put under way).
        max_batch: Messages in one put (1..10,000).
        max_bytes: Bytes (topics and values) in one put (up to 16 MiB).
        buffer_bytes: Bytes of messages sent and not yet stored that the producer holds
            (each message's topic and value, and :data:`SEND_OVERHEAD` for keeping it and
            its Future); a :meth:`send` past it waits for room.
        block_timeout: Seconds :meth:`send` waits for room before it raises
            :class:`~hqueue.errors.ProducerBufferFull` (at most a year).
    """

    def __init__(
        self,
        engine: EngineAPI,
        name: str,
        *,
        linger_ms: float = DEFAULT_LINGER_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_bytes: int = DEFAULT_MAX_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
    ) -> None:
        self.engine, self.name = engine, name
        info = engine.queue_info(name, fresh=True).require_enabled()  # (not a client's cached copy)
        self._batches = Batches(info, linger_ms, max_batch, max_bytes, buffer_bytes, block_timeout)
        self._cond = threading.Condition()
        #: ``pid``: the partition whose Futures' callbacks run in this thread now (None: none).
        self._delivering = threading.local()
        #: Put calls made, and messages they carried (stored or failed).
        self.puts = self.sent = 0
        self._pool = ThreadPoolExecutor(min(MAX_IN_FLIGHT_PARTITIONS, info.partitions), "hqueue-producer-put")
        self._sender = threading.Thread(target=self._sender_run, name=f"hqueue-producer-{name}", daemon=True)
        self._sender.start()
        self._fork = forks.generation()  # its threads do not cross fork()
        _LIVE.add(self)

    # -- sending ----------------------------------------------------------------------------

    def send(self, message: Message, *, key: bytes | str | None = None, partition: int | None = None) -> SendFuture:
        """Queue ``message`` for its partition's next batch; a Future of its ID.

        Args:
            message: The message.
            key: Route by key: CRC32(key) mod partitions, as :meth:`HQueue.put` does.
            partition: The partition (put's ``partition_id``; give ``key`` or
                ``partition``, not both). Without either, messages go to one partition
                until its batch goes, then another.

        Returns:
            A Future (its ``partition_id`` says where the message goes): its result is
            the message's ID once stored; its exception is
            the put's error if the batch failed (``OutcomeUnknown``: it may be stored).
            Cancelling it before its batch goes leaves the message out.

        Raises:
            ProducerBufferFull: no room in ``buffer_bytes`` within ``block_timeout`` (at
                once from a Future's callback when only its own partition's next batches
                could free the room: they go after the callback returns).
            ProducerClosed: the producer is closed.
            InvalidMessage, MessageTooLarge, InvalidPartition, TypeError: the message
                or its partition is not valid (nothing is queued).
        """
        batches = self._batches
        cost, chosen = batches.check(message, key, partition)
        if self._forked():
            raise ProducerClosed(f"the producer of {self.name!r} was made before this process forked: make one here")
        with self._cond:
            if batches.closed:
                raise ProducerClosed(f"the producer of {self.name!r} is closed")
            if not batches.has_room(cost):
                self._wait_for_room(cost)
            future, wake = batches.add(message, cost, chosen, SendFuture)
            if wake:
                self._cond.notify_all()
        return future

    def _wait_for_room(self, cost: int) -> None:
        """Wait (under the lock) until ``cost`` bytes fit in the buffer, or raise."""
        batches = self._batches
        give_up = time.monotonic() + batches.block_timeout
        batches.pending()  # a full buffer sends what it holds now, not at its linger's end (as Kafka's)
        self._cond.notify_all()
        mine = getattr(self._delivering, "pid", None)
        if mine is not None and batches.buffered - batches.held_beside(mine) + cost > batches.buffer_bytes:
            # A Future's callback, whose room only its own partition's next batches would free:
            # they go once the callback returns. (Room other partitions hold it waits for.)
            raise ProducerBufferFull(self.name, batches.buffer_bytes, batches.block_timeout, in_callback=True)
        while not batches.has_room(cost) and not batches.closed:
            left = give_up - time.monotonic()
            if left <= 0:
                raise ProducerBufferFull(self.name, batches.buffer_bytes, batches.block_timeout)
            self._cond.wait(left)
        if batches.closed:
            raise ProducerClosed(f"the producer of {self.name!r} is closed")

    # -- flushing and closing ---------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Send every batch now, and wait until each message sent before this call
        is stored or failed (its Future done). False if ``timeout`` seconds passed first.

        Raises:
            RuntimeError: called from a Future's callback (it would wait for itself).
        """
        check_timeout(timeout)
        if getattr(self._delivering, "pid", None) is not None:
            raise RuntimeError("flush() and close() cannot be called from a producer Future's callback")
        if self._forked():
            return True  # nothing of the parent's is this process's to send
        with self._cond:
            batches = self._batches.pending()
            self._cond.notify_all()
        give_up = None if timeout is None else time.monotonic() + timeout
        for batch in batches:
            if not batch.done.wait(_left(give_up)):
                return False
        return True

    def close(self, timeout: float | None = None) -> None:
        """Stop taking sends, send what is buffered, and stop (waiting up to ``timeout``
        seconds in all)."""
        check_timeout(timeout)
        if getattr(self._delivering, "pid", None) is not None:
            raise RuntimeError("flush() and close() cannot be called from a producer Future's callback")
        if self._forked():
            return
        with self._cond:
            self._batches.closed = True  # (closed already: this waits for it as well)
            self._cond.notify_all()
        give_up = None if timeout is None else time.monotonic() + timeout
        self.flush(timeout)
        self._sender.join(_left(give_up))  # past the timeout, it goes on sending what is held

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._batches.closed or self._forked()

    def _forked(self) -> bool:
        """This process is a child forked from the producer's: it has none of its threads."""
        return forks.generation() != self._fork

    # -- the sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        batches = self._batches
        while True:
            if batches.due():  # (in a thread of its own: a send does no I/O, this thread dispatches the
                try:  # batches due, and the put threads are the partitions')
                    threading.Thread(target=self._read_again, name="hqueue-producer-read", daemon=True).start()
                except RuntimeError:  # (no thread to be had: the interpreter is ending)
                    pass
            with self._cond:
                ready = batches.take_ready()
                while not ready:
                    if batches.closed and batches.idle():
                        return
                    self._cond.wait(batches.next_wake())
                    ready = batches.take_ready()
            for pid, batch in ready:  # partitions' puts under way at once (and sharing a group commit)
                try:
                    self._pool.submit(self._put, pid, batch)
                except RuntimeError:  # no thread to be had (the interpreter is ending): the put goes here
                    self._put(pid, batch)

    def _sender_run(self) -> None:
        try:
            self._run()
        finally:
            self._pool.shutdown(wait=False)  # its puts under way end; the threads go then

    def _put(self, pid: int, batch: Batch) -> None:
        live = [(m, f) for m, f in zip(batch.messages, batch.futures, strict=True) if f.set_running_or_notify_cancel()]
        ids: list[MessageID] = []
        error: BaseException | None = None
        try:
            if live:
                with self.engine.deadline(put_deadline(self.engine, batch)):
                    ids = self.engine.put(self.name, [m for m, _ in live], pid, routed_by=batch.routed_by)
                if len(ids) != len(live):
                    raise HQueueError(f"the put of {len(live)} message(s) was answered with {len(ids)} ID(s)")
        except BaseException as e:  # noqa: BLE001 - every error goes to the batch's futures
            if not isinstance(e, HQueueError):
                logger.warning("put of %d message(s) to %s/%d failed: %r", len(live), self.name, pid, e)
            error = e
        if isinstance(error, REDEFINED):
            self._renew(fresh=True)
        # The batch's room is free before its futures resolve: a callback that sends again
        # may need that room (it waited for itself until block_timeout). Its partition is
        # free after: the next batch's futures resolve after these.
        with self._cond:
            self.puts, self.sent = self.puts + bool(live), self.sent + len(live)
            self._batches.free_room(batch)
            self._cond.notify_all()
        self._delivering.pid = pid
        try:
            if error is not None:
                fail_sends((f for _, f in live), error)
            else:
                settle(zip(live, ids, strict=True), lambda done: done[0][1].set_result(done[1]))
        finally:
            self._delivering.pid = None
            with self._cond:
                self._batches.finished(pid, batch)
                self._cond.notify_all()
            batch.done.set()

    def _read_again(self) -> None:
        """The definition again (Batches.due), by at most ``block_timeout``."""
        with self.engine.deadline(read_deadline(self.engine, self._batches.block_timeout)):
            self._renew(fresh=False)

    def _renew(self, fresh: bool) -> None:
        try:
            info = self.engine.queue_info(self.name, fresh=fresh)
        except (HQueueError, RuntimeError):  # (RuntimeError: its handle closed the store)
            return  # (a later put reads it again)
        with self._cond:
            self._batches.renew(info)

    def __repr__(self) -> str:
        b = self._batches
        return f"Producer({self.name!r}, linger_ms={b.linger * 1000:g}, max_batch={b.max_batch})"


#: Producers made in this process (what one holds unsent at exit is said: :func:`_unsent_at_exit`).
_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()


def _unsent_at_exit() -> None:
    """At the interpreter's exit, a warning for each producer not closed that holds messages
    not stored: they are lost with the process (as a Kafka producer's), and nothing said so."""
    for producer in list(_LIVE):
        if producer.closed or not producer._cond.acquire(timeout=1.0):  # (its threads still run)
            continue
        try:
            unsent = producer._batches.unsent()
        finally:
            producer._cond.release()
        if unsent:
            logger.warning(
                "%r: %d message(s) sent and not stored are lost at exit: close() or flush() the producer "
                "(or use it with 'with') before the process ends", producer, unsent,
            )  # fmt: skip


atexit.register(_unsent_at_exit)


def _left(give_up: float | None) -> float | None:
    return None if give_up is None else max(0.0, give_up - time.monotonic())


def check_timeout(timeout: float | None) -> None:
    """A flush's or close's ``timeout``: None (no end), or seconds up to MAX_BLOCK_TIMEOUT."""
    if timeout is not None:
        _check_number("timeout", timeout, 0, MAX_BLOCK_TIMEOUT)


def _check_number(name: str, value: object, low: float, high: float, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"'{name}' must be {'an int' if integer else 'a number'}, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"'{name}' must be in {low:g}..{high:g}, got {value!r}")
