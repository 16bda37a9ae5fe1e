"""Consumer groups over hqueue servers (the remote :class:`~hqueue.api.GroupsAPI`).

Each partition's owner keeps the group's state for that partition, so a
receive asks the owners in turn, and acks, nacks and dead letters go to the
owner of each receipt's partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from thriftpy2.thrift import TApplicationException

from ..checks import check_partition, receipt_partition
from ..config import UNSEEN
from ..errors import (
    DeadlineExceeded,
    HQueueError,
    InvalidArgument,
    NoPartitionOwner,
    NotPartitionOwner,
    ServerUnavailable,
)
from ..groups.state import Departures
from ..message import Message, MessageID, checked_receipts, messages_from_columns, rowkeys_by_partition
from ..rpc import operations as op
from ..rpc import packed, wire
from .calls import remote
from .silent import group_call_unanswered

logger = logging.getLogger(__name__)

#: Seconds a member keeps the partitions' owners before reading them again.
LOCATION_REFRESH = 2.0


class RemoteGroups:
    """``engine.groups`` of a :class:`~hqueue.client.engine.RemoteEngine`."""

    def __init__(self, engine: Any) -> None:  # a RemoteEngine (which makes this: typed loosely, no cycle)
        self._engine = engine
        self._turn = -1  # receive asks the owners in turn
        self._locations_checked: dict[str, float] = {}
        #: Members that left here, by (queue, group, member): a receive begun before (in
        #: another thread) asks no owner again.
        self._left = Departures()
        self._ack_receive = AckReceive()

    def _group_locations(self, name: str, fresh: bool = False) -> list[str]:
        """Partition owners for group calls: cached, and read again every few seconds
        (so a member finds servers that joined) or after a failure."""
        now = time.monotonic()
        if fresh or now >= self._locations_checked.get(name, 0.0) + LOCATION_REFRESH:
            self._locations_checked[name] = now
            return self._engine.locations(name, fresh=True)
        return self._engine.locations(name)

    def _owners(self, name: str, fresh: bool = False) -> list[str]:
        return sorted({owner for owner in self._group_locations(name, fresh) if owner})

    def _last_owners(self, name: str) -> list[str]:
        """The owners last read (read now only if never): where a member that leaves holds its
        leases (its receives read them). Not read afresh: a leave soon after a server was
        paused spent its whole deadline on that read, and never went."""
        return sorted({owner for owner in self._engine.locations(name) if owner})

    def _at(self, owner: str, method: str, *args: Any, queue: str, wait: float = 0.0) -> Any:
        """``method`` at the partitions' ``owner``, given up once it owns none of the queue's
        partitions while no answer comes (RemoteEngine._call_watched): a ServerUnavailable
        its caller goes on from at the new owners."""
        named, gone = self._owner_watch(owner, method, queue)
        return self._engine._call_watched(owner, method, *args, queue=queue, wait=wait, named=named, gone=gone)

    def _owner_watch(
        self, owner: str, method: str, queue: str
    ) -> tuple[Callable[[], bool], Callable[[float], HQueueError]]:
        """While ``method`` at ``owner`` gets no answer: whether the owner still owns some of
        the queue's partitions (read afresh), and the failure to give the call up with."""
        return (lambda: owner in self._group_locations(queue, fresh=True)), partial(
            group_call_unanswered, owner, method
        )

    def receive(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        """Ask each owner for work without waiting, then wait at one (in turn) for the rest of ``wait``
        (the call's deadline is the client's ``timeout`` plus ``wait``).

        An owner that cannot be reached (it died: its partitions move) is
        skipped, and the owners are read again: the receive goes on at the
        others and at the partitions' new owners. Only when no owner answers
        until ``owner_timeout`` (within the deadline) does it raise.
        """
        with self._engine.deadline(extra=wait) as deadline:
            return self._receive(queue, group, member, max_messages, lease, wait, deadline)

    def _receive(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float, deadline: float
    ) -> list[tuple[Message, int]]:
        started = time.monotonic()
        waited = started + wait
        retry = _Retry(self._engine, deadline)
        while True:
            if self._left.since((queue, group, member), started):
                return []  # its consumer closed meanwhile (it leaves again: Consumer.receive)
            owners = self._owners(queue, retry.take_fresh())
            if not owners:
                retry.failed(NoPartitionOwner(queue, -1, 0, None))
                continue
            self._turn = (self._turn + 1) % len(owners)
            answered = failed = False
            for index, owner in enumerate(owners[self._turn :] + owners[: self._turn]):
                last = index == len(owners) - 1
                wait_ms = max(0, int((waited - time.monotonic()) * 1000)) if last else 0
                call = ("groupReceive", queue, group, member, max_messages, lease_ms(lease), wait_ms)
                try:
                    deliveries = self._at(owner, *call, queue=queue, wait=wait_ms / 1000)
                except ServerUnavailable as e:
                    retry.noted(e)  # the others go on; the owners are read again next round
                    failed = True
                    continue
                answered = True
                if deliveries.attempts:
                    return received_pairs(deliveries, owner)
            if answered and time.monotonic() >= waited:
                return []
            if failed and answered:  # the long poll may not have happened: pause, within the wait
                retry.pause(until=waited)
            elif failed:
                retry.failed(None)

    def _by_owner(self, queue: str, rowkeys: Sequence[bytes], fresh: bool = False) -> dict[str, list[bytes]]:
        return receipts_by_owner(queue, self._group_locations(queue, fresh), rowkeys, fresh)

    def _receipts_call(
        self, queue: str, rowkeys: Sequence[bytes], method: str, before: tuple = (), after: tuple = ()
    ) -> int:
        """``method(queue, *before, rowkeys, *after)`` at each owner, with the rowkeys of its
        partitions; the sum of what they answer, by one deadline.

        Receipts whose owner cannot be reached or is no longer the owner (a
        failover, a rebalance) go again, to the owners read afresh, until
        ``owner_timeout`` within the deadline. Sending one twice is harmless:
        a new owner never handed the message out, so it does not count it.
        """
        with self._engine.deadline() as deadline:
            retry = _Retry(self._engine, deadline)
            total, left = 0, list(rowkeys)
            while True:
                failed: list[bytes] = []
                try:
                    by_owner = self._by_owner(queue, left, retry.take_fresh())
                except NoPartitionOwner as e:
                    retry.failed(e)
                    continue
                for owner, mine in by_owner.items():
                    for chunk in wire.receipt_chunks(mine):
                        try:
                            args = (queue, *before, wire.pack_rowkeys(chunk), *after)
                            total += self._at(owner, method, *args, queue=queue)
                        except (NotPartitionOwner, ServerUnavailable) as e:
                            retry.noted(e)
                            failed += chunk
                if not failed:
                    return total
                left = failed
                retry.failed(None)

    def ack(self, queue: str, group: str, rowkeys: Sequence[bytes]) -> int:
        return self._receipts_call(queue, rowkeys, "groupAck", (group,))

    def sole_owner(self, queue: str) -> str | None:
        """The one server owning every partition of ``queue``, as last read, if it takes
        ``groupAckReceive`` (:class:`AckReceive`)."""
        return self._ack_receive.sole_owner(self._engine._locations.get(queue))

    def ack_asking(
        self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], max_messages: int, lease: float
    ) -> tuple[int, Received | None]:
        """The ack, asking for the member's next batch in its call (``groupAckReceive``: the ack,
        then a receive that does not wait) at the queue's sole owner, by one deadline: (how
        many were acked, the batch). Where it cannot be made so (several owners, a server
        without the call, an owner that moved or could not be reached) the ack goes on its
        own, following the moves: (how many, None).

        Raises:
            DeadlineExceeded: no answer by the deadline (as any ack's errors).
        """
        with self._engine.deadline():
            made = self._ack_receive.made(
                self._engine._locations.get(queue), queue, group, member, rowkeys, max_messages, lease
            )
            if made is not None:
                owner, call = made
                try:
                    return AckReceive.answer(self._at(owner, *call, queue=queue), owner, self._engine._pools.get(owner))
                except HQueueError as e:
                    self._ack_receive.failed(e, owner)
            return self.ack(queue, group, rowkeys), None

    def nack(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], delay: float | None) -> int:
        delay_ms = -1 if delay is None else -2 if delay == UNSEEN else int(delay * 1000)
        return self._receipts_call(queue, rowkeys, "groupNack", (group, member), (delay_ms,))

    def dead_letter(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes]) -> int:
        return self._receipts_call(queue, rowkeys, "groupDeadLetter", (group, member))

    def extend(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], lease: float) -> int:
        return self._receipts_call(queue, rowkeys, "groupExtend", (group, member), (lease_ms(lease),))

    def leave(self, queue: str, group: str, member: str) -> None:
        self._left.leave((queue, group, member))
        with self._engine.deadline():
            for owner in self._last_owners(queue):
                try:
                    self._at(owner, "groupLeave", queue, group, member, queue=queue)
                except ServerUnavailable:
                    pass  # its leases run out there

    def heartbeat(self, queue: str, group: str, member: str) -> None:
        """At every owner (one that is down is skipped: its partitions move, or it comes back)."""
        with self._engine.deadline():
            for owner in self._owners(queue):
                try:
                    self._at(owner, "groupHeartbeat", queue, group, member, queue=queue)
                except ServerUnavailable:
                    self._locations_checked.pop(queue, None)

    def _each_owner(self, queue: str, method: str, *args: Any, absent: tuple[type[Exception], ...] = ()) -> list[Any]:
        """``method`` at every partition owner, by one deadline (``describe``, ``pending``:
        each owner answers for its own partitions). An owner that cannot be reached (it
        died: its partitions move) makes the whole round go again at the owners read
        afresh, with backoff, until ``owner_timeout`` within the deadline. An owner that
        raises ``absent`` is left out of the answers."""
        with self._engine.deadline() as deadline:
            retry = _Retry(self._engine, deadline)
            answered: dict[str, Any] = {}  # each owner's latest answer, across rounds
            while True:
                try:
                    owners = self._owners(queue, retry.take_fresh())
                    for owner in owners:
                        try:
                            answered[owner] = self._at(owner, method, *args, queue=queue)
                        except absent:  # it had nothing of it (or no more: a delete it answered before)
                            continue
                    return [answered[owner] for owner in owners if owner in answered]
                except ServerUnavailable as e:
                    retry.failed(e)

    names = remote(op.LIST_GROUPS)
    describe = remote(op.DESCRIBE_GROUP)
    pending = remote(op.GROUP_PENDING)
    delete = remote(op.DELETE_GROUP)
    open = remote(op.OPEN_GROUP)

    def set_position(self, queue: str, group: str, partition_id: int | None, start: MessageID) -> None:
        with self._engine.deadline():
            info = self._engine.queue_info(queue, fresh=True)
            pids = range(info.partitions) if partition_id is None else [check_partition(info, partition_id)]
            for pid in pids:
                call = ("setGroupPosition", group, pid, wire.to_tid(start))
                self._engine._owner_call(queue, pid, "replay", *call, idempotent=True)


def lease_ms(seconds: float) -> int:
    """A lease (or a lease's extension) on the wire: whole milliseconds, 1 at least (a lease under
    1 ms that a client took was refused by the server as 0.0 seconds, one the caller never gave)."""
    return max(1, int(seconds * 1000))


class Received(list):
    """A groupReceive's (message, attempt) pairs, and ``lease``: the seconds of lease the
    server gave them (the one asked for, at most its ``--max-lease``; None: a server that
    does not say)."""

    lease: float | None = None
    #: Whether the server may still hold their leases (None: not looked at; a batch that may
    #: be handed out later, held_by: False once a connection to its server broke or was found
    #: closed since, for it may have restarted, and the leases went with it: Pool.held_since).
    held: Callable[[], bool] | None = None


def held_by(pairs: Received, pool: Any) -> Received:
    """``pairs``, just come through ``pool``, with ``held``: whether their server may still
    hold their leases when they are handed out later (``pool.held_since``; no pool: not)."""
    pairs.held = pool.held_since() if pool is not None else (lambda: False)
    return pairs


def received_pairs(deliveries: Any, server: str = "") -> Received:
    """A groupReceive's answer (a TDeliveries) as (message, attempt) pairs.

    Raises:
        ServerUnavailable: the answer is not one (a broken or hostile server's: its messages
            not a packed batch, or not one attempt each); not the caller's InvalidArgument.
    """
    pairs = Received()
    if deliveries.attempts:
        try:
            keys, values = packed.unpack_cells(deliveries.messages or b"")
            if len(keys) != len(deliveries.attempts):
                raise InvalidArgument(f"{len(keys)} messages with {len(deliveries.attempts)} attempts")
        except InvalidArgument as e:
            where = f"hqueue server {server}" if server else "the hqueue server"
            raise ServerUnavailable(f"{where}: a receive's answer is not a batch of messages ({e})") from None
        pairs += zip(messages_from_columns(keys, values), deliveries.attempts, strict=True)
    if isinstance(deliveries.leaseMillis, int) and deliveries.leaseMillis > 0:
        pairs.lease = deliveries.leaseMillis / 1000
    return pairs


class AckReceive:
    """``groupAckReceive`` (a member's ack and its next batch in one call, at the queue's sole
    owner) as a client makes it: when it may be made, the call, and its answer or failure
    (a prefetching member's: :meth:`RemoteGroups.ack_asking`, and the asyncio one's)."""

    def __init__(self) -> None:
        #: Servers that answered UNKNOWN_METHOD (older ones): acks go alone there (for the
        #: handle's life: one upgraded meanwhile gets two calls until the handle is opened again).
        self.without: set[str] = set()

    def sole_owner(self, locations: Sequence[str] | None) -> str | None:
        """The one server owning every partition (``locations``: as last read), if it takes the
        call (None: several owners, none, not read yet, or a server without it)."""
        owners = set(locations or ("",))
        owner = owners.pop() if len(owners) == 1 else ""
        return owner if owner and owner not in self.without else None

    def made(
        self,
        locations: Sequence[str] | None,
        queue: str,
        group: str,
        member: str,
        rowkeys: Sequence[bytes],
        max_messages: int,
        lease: float,
    ) -> tuple[str, tuple] | None:
        """(the owner, the call and its arguments), or None where it cannot be made (not a
        sole owner, as ``locations`` say; more receipts than one call carries): the ack goes
        on its own.

        Raises:
            TypeError, InvalidArgument: the receipts are not 12-byte rowkeys (as an ack's)."""
        owner = self.sole_owner(locations)
        rowkeys = checked_receipts(rowkeys)
        if owner is None or len(rowkeys) > wire.MAX_RECEIPTS:
            return None
        return owner, (
            "groupAckReceive", queue, group, member, wire.pack_rowkeys(rowkeys), max_messages, lease_ms(lease)
        )  # fmt: skip

    @staticmethod
    def answer(deliveries: Any, owner: str, pool: Any) -> tuple[int, Received]:
        """(how many it acked, the next batch) of its answer, come from ``owner`` through
        ``pool`` (whose ``held_since`` says whether the server may still hold the batch's leases)."""
        acked = deliveries.acked
        return (acked if isinstance(acked, int) and acked >= 0 else 0), held_by(received_pairs(deliveries, owner), pool)

    def failed(self, error: HQueueError, owner: str) -> None:
        """A call that failed with ``error``: returns if the ack is to go on its own (an owner
        that moved or could not be reached: the ack follows the moves and tries again, as
        any ack; a server without the call, nothing done there), else raises it (a deadline
        passed among them: an ack on its own would have none left)."""
        if isinstance(error, (NotPartitionOwner, ServerUnavailable)) and not isinstance(error, DeadlineExceeded):
            logger.debug("groupAckReceive at %s: %s (acked on its own)", owner, error)
            return
        cause = error.__cause__
        if not (isinstance(cause, TApplicationException) and cause.type == TApplicationException.UNKNOWN_METHOD):
            raise error
        self.without.add(owner)  # (an older server: from now on, two calls there)


def receipts_by_owner(
    queue: str, locations: Sequence[str], rowkeys: Sequence[bytes], fresh: bool = False
) -> dict[str, list[bytes]]:
    """``rowkeys`` by the owner of their partition (``locations``: each partition's, read
    afresh if ``fresh``).

    Raises:
        NoPartitionOwner: a partition has no owner now.
        TypeError, InvalidArgument: the receipts are not a list of 12-byte rowkeys (as in
            process), or, ``fresh``, one names a partition the queue does not have.
    """
    by_owner: dict[str, list[bytes]] = {}
    for pid, mine in rowkeys_by_partition(checked_receipts(rowkeys)).items():
        owner = locations[pid] if pid < len(locations) else ""
        if not owner:
            if fresh:
                receipt_partition(queue, len(locations), pid)
            raise NoPartitionOwner(queue, pid, 0, None)
        by_owner.setdefault(owner, []).extend(mine)
    return by_owner


class RetryState:
    """A group call's retries while partitions move: the owners are read afresh after a
    failure, with a backoff (20 ms doubling, at most 1 s), until ``owner_timeout`` or the
    call's deadline, whichever comes first; then the last problem is raised. The waits
    are the subclass's: :class:`_Retry` sleeps, the asyncio client's awaits."""

    def __init__(self, engine: Any, deadline: float, now: float) -> None:
        self.give_up = min(deadline, now + engine.owner_timeout)
        self.delay, self.fresh = 0.02, False
        self.problem: HQueueError | None = None

    def noted(self, problem: HQueueError) -> None:
        """A call failed; the owners are read again before the next."""
        if isinstance(problem, DeadlineExceeded):
            raise problem
        self.problem, self.fresh = problem, True

    def take_fresh(self) -> bool:
        """Whether the owners must be read again (once per failure)."""
        fresh, self.fresh = self.fresh, False
        return fresh

    def next_wait(self, problem: HQueueError | None, now: float) -> float:
        """After a failed round: the wait before the next; raise the last problem once it
        is time to give up."""
        if problem is not None:
            self.noted(problem)
        if now >= self.give_up:
            assert self.problem is not None
            raise self.problem
        return self.backoff(self.give_up, now)

    def backoff(self, until: float, now: float) -> float:
        """The backoff's next wait, ending by ``until`` at the latest."""
        pause = max(0.0, min(self.delay, until - now))
        logger.info("group call: %s; reading the owners again in %.2fs", self.problem, pause)
        self.delay = min(self.delay * 2, 1.0)
        return pause


class _Retry(RetryState):
    """:class:`RetryState`, sleeping."""

    def __init__(self, engine: Any, deadline: float) -> None:
        super().__init__(engine, deadline, time.monotonic())

    def failed(self, problem: HQueueError | None) -> None:
        """Wait before trying again; raise the last problem once it is time to give up."""
        time.sleep(self.next_wait(problem, time.monotonic()))

    def pause(self, until: float) -> None:
        """The backoff's next wait, ending by ``until`` at the latest."""
        time.sleep(self.backoff(until, time.monotonic()))
