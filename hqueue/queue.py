"""HQueue: put messages into a queue and scan them back (SPEC C5, C6)."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import TypeVar, overload

from .api import groups_of
from .batch import MessageBatch, check_batch_size, partition_batches
from .checks import check_partition, check_queue_name_type, check_scan_limit, choose_partition, partition_for_key
from .config import QueueInfo
from .connection import Connected
from .consumer import Consumer, Pending
from .errors import HQueueError, InvalidPartition, QueueNotFound
from .groups.limits import DEFAULT_LEASE, DEFAULT_MAX_RETRIES, GroupLimits, check_group_name, check_pending_limit
from .keys.timers import Timer, due_ms, timer_of
from .message import Message, MessageID, TimeLike, as_message_id
from .producer import (
    DEFAULT_BLOCK_TIMEOUT,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BYTES,
    Producer,
)
from .scanner import (
    DEFAULT_CACHING,
    CombinedPartitionScanner,
    OpenedOnAnother,
    PartitionScanner,
    QueueScanner,
    Scan,
)
from .splits import Split
from .subscriptions.listener import MessageListener, Subscriber, Subscription

__all__ = ["HQueue", "partition_for_key"]


#: Seconds a consumer left open may take to leave its group when its queue closes (through
#: a server that does not answer, its connection's end counts what it held as failed).
LEAVE_AT_CLOSE = 1.0

_Opened = TypeVar("_Opened")


class HQueue(Connected):
    """A handle on one queue.

    Args:
        name: The queue, which must exist (see :class:`HQueueAdmin`).
        url: ``local:///path`` (default: ``$HQUEUE_DATA`` or
            ``./hqueue-data``), ``hbase://host:9090``, or hqueue servers:
            ``hqueue://[TOKEN@]host:9700[,…][?timeout=S&tls=1&ca=FILE]``.
        data_dir: Shorthand for ``url="local://" + data_dir``.
        token: hqueue servers' auth token (default: the URL's, or ``$HQUEUE_TOKEN``).
        timeout: The deadline of one call to hqueue servers, in seconds (default 30),
            across every retry and every server tried; on a ``local://`` store another
            process serves, of one call to that process (a store this process serves
            has none).
        group_limits: For a store this process serves: what one consumer-group
            member may take (:class:`~hqueue.GroupLimits`: the longest lease,
            messages held at once). hqueue servers have their own.

    Raises:
        QueueNotFound: the queue does not exist.
        TypeError: ``name`` is not a str.

    Example::

        with HQueue("crawl") as queue:
            queue.put(Message("crawler", b"http://example.com"))
            for message in queue.scan(topics=["crawler"]):
                print(message.id, message.value)
    """

    def __init__(
        self,
        name: str,
        url: str | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        timeout: float | None = None,
        group_limits: GroupLimits | None = None,
    ) -> None:
        check_queue_name_type(name)  # before anything is opened
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()
        self._consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        self._subscribers: weakref.WeakSet[Subscriber] = weakref.WeakSet()
        super().__init__(url, data_dir=data_dir, token=token, timeout=timeout, group_limits=group_limits)
        try:
            self.name = name
            self.engine.queue_info(name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the producers made here (sending what they hold), the consumers (each
        leaves its group, so what it holds goes back at once, no failure counted; a server
        that does not answer within :data:`LEAVE_AT_CLOSE` leaves it to the connection's
        end) and stop the subscribers still started (they heartbeat through this handle:
        once it was closed each logged a failure a second), then release the store."""
        for producer in list(self._producers):
            producer.close()
        engine = self._engine
        timeout = getattr(engine, "timeout", None)
        shorter = LEAVE_AT_CLOSE - timeout if isinstance(timeout, (int, float)) and timeout > LEAVE_AT_CLOSE else 0
        for subscriber in list(self._subscribers):  # (its leave, as a consumer's: within LEAVE_AT_CLOSE)
            with contextlib.suppress(HQueueError), engine.deadline(shorter) if engine else contextlib.nullcontext():
                subscriber.stop("its queue handle was closed")
        if engine is not None:  # (closed already: nothing of it is left)
            for consumer in [c for c in self._consumers if not c.closed]:
                with contextlib.suppress(HQueueError), engine.deadline(shorter):  # (the close goes on; the
                    consumer.close()  # consumer is closed before its leave is asked)
        super().close()

    @property
    def info(self) -> QueueInfo:
        """The queue's definition (partitions, TTL, state, …)."""
        return self.engine.queue_info(self.name)

    @property
    def partitions(self) -> int:
        return self.info.partitions

    @overload
    def put(
        self,
        messages: Message | Sequence[Message],
        partition_id: int | None = None,
        *,
        key: bytes | str | None = None,
        deliver_at: None = None,
        delay: None = None,
        priority: int | None = None,
    ) -> list[MessageID]: ...

    @overload
    def put(
        self,
        messages: Message | Sequence[Message],
        partition_id: int | None = None,
        *,
        key: bytes | str | None = None,
        deliver_at: datetime | int | Sequence[datetime | int] | None = None,
        delay: float | None = None,
        priority: int | None = None,
    ) -> list[MessageID] | list[Timer]: ...

    def put(
        self,
        messages: Message | Sequence[Message],
        partition_id: int | None = None,
        *,
        key: bytes | str | None = None,
        deliver_at: datetime | int | Sequence[datetime | int] | None = None,
        delay: float | None = None,
        priority: int | None = None,
    ) -> list[MessageID] | list[Timer]:
        """Write one message or a batch; return the IDs the server gave them.

        A batch goes to one partition atomically and gets consecutive IDs in
        its order.

        Args:
            messages: A Message or a sequence of them.
            partition_id: The partition; None picks one at random.
            key: Route by key instead: CRC32(key) mod partitions, so one key
                always lands in one partition, in order.
            deliver_at: Make them timer messages (SPEC X1), delivered at this
                datetime or epoch milliseconds (or a list of them, one per
                message: the batch is still one write): invisible until then, then
                written to the partition with fresh IDs. Returns
                :class:`~hqueue.timers.Timer` handles for :meth:`cancel`.
                Timers fire in the process that owns the partition: a server
                (``hqueue://``), or on an embedded store (``local://``) this
                process, only while it has the store open; a timer that falls
                due while no process has it open fires when one opens it. Serve
                the store with ``hqueue server`` to have timers fire on time
                (docs/timers.md).
            delay: As ``deliver_at``, in seconds from now.
            priority: On a queue with priority tiers (``create_queue(...,
                priorities=N)``), the tier, 0 (the default, lowest) to N-1:
                the batch goes to a partition of that tier's band (by
                ``key`` within it, if given), and consumer groups serve
                higher tiers first.

        A rejected batch writes nothing.

        Raises:
            QueueNotFound: No such queue.
            QueueDisabled: The queue is disabled.
            InvalidPartition: ``partition_id`` is not one of the queue's.
            InvalidMessage: A message is not valid (``MessageTooLarge``: too large).
            StorageError: The store failed the write.
        """
        batch = as_batch(messages)
        due = None if deliver_at is None and delay is None else due_ms(deliver_at, delay)
        with self.engine.deadline():  # one deadline for the queue's definition and the put
            # By the client's cached definition, saying so (routed_by); refused for a queue deleted
            # and made again since (nothing written), by a fresh one, once. Unchecked, a key's
            # puts went by the old partition count for up to the cache's 2 s (an attacker's probe).
            engine = self.engine
            for fresh in (False, True):
                try:
                    info = engine.queue_info(self.name, fresh=fresh)
                    pid = route(info.require_enabled(), partition_id, key, priority)
                    if due is not None:
                        return engine.schedule(self.name, batch, pid, due, routed_by=info.created)
                    return engine.put(self.name, batch, pid, routed_by=info.created)
                except (QueueNotFound, InvalidPartition):  # (the cached definition's, or the put's
                    if fresh:  # refusal of it: the queue may have been made again since)
                        raise
            raise AssertionError("unreachable")

    def producer(
        self,
        *,
        linger_ms: float = DEFAULT_LINGER_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_bytes: int = DEFAULT_MAX_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
    ) -> Producer:
        """A :class:`~hqueue.producer.Producer`: ``send(message)`` from any thread returns a
        Future of the message's ID, and concurrent sends go out together, one put call per
        partition (docs/python-api.md, "Producing from many threads").

        Args:
            linger_ms: How long a batch waits for more messages after its first.
            max_batch: Messages in one put (1..10,000).
            max_bytes: Bytes in one put (up to 16 MiB).
            buffer_bytes: Bytes sent and not yet stored the producer holds (each message's topic
                and value, and 2 KiB for keeping it); a send past it waits.
            block_timeout: Seconds a send waits for room before it raises ProducerBufferFull.

        Close it (or use ``with``) to send what it holds; closing the queue closes it too
        (a send after either raises ProducerClosed).
        """
        producer = Producer(
            self.engine, self.name, linger_ms=linger_ms, max_batch=max_batch, max_bytes=max_bytes,
            buffer_bytes=buffer_bytes, block_timeout=block_timeout,
        )  # fmt: skip
        self._producers.add(producer)
        return producer

    def cancel(self, timer: Timer | str) -> bool:
        """Cancel a pending timer message; False if it fired (or was cancelled) already."""
        timer = timer_of(self.name, timer)
        return self.engine.cancel_timer(self.name, timer)

    def timers(self, partition_id: int | None = None, *, limit: int = 100) -> list[tuple[Timer, Message]]:
        """Pending timer messages, earliest first per partition (every partition, or
        one), at most ``limit`` (1..10,000) per partition.

        Raises:
            InvalidArgument: ``limit`` out of range.
        """
        engine = self.engine
        check_pending_limit(limit)
        info = self.engine.queue_info(self.name, fresh=True)
        pids = range(info.partitions) if partition_id is None else [check_partition(info, partition_id)]
        return [found for pid in pids for found in engine.pending_timers(self.name, pid, limit)]

    def count_timers(self, *, limit: int = 100) -> tuple[int, bool]:
        """(pending timers, whether any partition had more than ``limit`` (1..10,000) and was
        counted to ``limit`` only): one partition read at a time, so memory stays bounded."""
        check_pending_limit(limit)
        total, capped = 0, False
        for pid in range(self.engine.queue_info(self.name, fresh=True).partitions):
            found = self.engine.count_timers(self.name, pid, limit + 1)
            total, capped = total + min(found, limit), capped or found > limit
        return total, capped

    def next_due(self) -> int | None:
        """Epoch ms of the earliest pending timer of any partition; None if none is pending."""
        partitions = self.engine.queue_info(self.name, fresh=True).partitions  # (as count_timers and timers)
        dues = [self.engine.next_timer(self.name, pid) for pid in range(partitions)]
        return min((d for d in dues if d is not None), default=None)

    def find_timer(self, timer: Timer | str) -> Message | None:
        """The message a pending timer will deliver; None if it fired or was cancelled."""
        timer = timer_of(self.name, timer)
        return self.engine.find_timer(self.name, timer)

    # -- the Java client's scanners ---------------------------------------------

    def get_queue_scanner(self, scan: Scan | None = None, *, caching: int = DEFAULT_CACHING) -> QueueScanner:
        """A scanner over every partition, merged in MessageID order."""
        return self._opened(
            lambda info: QueueScanner(
                self.engine, self.name, info.partitions, scan or Scan(), caching, created=info.created
            )
        )

    def get_partition_scanner(
        self, partition_id: int, scan: Scan | None = None, *, caching: int = DEFAULT_CACHING
    ) -> PartitionScanner:
        """A scanner over one partition."""
        return self._opened(
            lambda info: PartitionScanner(
                self.engine,
                self.name,
                check_partition(info, partition_id),
                scan or Scan(),
                caching,
                created=info.created,
            )  # fmt: skip
        )

    def get_combined_partition_scanner(
        self, scans: Mapping[int, Scan], *, caching: int = DEFAULT_CACHING
    ) -> CombinedPartitionScanner:
        """A scanner over chosen partitions, each with its own Scan, merged."""

        def opened(info: QueueInfo) -> CombinedPartitionScanner:
            for pid in scans:
                check_partition(info, pid)
            return CombinedPartitionScanner(self.engine, self.name, scans, caching, created=info.created)

        return self._opened(opened)

    def _opened(self, scanner: Callable[[QueueInfo], _Opened]) -> _Opened:
        """``scanner(info)`` opened on the queue's definition; opening it (the definition, a
        cursor per partition) is one call. A definition from the client's cache that a
        recreate since outdated (the cursors opened on the new queue) is read again, fresh,
        and the scanner opened again: nothing was read yet (it said QueueNotFound for up to
        2 s after another client made the queue again)."""
        with self.engine.deadline():
            info = self.engine.enabled_queue(self.name)
            try:
                return scanner(info)
            except (OpenedOnAnother, InvalidPartition):  # (a partition the cached definition, or the new queue, lacks)
                fresh = self.engine.queue_info(self.name, fresh=True).require_enabled()
                if fresh.created == info.created:
                    raise
                return scanner(fresh)

    # -- Pythonic extras ---------------------------------------------------------

    def scan(
        self,
        start: TimeLike = None,
        stop: TimeLike = None,
        topics: Iterable[str | bytes] | None = None,
        *,
        partition_id: int | None = None,
        limit: int | None = None,
    ) -> Iterator[Message]:
        """Iterate messages in ``[start, stop)``; times may be MessageIDs,
        datetimes or epoch milliseconds.
        """
        scan = Scan(as_message_id(start, "start"), as_message_id(stop, "stop"), topics)
        check_scan_limit(limit)
        caching = min(limit, DEFAULT_CACHING) if limit else DEFAULT_CACHING
        if partition_id is None:
            scanner: PartitionScanner | QueueScanner = self.get_queue_scanner(scan, caching=caching)
        else:
            scanner = self.get_partition_scanner(partition_id, scan, caching=caching)
        return _limited(scanner, limit)

    def scan_batches(
        self,
        start: TimeLike = None,
        stop: TimeLike = None,
        topics: Iterable[str | bytes] | None = None,
        *,
        partition_id: int | None = None,
        batch_size: int = 10_000,
    ) -> Iterator[MessageBatch]:
        """Read a lot fast: :class:`~hqueue.batch.MessageBatch` columns, partition by partition.

        Each batch is in ID order within its partition; partitions come one
        after another, not merged (use :meth:`scan` for one ID order). No
        Message object is made per row unless you ask the batch for them.
        """
        scan = Scan(as_message_id(start, "start"), as_message_id(stop, "stop"), topics)
        check_batch_size(batch_size)

        def first(info: QueueInfo) -> tuple[QueueInfo, list[int], Iterator[MessageBatch], MessageBatch | None]:
            """The first partition opened (its cursor checked) and its first batch read."""
            pids = list(range(info.partitions)) if partition_id is None else [check_partition(info, partition_id)]
            batches = partition_batches(self.engine, self.name, pids[0], scan, batch_size, info.created)
            return info, pids, batches, next(batches, None)

        # One queue, partition after partition: each checked against the definition the scan
        # began with, read again if the first partition finds it outdated (HQueue._opened)
        info, pids, batches, head = self._opened(first)
        if head is not None:
            yield head
            yield from batches
        for pid in pids[1:]:
            yield from partition_batches(self.engine, self.name, pid, scan, batch_size, info.created)

    def splits(
        self, start: TimeLike = None, stop: TimeLike = None, topics: Iterable[str | bytes] | None = None
    ) -> list[Split]:
        """One :class:`~hqueue.splits.Split` per partition, for parallel readers (C11).

        Each names the partition's owner where servers serve the queue; a
        worker reads its split with ``split.read()``.
        """
        scan = Scan(as_message_id(start, "start"), as_message_id(stop, "stop"), topics)
        info = self.engine.queue_info(self.name, fresh=True).require_enabled()  # (its splits hold its created)
        owners = self.engine.partition_locations(self.name)
        url, token = self._credentials()
        chosen = tuple(sorted(scan.topics)) if scan.topics else None
        return [
            Split(
                url, self.name, pid, scan.start_id, scan.stop_id, chosen, owners[pid] or None, info.created
            )._carrying(token)
            for pid in range(info.partitions)
        ]

    # -- consumer groups (SPEC X2, X3) ---------------------------------------------

    def consumer(
        self,
        group: str,
        topics: Iterable[str | bytes] | None = None,
        *,
        start: str | datetime | int = "earliest",
        max_retries: int = DEFAULT_MAX_RETRIES,
        lease: float = DEFAULT_LEASE,
        member: str | None = None,
        key_affinity: str | None = None,
        prefetch: bool = False,
    ) -> Consumer:
        """A member of consumer group ``group``: receive, then ack or nack (see :class:`~hqueue.consumer.Consumer`)."""
        consumer = Consumer(
            self, group, topics, start=start, max_retries=max_retries, lease=lease, member=member,
            key_affinity=key_affinity, prefetch=prefetch,
        )  # fmt: skip
        self._consumers.add(consumer)
        return consumer

    def pending(self, group: str, *, limit: int = 1000) -> list[Pending]:
        """The messages consumer group ``group`` has handed out and not finished, in
        (partition, ID) order, at most ``limit`` (1..10,000): who holds each, its
        attempt, and the seconds its lease has left, or before it is retried.

        Raises:
            GroupNotFound: No such group.
            QueueNotFound: No such queue.
            InvalidArgument: ``limit`` is out of range.
        """
        found = groups_of(self.engine).pending(self.name, check_group_name(group), check_pending_limit(limit))
        return [
            Pending(p["partition"], p["id"], p["member"], p["attempt"], p["lease_left"], p["retry_in"]) for p in found
        ]

    # -- subscriptions (SPEC C7) ---------------------------------------------------

    def create_subscriber(
        self,
        subscription: Subscription,
        listeners: Sequence[MessageListener],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        takeover_timeout: float = 15.0,
        tls: bool | None = None,
        zk_auth: str | None = None,
    ) -> Subscriber:
        """A subscriber that servers push this queue's messages to; call start().

        Args:
            subscription: Name, topics, partitions and starts.
            listeners: Called in order with each batch.
            host: Where the subscriber listens.
            port: The port it listens on (0: a free one).
            advertise: ``host:port`` servers should connect to (default host:port).
            takeover_timeout: How long start() waits for an earlier instance of the
                subscriber to lapse (one that crashed); a live one keeps its name,
                and start() raises SubscriberActive.
            tls: Listen with TLS (a certificate made for this run, which servers
                pin). None (the default): when this queue's URL speaks TLS
                (``tls=1``); a TLS server pushes only over TLS.
            zk_auth: ZooKeeper credentials ``user:password`` (default:
                ``$HQUEUE_ZK_AUTH``), only for servers older than this version
                with a ZooKeeper with ACLs: the subscriber announces itself there.
                With newer servers it heartbeats them, and needs none.

        Every push is proven: the subscriber announces a key made for this
        run, and refuses (``TPushRefused``, never reaching a listener) any
        push a server did not prove with it (SPEC C7, the push channel).

        Push subscriptions work on every store: hqueue servers deliver them, or,
        for a store opened in this process, this process does.
        """
        service = self.subscriptions("create_subscriber")
        if not isinstance(subscription, Subscription):
            raise TypeError(f"'subscription' must be a Subscription, not {type(subscription).__name__}")
        subscriber = Subscriber(
            service,
            self.name,
            subscription,
            listeners,
            host=host,
            port=port,
            advertise=advertise,
            takeover_timeout=takeover_timeout,
            partitions=self.info.partitions,
            tls=bool(getattr(self.engine, "tls", False)) if tls is None else tls,
            zk_auth=zk_auth,
        )
        self._subscribers.add(subscriber)
        return subscriber

    def __repr__(self) -> str:
        return f"HQueue({self.name!r}, url={self._engine.url if self._engine else None!r})"


def _limited(scanner: PartitionScanner | QueueScanner, limit: int | None) -> Iterator[Message]:
    with scanner:
        if limit is None:
            yield from scanner
        else:
            yield from islice(scanner, limit)


#: Where a put goes (the producer routes the same way): checks.choose_partition.
route = choose_partition


def as_batch(messages: Message | Sequence[Message]) -> Sequence[Message]:
    """A put's batch: one Message, or a sequence of them."""
    batch = [messages] if isinstance(messages, Message) else messages
    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)):
        raise TypeError(f"'messages' must be a Message or a sequence of them, not {type(messages).__name__}")
    return batch
