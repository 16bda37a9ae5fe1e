"""Consumer groups over hqueue servers, awaitable: the routing of
:class:`~hqueue.client.groups.RemoteGroups` (the groups themselves live in the
servers, :mod:`hqueue.groups`). A receive asks each partition owner in turn,
long-polling at one; acks, nacks and dead letters go to each receipt's owner,
following moves until ``owner_timeout`` within the call's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ...checks import check_partition
from ...client.groups import (
    LOCATION_REFRESH,
    AckReceive,
    Received,
    RetryState,
    held_by,
    lease_ms,
    receipts_by_owner,
    received_pairs,
)
from ...client.silent import group_call_unanswered
from ...config import UNSEEN
from ...errors import HQueueError, NoPartitionOwner, NotPartitionOwner, ServerUnavailable
from ...message import Message, MessageID
from ...rpc import operations as op
from ...rpc import wire
from .calls import aremote

logger = logging.getLogger(__name__)


class _Orphan:
    """A member's receive cancelled while its call waited at ``owner``: the answer to come."""

    __slots__ = ("owner", "lease", "late", "answered", "pairs", "waiters", "ended")

    def __init__(self, owner: str, lease: float, late: Callable[[list[tuple[Message, int]]], None] | None) -> None:
        self.owner, self.lease, self.late = owner, lease, late
        self.answered = asyncio.Event()
        self.pairs: list[tuple[Message, int]] = []
        self.waiters = 0  # receives waiting for it
        self.ended = False  # its answer taken, or given back


class AsyncRemoteGroups:
    """``engine.groups`` of an :class:`~hqueue.aio.client.engine.AsyncRemoteEngine`."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._turn = -1
        self._locations_checked: dict[str, float] = {}
        #: A member's receive cancelled while its call was under way, by (queue, group, member).
        self._orphans: dict[tuple[str, str, str], _Orphan] = {}
        self._ack_receive = AckReceive()

    async def _group_locations(self, name: str, fresh: bool = False) -> list[str]:
        now = asyncio.get_running_loop().time()
        if fresh or now >= self._locations_checked.get(name, 0.0) + LOCATION_REFRESH:
            self._locations_checked[name] = now
            return await self._engine.locations(name, fresh=True)
        return await self._engine.locations(name)

    async def _owners(self, name: str, fresh: bool = False) -> list[str]:
        return sorted({owner for owner in await self._group_locations(name, fresh) if owner})

    async def _last_owners(self, name: str) -> list[str]:
        """The owners last read, not read afresh (as the blocking client's ``_last_owners``)."""
        return sorted({owner for owner in await self._engine.locations(name) if owner})

    async def _at(self, owner: str, method: str, *args: Any, queue: str, wait: float = 0.0, late: Any = None) -> Any:
        """``method`` at the partitions' ``owner``, given up once it owns none of the queue's
        partitions while no answer comes (as the blocking client's ``_at``; an answer read
        after goes to ``late``: a receive's deliveries are given back)."""

        async def named() -> bool:
            return owner in await self._group_locations(queue, fresh=True)

        return await self._engine._call_watched(
            owner, method, *args, queue=queue, wait=wait, late=late,
            named=named, gone=partial(group_call_unanswered, owner, method),
        )  # fmt: skip

    async def receive(
        self,
        queue: str,
        group: str,
        member: str,
        max_messages: int,
        lease: float,
        wait: float,
        late: Callable[[list[tuple[Message, int]]], None] | None = None,
    ) -> list[tuple[Message, int]]:
        """As the blocking client's: each owner without waiting, then a long poll at one (in
        turn) for the rest of ``wait``; the deadline is the client's ``timeout`` plus ``wait``.

        Cancelled while a call was under way, that call's answer is still read. While it
        waits at its server, the member's next receive waits for it there rather than
        long-polling again (it asks the other owners, without waiting, first; only if it asks
        the same lease, which the server gave what it hands out): cancelled
        receives (``wait_for(receive(wait=60), 1)`` in a loop) cost one call under way, not
        one each, which had taken every connection of the handle. What an orphaned call
        is handed and no receive takes goes to ``late`` (given back)."""
        key = (queue, group, member)
        with self._engine.deadline(extra=wait) as deadline:
            loop = asyncio.get_running_loop()
            waited = loop.time() + wait
            orphan = self._orphans.get(key)
            if orphan is not None and orphan.lease != lease:  # its messages' leases are not the ones asked
                orphan = None  # (it is given back when it is answered)
            retry = _Retry(self._engine, deadline)
            while True:
                owners = await self._owners(queue, retry.take_fresh())
                if not owners:
                    await retry.failed(NoPartitionOwner(queue, -1, 0, None))
                    continue
                self._turn = (self._turn + 1) % len(owners)
                answered = failed = False
                turn = owners[self._turn :] + owners[: self._turn]
                waiting_for = orphan if orphan is not None and orphan.owner in owners else None
                if waiting_for is not None:  # asked already: its answer last, and no other long poll
                    turn.remove(waiting_for.owner)
                for index, owner in enumerate(turn):
                    last = waiting_for is None and index == len(turn) - 1
                    wait_ms = max(0, int((waited - loop.time()) * 1000)) if last else 0
                    call = ("groupReceive", queue, group, member, max_messages, lease_ms(lease), wait_ms)
                    arrived = partial(self._orphaned, key, owner, lease, late)
                    try:
                        deliveries = await self._at(owner, *call, queue=queue, wait=wait_ms / 1000, late=arrived)
                    except ServerUnavailable as e:
                        retry.noted(e)
                        failed = True
                        continue
                    answered = True
                    if deliveries.attempts:  # (held: a batch asked ahead may be handed out after a restart)
                        return held_by(received_pairs(deliveries, owner), self._engine._pools.get(owner))
                if waiting_for is not None:
                    pairs = await self._adopt(key, waiting_for, max_messages, waited)
                    if pairs or loop.time() >= waited:
                        return pairs
                    orphan = None  # it ended with none (or another receive took it): long-poll again
                    continue
                if answered and loop.time() >= waited:
                    return []
                if failed and answered:
                    await retry.pause(until=waited)
                elif failed:
                    await retry.failed(None)

    def _orphaned(
        self, key: tuple[str, str, str], owner: str, lease: float, late: Any, reading: asyncio.Future[Any]
    ) -> None:
        """A receive's call cancelled under way, its answer read by ``reading``: the member's
        orphan (its next receive asking the same ``lease`` waits for it), or, if it has one
        already, given back as it comes."""
        orphan = _Orphan(owner, lease, late)
        registered = self._orphans.get(key)
        if registered is None or registered.lease != lease:  # (one asking another lease: the latest counts)
            self._orphans[key] = orphan
        reading.add_done_callback(partial(self._orphan_answered, key, orphan))

    def _orphan_answered(self, key: tuple[str, str, str], orphan: _Orphan, reading: asyncio.Future[Any]) -> None:
        answer = None if reading.cancelled() or reading.exception() is not None else reading.result()
        try:
            orphan.pairs = received_pairs(answer) if answer is not None else []
        except Exception:  # (an answer it cannot read: those leases run out instead)
            logger.exception("the answer to a cancelled receive of %s could not be read", key)
        orphan.answered.set()
        if not orphan.waiters:  # no receive waits for it: it ends here
            self._orphan_ended(key, orphan)

    def _orphan_ended(self, key: tuple[str, str, str], orphan: _Orphan, taken: int = 0) -> None:
        """An orphan's answer is in: no longer the member's orphan; what it was handed
        beyond the first ``taken`` goes back."""
        if self._orphans.get(key) is orphan:
            del self._orphans[key]
        orphan.ended = True
        rest, orphan.pairs = orphan.pairs[taken:], []
        if rest and orphan.late is not None:
            orphan.late(rest)

    async def _adopt(
        self, key: tuple[str, str, str], orphan: _Orphan, max_messages: int, waited: float
    ) -> list[tuple[Message, int]]:
        """Up to ``max_messages`` of what the member's orphaned receive is handed, waiting
        for it until ``waited`` (loop time); the rest goes back. (Receives waiting for one
        orphan at once: the first to wake takes it. Cancelled, the last one gives it back.)"""
        orphan.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(waited):
                    await orphan.answered.wait()
            if not orphan.answered.is_set() or orphan.ended:
                return []
            taken = min(max_messages, len(orphan.pairs))
            pairs = orphan.pairs[:taken]
            self._orphan_ended(key, orphan, taken)
            return pairs
        finally:
            orphan.waiters -= 1
            if orphan.answered.is_set() and not orphan.ended and not orphan.waiters:
                self._orphan_ended(key, orphan)  # (cancelled: all of it goes back)

    async def _receipts_call(
        self, queue: str, rowkeys: Sequence[bytes], method: str, before: tuple = (), after: tuple = ()
    ) -> int:
        """``method(queue, *before, rowkeys, *after)`` at each receipt's owner; the sum of the answers."""
        with self._engine.deadline() as deadline:
            retry = _Retry(self._engine, deadline)
            total, left = 0, list(rowkeys)
            while True:
                fresh = retry.take_fresh()
                locations = await self._group_locations(queue, fresh)
                try:
                    by_owner = receipts_by_owner(queue, locations, left, fresh)
                except NoPartitionOwner as e:
                    await retry.failed(e)
                    continue
                failed: list[bytes] = []
                for owner, mine in by_owner.items():
                    for chunk in wire.receipt_chunks(mine):
                        try:
                            args = (queue, *before, wire.pack_rowkeys(chunk), *after)
                            total += await self._at(owner, method, *args, queue=queue)
                        except (NotPartitionOwner, ServerUnavailable) as e:
                            retry.noted(e)
                            failed += chunk
                if not failed:
                    return total
                left = failed
                await retry.failed(None)

    async def ack(self, queue: str, group: str, rowkeys: Sequence[bytes]) -> int:
        return await self._receipts_call(queue, rowkeys, "groupAck", (group,))

    def sole_owner(self, queue: str) -> str | None:
        """The one server owning every partition of ``queue``, as last read, if it takes
        ``groupAckReceive`` (:class:`~hqueue.client.groups.AckReceive`)."""
        return self._ack_receive.sole_owner(self._engine._locations.get(queue))

    async def ack_asking(
        self,
        queue: str,
        group: str,
        member: str,
        rowkeys: Sequence[bytes],
        max_messages: int,
        lease: float,
        late: Callable[[list[tuple[Message, int]]], None],
    ) -> tuple[int, Received | None]:
        """The ack, asking for the member's next batch in its call at the queue's sole owner
        (as the blocking client's :meth:`~hqueue.client.groups.RemoteGroups.ack_asking`).
        ``late`` gets the batch once none is to be returned: none (the call not sent, or no
        answer), or what a call cut short (cancelled, or given up as its owner moved)
        brought, read after; maybe both.

        Raises:
            DeadlineExceeded: no answer by the deadline (as any ack's errors).
        """
        with self._engine.deadline():
            made = self._ack_receive.made(
                self._engine._locations.get(queue), queue, group, member, rowkeys, max_messages, lease
            )
            if made is not None:
                owner, call = made
                reading: list[asyncio.Future[Any]] = []
                pool = self._engine._pools.get(owner)
                held = pool.held_since() if pool is not None else None  # (before the call: see _late_batch)

                def answer_later(task: asyncio.Future[Any]) -> None:
                    reading.append(task)
                    task.add_done_callback(partial(_late_batch, late, owner, held))

                try:
                    deliveries = await self._at(owner, *call, queue=queue, late=answer_later)
                    return AckReceive.answer(deliveries, owner, self._engine._pools.get(owner))
                except asyncio.CancelledError:
                    if not reading:  # cancelled before it was sent: no batch comes
                        late([])
                    raise
                except HQueueError as e:
                    self._ack_receive.failed(e, owner)
            late([])  # (no batch comes with this ack)
            return await self.ack(queue, group, rowkeys), None

    async def nack(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], delay: float | None) -> int:
        delay_ms = -1 if delay is None else -2 if delay == UNSEEN else int(delay * 1000)
        return await self._receipts_call(queue, rowkeys, "groupNack", (group, member), (delay_ms,))

    async def dead_letter(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes]) -> int:
        return await self._receipts_call(queue, rowkeys, "groupDeadLetter", (group, member))

    async def extend(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], lease: float) -> int:
        return await self._receipts_call(queue, rowkeys, "groupExtend", (group, member), (lease_ms(lease),))

    async def leave(self, queue: str, group: str, member: str, *, within: float | None = None) -> None:
        """Leave at each owner (``within``: seconds it may take, else the client's timeout)."""
        engine = self._engine
        with engine.deadline() if within is None else engine.deadline_at(asyncio.get_running_loop().time() + within):
            for owner in await self._last_owners(queue):
                try:
                    await self._at(owner, "groupLeave", queue, group, member, queue=queue)
                except ServerUnavailable:
                    pass  # its leases run out there

    async def heartbeat(self, queue: str, group: str, member: str) -> None:
        with self._engine.deadline():
            for owner in await self._owners(queue):
                try:
                    await self._at(owner, "groupHeartbeat", queue, group, member, queue=queue)
                except ServerUnavailable:
                    self._locations_checked.pop(queue, None)

    async def _each_owner(
        self, queue: str, method: str, *args: Any, absent: tuple[type[Exception], ...] = ()
    ) -> list[Any]:
        """``method`` at every partition owner, by one deadline, following the owners as
        partitions move (as the blocking client's ``_each_owner``)."""
        with self._engine.deadline() as deadline:
            retry = _Retry(self._engine, deadline)
            answered: dict[str, Any] = {}  # each owner's latest answer, across rounds
            while True:
                try:
                    owners = await self._owners(queue, retry.take_fresh())
                    for owner in owners:
                        try:
                            answered[owner] = await self._at(owner, method, *args, queue=queue)
                        except absent:  # it had nothing of it (or no more: a delete it answered before)
                            continue
                    return [answered[owner] for owner in owners if owner in answered]
                except ServerUnavailable as e:
                    await retry.failed(e)

    names = aremote(op.LIST_GROUPS)
    describe = aremote(op.DESCRIBE_GROUP)
    pending = aremote(op.GROUP_PENDING)
    delete = aremote(op.DELETE_GROUP)
    open = aremote(op.OPEN_GROUP)

    async def set_position(self, queue: str, group: str, partition_id: int | None, start: MessageID) -> None:
        with self._engine.deadline():
            info = await self._engine.queue_info(queue, fresh=True)
            pids = range(info.partitions) if partition_id is None else [check_partition(info, partition_id)]
            for pid in pids:
                call = ("setGroupPosition", group, pid, wire.to_tid(start))
                await self._engine.owner_call(queue, pid, "replay", *call, idempotent=True)


def _late_batch(
    late: Callable[[list[tuple[Message, int]]], None],
    owner: str,
    held: Callable[[], bool] | None,
    reading: asyncio.Future[Any],
) -> None:
    """A cancelled groupAckReceive's answer, read after: its batch to ``late`` (none if no
    answer came, or one it cannot read: those leases run out), ``held`` as the pool said
    before the call (taken now, it could miss a restart other tasks saw while the answer came
    in: the test of a cancelled ack then a restart handed the batch out, once in 4 CI runs)."""
    answer = None if reading.cancelled() or reading.exception() is not None else reading.result()
    pairs: list[tuple[Message, int]] = []
    try:
        if answer is not None:
            pairs = received_pairs(answer, owner)
            pairs.held = held if held is not None else (lambda: False)
    except Exception as e:  # (a broken or hostile server's answer: late gets none all the same)
        logger.warning("the batch of a cancelled ack at %s: %s", owner, e)
    late(pairs)


class _Retry(RetryState):
    """:class:`~hqueue.client.groups.RetryState`, sleeping on the loop."""

    def __init__(self, engine: Any, deadline: float) -> None:
        super().__init__(engine, deadline, asyncio.get_running_loop().time())

    async def failed(self, problem: HQueueError | None) -> None:
        await asyncio.sleep(self.next_wait(problem, asyncio.get_running_loop().time()))

    async def pause(self, until: float) -> None:
        await asyncio.sleep(self.backoff(until, asyncio.get_running_loop().time()))
