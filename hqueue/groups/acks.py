"""A consumer group's acks, nacks and dead letters, and how its progress is written
under the partition's fence (a mixin of :class:`~hqueue.groups.service.GroupService`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ..checks import receipt_partition
from ..config import UNSEEN, Durability
from ..deadletters import dead_letter, dead_letter_queue
from ..errors import GroupNotFound, HQueueError, NotPartitionOwner
from ..keys.groups import state_prefix
from ..keys.requests import LANE_LENGTH
from ..message import PackedReceipts, ids_by_partition, messages_from_columns
from .limits import GroupLimits, backoff, check_delay
from .state import MAX_ACKED_AHEAD, GroupState, PartitionState

if TYPE_CHECKING:
    from ..coordination import Coordinator
    from ..engine import Engine

logger = logging.getLogger(__name__)

#: Seconds between log lines about one group's acks of receipts it never handed out.
UNKNOWN_LOG_INTERVAL = 60.0

#: The longest wait (seconds) before a message the dead-letter queue refused is offered to it again.
DEAD_LETTER_RETRY_MAX = 60.0


def dead_letter_backoff(tries: int) -> float:
    """Seconds before a message past its retries is offered to ``<queue>.dlq`` again,
    after ``tries`` refusals: 1 s, doubling, at most :data:`DEAD_LETTER_RETRY_MAX`."""
    return min(DEAD_LETTER_RETRY_MAX, backoff(tries))


class GroupAcks:
    """ack, nack, dead_letter and the writes behind them (call on a GroupService)."""

    engine: Engine
    coordinator: Coordinator
    limits: GroupLimits

    def _group(self, queue: str, name: str) -> GroupState:
        raise NotImplementedError

    def _partition(self, group: GroupState, pid: int) -> PartitionState:
        raise NotImplementedError

    def _unseen(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> None:
        raise NotImplementedError

    def _on_finished(self, queue: str, name: str) -> None:
        raise NotImplementedError

    def _on_freed(self, queue: str, name: str, members: set[str]) -> None:
        raise NotImplementedError

    def _read(self, queue: str, pid: int, message_id: bytes) -> tuple[bytes, bytes] | None:
        raise NotImplementedError

    # -- ack, nack -----------------------------------------------------------------------

    def _owned_partitions(self, group: GroupState, rowkeys: PackedReceipts | Iterable[bytes]) -> dict[int, list[bytes]]:
        """Receipts (12-byte rowkeys, SPEC C1, or the wire's PackedReceipts) as message IDs by
        partition, each once (a receipt named twice is one message), each partition owned here."""
        by_partition = ids_by_partition(rowkeys)
        partitions = self.engine.queue_info(group.queue).partitions
        for pid in by_partition:
            self.coordinator.require_owner(group.queue, receipt_partition(group.queue, partitions, pid))
        return by_partition

    def ack(self, queue: str, name: str, rowkeys: PackedReceipts | Iterable[bytes]) -> int:
        """Finish messages: they are never handed out to the group again. Returns how many were open."""
        return self.ack_receipts(queue, name, rowkeys)[0]

    def ack_receipts(self, queue: str, name: str, rowkeys: PackedReceipts | Iterable[bytes]) -> tuple[int, int]:
        """:meth:`ack`: (how many were open, how many the group never handed out).

        Only a receipt of a message the group handed out and has not finished
        (leased to any member, or waiting to be retried) counts. One below the
        partition's scan cursor that is not open is finished already, or not
        the group's (another topic): nothing to do. One above it was never
        handed out (a made-up receipt, or one from before the partition moved
        to this server): it is ignored, counted in :attr:`GroupState.unknown_acks`,
        and nothing of it is kept, so the group still delivers that message
        (and at least once: a message whose lease was lost with its server
        goes out again).
        """
        group = self._group(queue, name)
        count = unknown = 0
        with group.lock:
            by_partition = self._owned_partitions(group, rowkeys)
            frees, capped = self._may_free(group, by_partition)
            for pid, ids in by_partition.items():
                state = self._partition(group, pid)
                leases, ready, scan = state.leases, state.ready, state.scan
                open_ids = (
                    [i for i in ids if i in leases or i in ready] if ready else list(filter(leases.__contains__, ids))
                )
                if len(open_ids) < len(ids):  # (acked ones after a restart lie above the cursor too)
                    unknown += sum(i >= scan and i not in state.acked for i in ids)
                count += self._acked(group, pid, state, open_ids, let_go=True)
            if unknown:
                self._unknown(group, unknown)
            woken = count > 0 and frees()
        if woken:
            self._on_finished(queue, name)
        elif count and capped:
            self._on_freed(queue, name, capped)
        return count, unknown

    def _may_free(self, group: GroupState, by_partition: dict[int, list[bytes]]) -> tuple[Callable[[], bool], set[str]]:
        """Before acks of ``by_partition`` (under ``group.lock``): whether, once they are done,
        a receive waiting in the group may get something it could not get before (then they
        wake the group's waiting receives), and the members they give room under their
        ``max_member_in_flight`` (then they wake those members' own receives only). Else
        nobody: every ack set every waiting receive looking, and 50 members waiting on a
        drained queue cost the server 5 ms an ack of another (``bench/group_abuse.py``).
        The group's: a partition at ``max_span``; in key order, a key of theirs then held
        by nobody with messages waiting; or a member given room on a queue of several
        partitions, which the members then share out again."""
        limits = self.limits
        capped: set[str] = set()
        if sum(len(state.leases) for state in group.partitions.values()) >= limits.max_member_in_flight:
            holders: set[str] = set()  # (some member may be at its cap: those whose messages these are)
            for pid, ids in by_partition.items():
                leases = self._partition(group, pid).leases
                holders.update(lease[0] for lease in map(leases.get, ids) if lease is not None)
            capped = {m for m in holders if group.held_by(m) >= limits.max_member_in_flight}
            if capped and len(group.members) > 1 and self.engine.queue_info(group.queue).partitions > 1:
                # Back under its cap, a member reads its partitions again: the others' move,
                # and one waiting may get a partition with messages (of one, all read it).
                return (lambda: True), capped
        keyed = []
        for pid, ids in by_partition.items():
            state = self._partition(group, pid)
            if state.in_flight >= limits.max_span:
                return (lambda: True), capped
            affinity = state.affinity
            if affinity is not None:
                keyed.append((affinity, {affinity.keys[i] for i in ids if i in affinity.keys}))
        return (
            lambda: any(
                key not in affinity.holders and (key in affinity.back or affinity.waiting.get(key))
                for affinity, keys in keyed
                for key in keys
            )
        ), capped

    def _unknown(self, group: GroupState, count: int) -> None:
        """Count acks of receipts never handed out; log them at most once a minute per group."""
        group.unknown_acks += count
        now = time.monotonic()
        if now - group.unknown_logged >= UNKNOWN_LOG_INTERVAL:
            group.unknown_logged = now
            logger.warning(
                "group %s of %s: ignored acks of %d receipts it never handed out (%d in all)",
                group.name, group.queue, count, group.unknown_acks,
            )  # fmt: skip

    def nack(
        self, queue: str, name: str, member: str, rowkeys: PackedReceipts | Iterable[bytes], delay: float | None
    ) -> int:
        """Give messages back to be handed out again after ``delay`` (None: the backoff;
        at most ``limits.max_lease``).

        Only leases ``member`` holds count: one that expired and went to
        another member is not the caller's to give back.
        """
        if delay == UNSEEN:
            return self._give_back(queue, name, member, rowkeys)
        delay = check_delay(delay)
        if delay is not None:  # held back no longer than it could be leased (GroupLimits)
            delay = min(delay, self.limits.max_lease)

        def held(state: PartitionState, message_id: bytes) -> bool:
            lease = state.leases.get(message_id)
            return lease is not None and lease[0] == member

        return self._fail_each(queue, name, rowkeys, held, delay, at_once=False)

    def _give_back(self, queue: str, name: str, member: str, rowkeys: PackedReceipts | Iterable[bytes]) -> int:
        """:meth:`nack` with ``UNSEEN``: the leases ``member`` holds go back now, and no failure
        is counted (as a member that leaves gives its leases back): the application never saw
        them, so no retry may be spent, and no message dead-lettered, for them."""
        group = self._group(queue, name)
        now, count = time.monotonic(), 0
        with group.lock:
            for pid, ids in self._owned_partitions(group, rowkeys).items():
                state = self._partition(group, pid)
                back = []
                for message_id in ids:
                    lease = state.leases.get(message_id)
                    if lease is not None and lease[0] == member:
                        state.retry_at(message_id, now)
                        back.append(message_id)
                self._unseen(group, pid, state, back)
                count += len(back)
        if count:
            self._on_finished(queue, name)  # receives waiting for work take them
        return count

    def extend(
        self, queue: str, name: str, member: str, rowkeys: PackedReceipts | Iterable[bytes], lease: float
    ) -> int:
        """Renew leases ``member`` holds: each runs ``lease`` seconds from now (at most
        ``limits.max_lease``), as NATS's "in progress" and SQS's visibility change do.

        For work that takes longer than its lease (a Processor with messages
        waiting behind a slow one). A lease that ran out already, went to
        another member or was finished is not renewed; returns how many were.
        """
        deadline = time.monotonic() + self.limits.lease(lease)
        group = self._group(queue, name)
        count = 0
        with group.lock:
            for pid, ids in self._owned_partitions(group, rowkeys).items():
                count += len(self._partition(group, pid).extend(ids, member, deadline))
        return count

    def dead_letter(self, queue: str, name: str, member: str, rowkeys: PackedReceipts | Iterable[bytes]) -> int:
        """Move messages to ``<queue>.dlq`` now, whatever their retries, and finish them here.

        For a consumer that knows a message will never succeed (the
        :class:`~hqueue.processor.Processor`'s timeouts and its own retries).
        The dead-letter queue is made and written here, by the partition's
        owner, so the caller needs no right to create queues. Every message
        the group handed out and has not finished counts, whoever holds it
        (as :meth:`ack` takes any): one whose lease ran out while ``member``
        worked on it still goes. Returns how many; 0 for those already
        finished (acked, or dead-lettered before) and for receipts the group
        never handed out.
        """
        count = self._fail_each(queue, name, rowkeys, PartitionState.handed_out, None, at_once=True)
        if count:
            logger.debug("group %s of %s: member %s dead-lettered %d messages", name, queue, member, count)
        return count

    def _fail_each(
        self,
        queue: str,
        name: str,
        rowkeys: PackedReceipts | Iterable[bytes],
        counts: Callable[[PartitionState, bytes], bool],
        delay: float | None,
        *,
        at_once: bool,
    ) -> int:
        """:meth:`_failed` for each receipt that ``counts``; how many did."""
        group = self._group(queue, name)
        count = 0
        with group.lock:
            for pid, ids in self._owned_partitions(group, rowkeys).items():
                state = self._partition(group, pid)
                for message_id in ids:
                    if counts(state, message_id):
                        self._failed(group, pid, state, message_id, delay, at_once=at_once)
                        count += 1
        if count:
            self._on_finished(queue, name)
        return count

    def _write(
        self,
        group: GroupState,
        pid: int,
        puts: dict[str, bytes],
        deletes: Sequence[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        let_go: bool = False,
    ) -> None:
        """Write a partition's progress under its fence (call under ``group.lock``). If it
        fails (refused: another server took the partition, or the store failed), what
        is held here may be ahead of the store: drop it, to be read again from the store.

        ``let_go`` (an ack, done with the group's state once it is written): a SYNC_WAL
        write lets ``group.lock`` go once the store has given it its place among the
        partition's writes (storage/fence.py), and takes it again when the write is on
        disk. Meanwhile other members receive and ack, and their acks share its fsync
        (storage/commits.py) where they queued behind the lock one fsync at a time.
        """
        if group.deleted:  # a delete went first: its keys are gone, and nothing may bring them back
            raise GroupNotFound(group.queue, group.name)
        released = False

        def entered() -> None:
            nonlocal released
            group.writing += 1
            group.lock.release()
            released = True

        try:
            try:
                self.engine.writers.write_meta(
                    group.queue, pid, puts, deletes, durability,
                    entered if let_go and durability == Durability.SYNC_WAL else None,
                )  # fmt: skip
            finally:
                if released:
                    self._retake(group)
        except BaseException:  # (an interrupted write was never written either: the state is ahead)
            group.partitions.pop(pid, None)
            raise

    @staticmethod
    def _retake(group: GroupState) -> None:
        """Take ``group.lock`` again after a write that let it go (see :meth:`_write`)."""
        group.lock.acquire()
        group.writing -= 1
        if not group.writing:
            group.written.notify_all()

    def _acked(
        self,
        group: GroupState,
        pid: int,
        state: PartitionState,
        ids: Iterable[bytes],
        *,
        buried: bool = False,
        let_go: bool = False,
    ) -> int:
        """Finish ``ids`` (acked, or dead-lettered when ``buried``: counted in the same write;
        ``let_go``: see :meth:`_write`)."""
        ids = list(ids)
        if not ids:
            return 0
        behind: list[bytes] = []
        if min(ids) >= state.done and (not state.acked or state.acked.isdisjoint(ids)):
            fresh = ids  # the usual case: all of them, with no test per ID in Python
        else:
            fresh = [i for i in ids if i >= state.done and i not in state.acked]
            behind = [i for i in ids if i in state.behind] if state.behind else []
            if not fresh and not behind:
                return 0
        finished = fresh + behind if behind else fresh
        state.finish_many(finished)
        if state.unburied:
            for message_id in finished:
                state.unburied.pop(message_id, None)
        state.acked.update(fresh)
        state.behind.difference_update(behind)
        state.finished += len(finished)
        done = state.lowest_open()
        prefix = state_prefix(group.queue, group.name, pid)
        passed: set[bytes] = set()
        every = False  # every ack kept, these too, is passed: nothing of them to keep
        if done > state.done:
            if not state.acked or max(state.acked) < done:  # every ack is passed: no test per ID
                passed, state.acked, every = state.acked, set(), True
            else:
                passed = {a for a in state.acked if a < done}
                state.acked -= passed
            state.done = done
        puts = {} if every else {f"{prefix}ack/{a.hex()}": b"" for a in fresh if a not in passed}
        deletes = [f"{prefix}ack/{a.hex()}" for a in passed.difference(fresh)]
        deletes += [f"{prefix}behind/{a.hex()}" for a in behind]
        if state.retries:
            deletes += [f"{prefix}retry/{a.hex()}" for a in finished if state.retries.pop(a, None) is not None]
        if state.burying:
            deletes += [f"{prefix}bury/{a.hex()}" for a in finished if state.burying.pop(a, None) is not None]
        if passed:
            puts[f"{prefix}done"] = done
        if len(state.acked) > MAX_ACKED_AHEAD and state.affinity is None and not state.acked_ahead_of_scan:
            # (not while acks read from the store lie ahead of the scan: the jump would drop them)
            self._jump(state, prefix, fresh, puts, deletes)
        if buried:
            state.dead_lettered += len(finished)
            puts[f"{prefix}dead"] = str(state.dead_lettered).encode()
        self._write(group, pid, puts, deletes, self.engine.queue_info(group.queue).durability, let_go=let_go)
        return len(finished)

    @staticmethod
    def _jump(
        state: PartitionState, prefix: str, fresh: list[bytes], puts: dict[str, bytes], deletes: list[str]
    ) -> None:
        """Move the completion cursor to the scan, past the unfinished messages that held it:
        they are kept instead of the acks after them (``behind``, each in flight: at most
        ``max_span``), and the acks go. Adds the writes to ``puts`` and ``deletes``."""
        unfinished = (set(state.leases) | set(state.ready)) - state.behind
        deletes += [f"{prefix}ack/{a.hex()}" for a in state.acked.difference(fresh)]
        for message_id in fresh:
            puts.pop(f"{prefix}ack/{message_id.hex()}", None)
        puts.update({f"{prefix}behind/{i.hex()}": b"" for i in unfinished})
        puts[f"{prefix}done"] = state.scan
        state.behind |= unfinished
        state.acked, state.done = set(), state.scan
        state.open.drop(state.behind)

    def _failed(
        self,
        group: GroupState,
        pid: int,
        state: PartitionState,
        message_id: bytes,
        delay: float | None,
        *,
        at_once: bool = False,
    ) -> None:
        """One failed delivery (a nack or a lease run out): retry later, or dead-letter it
        (after ``max_retries``, or now when ``at_once``).

        Raises:
            HQueueError: ``at_once``, and the dead-letter queue cannot take it now
                (see :meth:`_bury`); NotPartitionOwner while no partition of it is
                served here yet (just made, in a cluster): try again soon.
        """
        if at_once:  # counted only once it goes: one the dead-letter queue refused keeps its retries
            before = state.retries.get(message_id)
            state.retries[message_id] = (before or 0) + 1  # (the attempts its dead-letter note says)
            try:
                self._bury(group, pid, state, message_id, at_once=True)
            except BaseException:
                if before is None:
                    state.retries.pop(message_id, None)
                else:
                    state.retries[message_id] = before
                raise
            return
        retries = self._count_failures(group, pid, state, [message_id])[0]
        self._after_failure(group, pid, state, message_id, retries, delay)

    def _failed_many(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> None:
        """Leases that ended without an ack (run out, or their member is gone): one write for all."""
        if ids:
            for message_id, retries in zip(ids, self._count_failures(group, pid, state, ids), strict=True):
                self._after_failure(group, pid, state, message_id, retries, 0.0)

    def _count_failures(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> list[int]:
        """One more failure for each of ``ids``, written at once; their counts."""
        counts = []
        for message_id in ids:
            counts.append(state.retries.get(message_id, 0) + 1)
            state.retries[message_id] = counts[-1]
        prefix = state_prefix(group.queue, group.name, pid)
        self._write(group, pid, {f"{prefix}retry/{i.hex()}": str(n).encode() for i, n in zip(ids, counts, strict=True)})
        return counts

    def _after_failure(
        self,
        group: GroupState,
        pid: int,
        state: PartitionState,
        message_id: bytes,
        retries: int,
        delay: float | None,
    ) -> None:
        """A message failed for the ``retries``-th time: retry it later, or dead-letter it (past
        ``max_retries``; a member's dead_letter buries at once, in :meth:`_failed`)."""
        if retries <= group.config.max_retries:
            wait = backoff(retries) if delay is None else delay
            state.retry_at(message_id, time.monotonic() + wait)
            return
        self._bury(group, pid, state, message_id, at_once=False)

    def _bury(self, group: GroupState, pid: int, state: PartitionState, message_id: bytes, *, at_once: bool) -> None:
        """Move a message past its retries to ``<queue>.dlq`` and finish it here.

        If the dead-letter queue cannot take it now (disabled, its name illegal,
        no partition of it served here yet, the store failing), the message is
        kept, in flight and not handed out again: the write is tried again after
        a backoff (:func:`dead_letter_backoff`), each time a member of the group
        receives from its partition. No member sees the error; the message
        reaches the dead-letter queue once the write works, and an ack finishes it.

        Raises:
            HQueueError: ``at_once`` (a member asked), and the write failed: the
                member still holds the message's lease, and may try again.
        """
        cell = self._read(group.queue, pid, message_id)
        if cell is not None:
            message = messages_from_columns([cell[0]], [cell[1]])[0]
            try:
                placed = dead_letter(self.engine, self.coordinator, group.queue, pid, message,
                                     by=f"group {group.name}", attempts=state.retries.get(message_id, 0),
                                     lane=self._burial(group, pid, state, message_id))  # fmt: skip
                if placed is None:  # the dead-letter queue has no partition here yet: try again soon
                    raise NotPartitionOwner(dead_letter_queue(group.queue), pid)
            except HQueueError as e:
                if at_once:
                    raise
                self._unburied(group, pid, state, message_id, e)
                return
            group.dead_lettered += 1
            failures = state.retries.get(message_id, 0)
            # A member that asked (a Processor after its own retries) logs it itself, with its
            # count; the group logs the dead letters it decides, after its deliveries.
            logger.log(
                logging.DEBUG if at_once else logging.WARNING,
                "group %s: message %s of %s partition %d %s; moved to %s partition %d as %s",
                group.name, message.id, group.queue, pid,
                "dead-lettered by its member" if at_once else f"failed {failures} deliveries (nacked or lease ran out)",
                dead_letter_queue(group.queue), *placed,
            )  # fmt: skip
            self._acked(group, pid, state, [message_id], buried=True)
            return
        self._acked(group, pid, state, [message_id])

    def _burial(self, group: GroupState, pid: int, state: PartitionState, message_id: bytes) -> bytes:
        """The lane of ``message_id``'s dead letter's idempotent put (requests.py), stored
        before the first try: a process killed between the dead letter's write and
        the record that the message is finished buries it again after the restart, and the
        put is answered with the first one's ID. The lane goes with the message's finish; a
        rewind or a group made again starts without it, and their burials are new dead letters."""
        lane = state.burying.get(message_id)
        if lane is None:
            lane = os.urandom(LANE_LENGTH)
            prefix = state_prefix(group.queue, group.name, pid)
            self._write(group, pid, {f"{prefix}bury/{message_id.hex()}": lane})
            state.burying[message_id] = lane
        return lane

    def _unburied(
        self, group: GroupState, pid: int, state: PartitionState, message_id: bytes, error: Exception
    ) -> None:
        """Keep a message the dead-letter queue refused, to try it again after a backoff."""
        tries = state.unburied[message_id] = state.unburied.get(message_id, 0) + 1
        state.retry_at(message_id, time.monotonic() + dead_letter_backoff(tries))
        now = time.monotonic()
        if now - group.unburied_logged >= UNKNOWN_LOG_INTERVAL:
            group.unburied_logged = now
            logger.warning(
                "group %s of %s: %d messages past their retries wait in partition %d (and maybe others): "
                "%s cannot take them (%s); retrying",
                group.name, group.queue, len(state.unburied), pid, dead_letter_queue(group.queue), error,
            )  # fmt: skip
