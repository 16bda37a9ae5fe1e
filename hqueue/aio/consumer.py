"""AsyncConsumer: a consumer-group member on the event loop (SPEC X2, X3).

::

    async with AsyncHQueue("orders") as queue, queue.consumer("billing") as consumer:
        async for delivery in consumer:
            await bill(delivery.value)
            await consumer.ack(delivery)

The same groups as :class:`~hqueue.Consumer` (the state lives with the
partitions' owners); ``receive``, ``ack``, ``nack`` and ``dead_letter`` are
awaitable, and the member heartbeats from a task of its own.

**Cancellation.** A task cancelled in ``receive`` gets ``CancelledError`` at
once, and nothing stays leased to it. On a store in this process the wait is
on the loop: cancelled there, it was handed nothing; cancelled while a worker
takes messages, they go back as soon as it is done. On hqueue servers the long
poll under way ends on its own (by its ``wait``, sooner when work arrives);
the member's next receive with the same lease waits for it rather than polling
again, and takes what it is handed; what no receive takes goes back to the
group at once. Either way a message handed back goes back unseen: another member receives it straight away, and
no delivery attempt is counted (the application never saw it). Nothing stays
leased to a task that is gone, and no socket or thread is left behind:
:meth:`close` waits for the hand-backs under way, then leaves the group
(leases still held go back without counting); a cancelled receive's long
poll still at a server gets nothing after the leave, and what it was handed
before goes back when its answer comes.
An ``ack`` or ``nack`` cancelled mid-call may or may not have reached the group
(delivery stays at least once).

**Prefetch.** ``queue.consumer(group, prefetch=True)`` on hqueue servers asks for the
next batch once ``receive`` hands out a whole one, with the blocking consumer's bounds
(:mod:`hqueue.client.ahead`: a batch whose lease ran a quarter, or that does not fit the
receive, goes back unseen). Where one server owns the queue's partitions, the first
``ack`` after it asks, in its own call (``groupAckReceive``: one call a batch, not two);
elsewhere a task of its own asks at once. A receive cancelled while it awaits that batch
leaves it for the next, as an ack cancelled under way does the batch its answer brings;
``close`` awaits it before the leave, which gives it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from functools import partial
from typing import Any

from ..config import UNSEEN
from ..consumer import Delivery, _deliveries, _rowkeys, joining, member_name
from ..errors import GroupNotFound, HQueueError, QueueNotFound, ServerUnavailable
from ..groups.limits import (
    DEFAULT_LEASE,
    DEFAULT_MAX_RETRIES,
    HEARTBEAT_INTERVAL,
    PREFETCH_CLOSE_WAIT,
    PREFETCH_STALE_SHARE,
    check_delay,
    check_lease,
    check_max_messages,
    check_wait,
)
from ..message import Message
from .connect import groups_of
from .handle import bound_loop

logger = logging.getLogger(__name__)

Receipts = Delivery | Message | Iterable[Delivery | Message]


class AsyncConsumer:
    """One member of a consumer group; make it with :meth:`AsyncHQueue.consumer`
    (arguments as :class:`~hqueue.Consumer`'s). The group is opened on ``async with``
    or on the first call."""

    def __init__(
        self,
        queue: Any,
        group: str,
        topics: Iterable[str | bytes] | None = None,
        *,
        start: str | datetime | int = "earliest",
        max_retries: int = DEFAULT_MAX_RETRIES,
        lease: float = DEFAULT_LEASE,
        member: str | None = None,
        key_affinity: str | None = None,
        prefetch: bool = False,
    ) -> None:
        self.queue, self.group, self.lease = queue, group, check_lease(lease)
        if not isinstance(prefetch, bool):
            raise TypeError(f"'prefetch' must be True or False, not {prefetch!r}")
        self._prefetch = prefetch
        #: The batch asked for ahead (prefetch): its receive's task (or the answer of the ack
        #: that asked for it), lease, and when it went.
        self._ahead: tuple[asyncio.Future, float, float] | None = None
        #: (max_messages, lease) of a whole batch received at a sole owner: the next ack asks
        #: for the next batch in its call (prefetch).
        self._ask_with_ack: tuple[int, float] | None = None
        #: A receive came before the ack that was to ask: from then on, a receive asks ahead.
        self._acks_lag = False
        self.member = member_name(member)
        self._opening = joining(group, topics, start, max_retries, key_affinity)
        self._groups: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop it opened in
        self._open_lock = asyncio.Lock()
        self.closed = False
        self._heartbeats: asyncio.Task | None = None
        self._handing_back: set[asyncio.Task] = set()
        #: Tasks receiving from a server (maybe long polls): a close ends them before it leaves;
        #: those it cancelled return nothing.
        self._receiving: set[asyncio.Task] = set()
        self._ended_by_close: set[asyncio.Task] = set()

    async def open(self) -> AsyncConsumer:
        """Open (or make) the group; once."""
        async with self._open_lock:
            if self._groups is None:
                groups = groups_of(await self.queue.async_engine())
                await groups.open(self.queue.name, self.group, *self._opening)
                self._groups, self._loop = groups, asyncio.get_running_loop()
        return self

    async def _ready(self) -> Any:
        if self.closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._groups is None:
            return (await self.open())._groups
        bound_loop(self._loop, type(self).__name__)  # (its connections and heartbeats are that loop's)
        return self._groups

    async def receive(
        self, max_messages: int = 100, *, wait: float = 1.0, lease: float | None = None
    ) -> list[Delivery]:
        """Up to ``max_messages`` messages, waiting up to ``wait`` seconds for the first.
        Cancelled, it hands back what it was given (see the module's docstring)."""
        check_wait(wait)
        check_max_messages(max_messages)
        lease = check_lease(self.lease if lease is None else lease)
        groups = await self._ready()
        if self.closed:  # by another task while it opened the group: nothing to take
            return []
        if self._heartbeats is None:
            self._heartbeats = asyncio.ensure_future(_heartbeat(weakref.ref(self), groups))
        if getattr(groups, "cancel_safe", False):  # a store in this process: nothing to wait out
            pairs = await groups.receive(self.queue.name, self.group, self.member, max_messages, lease, wait)
            return await self._unless_closed(groups, pairs)
        if self._ask_with_ack is not None:  # no ack came since the last whole batch: acks lag the
            self._ask_with_ack, self._acks_lag = None, True  # receives: from now on, a receive asks ahead
        pairs = None if self._ahead is None else await self._taken_ahead(max_messages, lease)
        if pairs is None:
            pairs = await self._receive_at_server(groups, max_messages, lease, wait)
        if self._prefetch and len(pairs) >= max_messages and self._ahead is None and not self.closed:
            if not self._acks_lag and groups.sole_owner(self.queue.name) is not None:
                self._ask_with_ack = (max_messages, lease)  # the ack asks, in its call
            else:
                call = groups.receive(
                    self.queue.name, self.group, self.member, max_messages, lease, 0.0, late=self._late
                )
                self._ahead = (asyncio.ensure_future(call), lease, asyncio.get_running_loop().time())
        return await self._unless_closed(groups, pairs)

    async def _taken_ahead(self, max_messages: int, lease: float) -> list | None:
        """The batch asked for ahead, if it came with messages that fit this receive (what
        does not fit goes back unseen); None: receive afresh."""
        assert self._ahead is not None
        ahead, self._ahead = self._ahead, None
        task, its_lease, sent = ahead
        try:
            pairs = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() and self._ahead is None:  # this receive was cancelled, not the batch's:
                self._ahead = ahead  # it waits for the next
            else:  # (answered as this receive was cancelled, or another asked one meanwhile: it goes back)
                task.add_done_callback(self._given_back)
            raise
        except Exception as e:  # the receive that follows meets it again, and raises it
            logger.debug("consumer %s: the batch asked ahead: %s", self.member, e)
            return None
        if not pairs:
            return None
        given = its_lease if getattr(pairs, "lease", None) is None else min(its_lease, pairs.lease)  # (--max-lease)
        if (
            lease != its_lease
            or asyncio.get_running_loop().time() - sent > given * PREFETCH_STALE_SHARE
            or (getattr(pairs, "held", None) is not None and not pairs.held())  # (its server may have restarted)
        ):
            await self._given_back_now(pairs)  # (before the receive afresh, which takes them again)
            return None
        if len(pairs) > max_messages:
            kept = pairs[:max_messages]
            try:
                await self._given_back_now(pairs[max_messages:])
            except asyncio.CancelledError:  # (this receive is cancelled: what it would have returned goes back too)
                self._late(kept)
                raise
            return kept
        return pairs

    async def _given_back_now(self, pairs: list) -> None:
        """``pairs`` back to the group, unseen; a cancelled wait leaves the hand-back going on."""
        handing_back = self._late(pairs)
        if handing_back is not None:
            await asyncio.shield(handing_back)

    def _given_back(self, task: asyncio.Future) -> None:
        """A batch asked ahead that no receive takes: back to the group, unseen (its failure is
        not the application's)."""
        if not task.cancelled() and task.exception() is None and task.result():
            self._late(task.result())

    async def _receive_at_server(self, groups: Any, max_messages: int, lease: float, wait: float) -> list:
        # At a server, the call runs in this task (no task of its own, no shield: a turn of the
        # loop less each way); cancelled, its answer is still read, and what it was handed
        # goes back (_late). A close() from another task ends a long poll by cancelling here.
        task = asyncio.current_task()
        assert task is not None
        self._receiving.add(task)
        try:
            pairs = await groups.receive(
                self.queue.name, self.group, self.member, max_messages, lease, wait, late=self._late
            )
        except asyncio.CancelledError:
            if task in self._ended_by_close:
                self._ended_by_close.discard(task)
                if task.uncancel() == 0:  # (cancelled by its own caller too: that stands)
                    return []  # ended by close(): nothing was taken
            raise
        finally:
            self._receiving.discard(task)
        return pairs

    async def _unless_closed(self, groups: Any, pairs: list) -> list[Delivery]:
        """A receive's deliveries; none if the consumer closed meanwhile (from another task),
        whose leave it may have undone: it leaves again, and what it took goes back."""
        if self.closed:
            if not self.queue.closed:  # (closed: its store or connections went, and the leases with them)
                with contextlib.suppress(HQueueError, RuntimeError):  # (as Consumer.receive: the store may
                    await groups.leave(self.queue.name, self.group, self.member)  # go under it, the group too)
            return []
        return list(_deliveries(pairs))

    def _late(self, pairs: list) -> asyncio.Task | None:
        """What a cancelled receive was handed, come after it: back to the group, unseen (even
        after close(): the server may have run the receive after the leave, which did not
        give that back). The hand-back's task (None: the queue closed)."""
        if self.queue.closed:  # (closed: its connections went, and the leases with them)
            return None
        task = asyncio.ensure_future(self._hand_back(pairs))
        self._handing_back.add(task)
        task.add_done_callback(self._handing_back.discard)
        return task

    async def _hand_back(self, pairs: list) -> None:
        rowkeys = _rowkeys(list(_deliveries(pairs)))
        try:
            await self._groups.nack(self.queue.name, self.group, self.member, rowkeys, UNSEEN)
        except Exception as e:  # their leases run out instead
            logger.warning("consumer %s: handing back %d cancelled deliveries: %s", self.member, len(rowkeys), e)

    async def ack(self, deliveries: Receipts) -> int:
        """Mark messages done (as :meth:`Consumer.ack <hqueue.Consumer.ack>`). Prefetching at
        a sole owner, the first ack after a whole batch asks for the next in its call."""
        groups = await self._ready()
        rowkeys = _rowkeys(deliveries)
        asked = self._ask_with_ack if rowkeys else None  # (an empty ack asks nothing: the next one does)
        if asked is None or self._ahead is not None or self.closed:
            return await groups.ack(self.queue.name, self.group, rowkeys)
        self._ask_with_ack = None
        loop = asyncio.get_running_loop()
        batch: asyncio.Future[list] = loop.create_future()  # the ahead batch: a receive or close waits for it
        self._ahead = (batch, asked[1], loop.time())
        try:
            acked, pairs = await groups.ack_asking(
                self.queue.name, self.group, self.member, rowkeys, *asked, late=partial(self._came_ahead, batch)
            )
        except asyncio.CancelledError:
            raise  # (the batch comes to _came_ahead)
        except BaseException:
            self._came_ahead(batch, [])
            raise
        self._came_ahead(batch, pairs or [])
        if self.closed and pairs is not None and not self.queue.closed:  # (closed meanwhile: the server may
            with contextlib.suppress(HQueueError, RuntimeError):  # have taken its leave before this call,
                await groups.leave(self.queue.name, self.group, self.member)  # which counted the member in again)
        return acked

    def _came_ahead(self, batch: asyncio.Future[list], pairs: list) -> None:
        """The batch an ack asked for came: the next receive's (a close gives it back)."""
        if not batch.done():
            batch.set_result(pairs)
        elif pairs:
            self._late(pairs)

    async def nack(self, deliveries: Receipts, *, delay: float | None = None) -> int:
        """Give messages back (as :meth:`Consumer.nack <hqueue.Consumer.nack>`)."""
        check_delay(delay)
        groups = await self._ready()
        return await groups.nack(self.queue.name, self.group, self.member, _rowkeys(deliveries), delay)

    async def extend(self, deliveries: Receipts, *, lease: float | None = None) -> int:
        """Renew the leases this member holds (as :meth:`Consumer.extend <hqueue.Consumer.extend>`)."""
        lease = check_lease(self.lease if lease is None else lease)
        groups = await self._ready()
        return await groups.extend(self.queue.name, self.group, self.member, _rowkeys(deliveries), lease)

    async def dead_letter(self, deliveries: Receipts) -> int:
        """Move messages to ``<queue>.dlq`` now (as :meth:`Consumer.dead_letter <hqueue.Consumer.dead_letter>`)."""
        groups = await self._ready()
        return await groups.dead_letter(self.queue.name, self.group, self.member, _rowkeys(deliveries))

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        """Deliveries as they come, until :meth:`close`. Ack each one. Left early (``break``,
        or the task cancelled in the loop's body), the rest of the batch it was going
        through goes back to the group once the generator is closed, unseen (no attempt counted)."""
        while not self.closed:
            batch = await self.receive(wait=1.0)
            given = 0
            try:
                for delivery in batch:
                    given += 1
                    yield delivery
            finally:
                if given < len(batch) and not self.closed:
                    await self._hand_back_unseen(batch[given:])

    async def give_back(self, deliveries: Receipts) -> int:
        """Give leases back unhandled (as :meth:`Consumer.give_back <hqueue.Consumer.give_back>`)."""
        groups = await self._ready()
        return await groups.nack(self.queue.name, self.group, self.member, _rowkeys(deliveries), UNSEEN)

    async def _hand_back_unseen(self, deliveries: list[Delivery]) -> None:
        try:
            await self.give_back(deliveries)
        except Exception as e:  # their leases run out instead
            logger.warning("consumer %s: handing back %d deliveries not iterated: %s", self.member, len(deliveries), e)

    async def close(self, *, within: float | None = None) -> None:
        """Leave the group: receives other tasks await end (they return ``[]``), hand-backs
        under way end first, then the leases still held go back to the others at once.
        Cancelled meanwhile, the leave goes on (else the member held its leases, closed, to
        their end). ``within``: seconds the leave may take (the queue's close gives 1)."""
        if self.closed:
            return
        self.closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        for task in list(self._receiving):  # a receive's long poll: it would count the member in
            self._ended_by_close.add(task)  # again; what it took goes back with the leave below
            task.cancel()
        if self._handing_back:
            await asyncio.gather(*self._handing_back, return_exceptions=True)
        ahead, self._ahead = self._ahead, None
        if self._groups is not None and not self.queue.closed:  # (closed: its store or connections went,
            leaving = asyncio.ensure_future(  # and the leases with them)
                self._leave(None if ahead is None else ahead[0], within)
            )
            _LEAVING.add(leaving)
            leaving.add_done_callback(_left)
            await asyncio.shield(leaving)

    async def _leave(self, ahead: asyncio.Future | None, within: float | None) -> None:
        """The leave, after the batch asked ahead is answered (the leave gives it back)."""
        if ahead is not None:  # (a paused server: it waits at most PREFETCH_CLOSE_WAIT, and the leave goes on)
            await asyncio.wait(
                [ahead], timeout=PREFETCH_CLOSE_WAIT if within is None else min(PREFETCH_CLOSE_WAIT, within)
            )
            ahead.add_done_callback(self._given_back)  # (come after the leave, past ``within``: back too)
        with contextlib.suppress(GroupNotFound, QueueNotFound, ServerUnavailable):  # (as Consumer.close)
            await self._groups.leave(self.queue.name, self.group, self.member, within=within)

    async def __aenter__(self) -> AsyncConsumer:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncConsumer({self.queue.name!r}, {self.group!r}, member={self.member!r})"


#: Leaves under way whose close was cancelled (held: the loop holds tasks weakly).
_LEAVING: set[asyncio.Future[None]] = set()


def _left(leaving: asyncio.Future[None]) -> None:
    _LEAVING.discard(leaving)
    if not leaving.cancelled() and leaving.exception() is not None:  # (its close's caller raised it, or
        logger.debug("a consumer's leave failed: %s", leaving.exception())  # was cancelled: its leases run out)


async def _heartbeat(ref: weakref.ref[AsyncConsumer], groups: Any) -> None:
    """Tell the group the member is there every HEARTBEAT_INTERVAL, until it closes
    (or is dropped: the task holds it weakly)."""
    while True:
        await asyncio.sleep(HEARTBEAT_INTERVAL)
        consumer = ref()
        if consumer is None or consumer.closed:
            return
        queue, group, member = consumer.queue.name, consumer.group, consumer.member
        del consumer
        try:
            await groups.heartbeat(queue, group, member)
        except Exception as e:  # a server away: the next beat, or the leases end
            logger.debug("consumer %s: heartbeat failed: %s", member, e)
