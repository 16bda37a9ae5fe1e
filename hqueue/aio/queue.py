"""AsyncHQueue: put messages, scan them, consume them in groups, on the event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, overload

from ..checks import check_partition, check_queue_name_type, check_scan_limit
from ..config import QueueInfo
from ..consumer import Pending
from ..errors import InvalidPartition, QueueNotFound
from ..groups.limits import DEFAULT_LEASE, DEFAULT_MAX_RETRIES, GroupLimits, check_group_name, check_pending_limit
from ..keys.timers import Timer, due_ms, timer_of
from ..message import Message, MessageID
from ..producer import (
    DEFAULT_BLOCK_TIMEOUT,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BYTES,
)
from ..queue import LEAVE_AT_CLOSE, TimeLike, as_batch, as_message_id, route
from ..scanner import DEFAULT_CACHING, Scan, check_caching
from ..subscriptions.listener import Subscription
from .connect import DEFAULT_WORKERS, groups_of
from .consumer import AsyncConsumer
from .handle import AsyncConnected
from .producer import AsyncProducer
from .scanner import AsyncScanner
from .subscriber import AsyncSubscriber, Listener

logger = logging.getLogger(__name__)

__all__ = ["AsyncHQueue"]


class AsyncHQueue(AsyncConnected):
    """A handle on one queue, for asyncio: :class:`~hqueue.HQueue`'s calls, awaitable.

    Args:
        name: The queue, which must exist.
        url, data_dir, token, timeout, group_limits: As for :class:`~hqueue.HQueue`.
        workers: For a store in this process, the threads its storage calls run in
            (default 4): the embedded engine is synchronous. hqueue:// needs none.

    Open it with ``async with`` (or ``await queue.open()``); the first call opens
    it too. ``QueueNotFound`` is raised then.

    Example::

        async with AsyncHQueue("crawl") as queue:
            await queue.put(Message("crawler", b"http://example.com"))
            async for message in queue.scan(topics=["crawler"]):
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
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        check_queue_name_type(name)
        super().__init__(
            url, data_dir=data_dir, token=token, timeout=timeout, group_limits=group_limits, workers=workers
        )
        self.name = name
        self._producers: weakref.WeakSet[AsyncProducer] = weakref.WeakSet()
        self._consumers: weakref.WeakSet[AsyncConsumer] = weakref.WeakSet()
        #: The subscribers started here (the queue's to stop, referenced or not), until they stop.
        self._subscribers: set[AsyncSubscriber] = set()

    async def _opened(self) -> None:
        """The queue must exist. If it does not (or no server answers, or the call is
        cancelled), the engine is let go and the handle stays usable: the next call opens
        it again (a first call cancelled, as by ``wait_for``, closed the handle for good)."""
        try:
            assert self._engine is not None
            await self._engine.queue_info(self.name)
        except BaseException:
            engine, self._engine = self._engine, None
            if engine is not None:
                await asyncio.shield(engine.release())
            raise

    async def info(self) -> QueueInfo:
        """The queue's definition (partitions, TTL, state, …)."""
        return await (await self.async_engine()).queue_info(self.name)

    @overload
    async def put(
        self, messages: Message | Sequence[Message], partition_id: int | None = None, *,
        key: bytes | str | None = None, deliver_at: None = None, delay: None = None, priority: int | None = None,
    ) -> list[MessageID]: ...  # fmt: skip

    @overload
    async def put(
        self, messages: Message | Sequence[Message], partition_id: int | None = None, *,
        key: bytes | str | None = None, deliver_at: datetime | int | None = None, delay: float | None = None,
        priority: int | None = None,
    ) -> list[MessageID] | list[Timer]: ...  # fmt: skip

    async def put(
        self,
        messages: Message | Sequence[Message],
        partition_id: int | None = None,
        *,
        key: bytes | str | None = None,
        deliver_at: datetime | int | Sequence[datetime | int] | None = None,
        delay: float | None = None,
        priority: int | None = None,
    ) -> list[MessageID] | list[Timer]:
        """Write one message or a batch, atomically to one partition; the IDs given
        (timers with ``deliver_at``/``delay``). Arguments and errors as :meth:`HQueue.put
        <hqueue.HQueue.put>`."""
        batch = as_batch(messages)
        due = None if deliver_at is None and delay is None else due_ms(deliver_at, delay)
        engine = await self.async_engine()
        with engine.deadline():  # one deadline for the queue's definition and the put
            for fresh in (False, True):  # (as HQueue.put: by the cached definition, then a fresh one)
                try:
                    info = await engine.queue_info(self.name, fresh=fresh)
                    pid = route(info.require_enabled(), partition_id, key, priority)
                    if due is not None:
                        return await engine.schedule(self.name, batch, pid, due, routed_by=info.created)
                    return await engine.put(self.name, batch, pid, routed_by=info.created)
                except (QueueNotFound, InvalidPartition):
                    if fresh:
                        raise
            raise AssertionError("unreachable")

    async def cancel(self, timer: Timer | str) -> bool:
        """Cancel a pending timer message; False if it fired (or was cancelled) already."""
        timer = timer_of(self.name, timer)
        return await (await self.async_engine()).cancel_timer(self.name, timer)

    def scan(
        self,
        start: TimeLike = None,
        stop: TimeLike = None,
        topics: Iterable[str | bytes] | None = None,
        *,
        partition_id: int | None = None,
        limit: int | None = None,
        caching: int = DEFAULT_CACHING,
    ) -> AsyncScanner:
        """``async for`` over messages in ``[start, stop)``, in ID order (as :meth:`HQueue.scan
        <hqueue.HQueue.scan>`); partitions are read concurrently. Close it early with
        ``aclose()`` or ``async with``."""
        scan = Scan(as_message_id(start, "start"), as_message_id(stop, "stop"), topics)
        check_scan_limit(limit)
        check_caching(caching)

        async def opener(engine: Any, fresh: bool) -> tuple[str, dict[int, Scan], str | None]:
            info = await (engine.queue_info(self.name, fresh=True) if fresh else engine.enabled_queue(self.name))
            if partition_id is not None and not fresh and not 0 <= partition_id < info.partitions:
                info = await engine.queue_info(self.name, fresh=True)  # (cached, of a queue made again since?)
            info.require_enabled()
            pids = range(info.partitions) if partition_id is None else [check_partition(info, partition_id)]
            return self.name, dict.fromkeys(pids, scan), info.created

        return AsyncScanner(self.async_engine, opener, min(limit, caching) if limit else caching, limit)

    # -- consumer groups -----------------------------------------------------------

    def producer(
        self,
        *,
        linger_ms: float = DEFAULT_LINGER_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_bytes: int = DEFAULT_MAX_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
    ) -> AsyncProducer:
        """An :class:`~hqueue.aio.AsyncProducer`: ``await send(message)`` from any task, and
        sends awaited at once go out together, one put call per partition. Arguments as
        :meth:`HQueue.producer <hqueue.HQueue.producer>`'s; closing the queue closes it."""
        producer = AsyncProducer(
            self.name, self.async_engine, linger_ms=linger_ms, max_batch=max_batch, max_bytes=max_bytes,
            buffer_bytes=buffer_bytes, block_timeout=block_timeout,
        )  # fmt: skip
        self._producers.add(producer)
        return producer

    async def close(self) -> None:
        """Close the producers made here (sending what they hold), stop the subscribers and
        close the consumers (as :meth:`HQueue.close <hqueue.HQueue.close>` does: each leave
        given :data:`~hqueue.queue.LEAVE_AT_CLOSE`), then release the store."""
        self._closable_here()
        for producer in list(self._producers):
            await producer.close()
        # Subscribers and consumers end together, within 2 x LEAVE_AT_CLOSE whoever does not
        # answer: a stop or a leave not done by then goes on by itself (each is shielded).
        ending = [
            *(asyncio.ensure_future(s.stop("its queue handle was closed")) for s in list(self._subscribers)),
            *(asyncio.ensure_future(c.close(within=LEAVE_AT_CLOSE)) for c in list(self._consumers)),
        ]
        if ending:
            done, late = await asyncio.wait(ending, timeout=2 * LEAVE_AT_CLOSE)
            for task in late:
                task.cancel()
            for task in done:  # (their errors are not the close's: a leave not heard leaves at the end)
                if not task.cancelled() and task.exception() is not None:
                    logger.debug("closing %r: %s", self, task.exception())
        await super().close()

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
    ) -> AsyncConsumer:
        """A member of consumer group ``group`` (see :class:`~hqueue.aio.AsyncConsumer`)."""
        consumer = AsyncConsumer(
            self, group, topics, start=start, max_retries=max_retries, lease=lease, member=member,
            key_affinity=key_affinity, prefetch=prefetch,
        )  # fmt: skip
        self._consumers.add(consumer)
        return consumer

    async def pending(self, group: str, *, limit: int = 1000) -> list[Pending]:
        """As :meth:`HQueue.pending <hqueue.HQueue.pending>`."""
        groups = groups_of(await self.async_engine())
        found = await groups.pending(self.name, check_group_name(group), check_pending_limit(limit))
        return [
            Pending(p["partition"], p["id"], p["member"], p["attempt"], p["lease_left"], p["retry_in"]) for p in found
        ]

    # -- subscriptions -------------------------------------------------------------

    def create_subscriber(
        self, subscription: Subscription, listeners: Sequence[Listener], **options: Any
    ) -> AsyncSubscriber:
        """A push subscriber whose listeners may be coroutine functions (see
        :class:`~hqueue.aio.AsyncSubscriber`); options as :meth:`HQueue.create_subscriber
        <hqueue.HQueue.create_subscriber>`. ``await subscriber.start()``."""
        if not isinstance(subscription, Subscription):
            raise TypeError(f"'subscription' must be a Subscription, not {type(subscription).__name__}")
        return AsyncSubscriber(self.name, self._opened_with, subscription, listeners, options, self._subscribers)

    def __repr__(self) -> str:
        return f"AsyncHQueue({self.name!r}, url={self.url!r})"
