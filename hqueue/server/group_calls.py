"""The consumer-group calls of HQueueService (SPEC X2, X3), served by each partition's owner.

A member's receive, heartbeat and nack tie it to the connection they came
on: when the last of its connections to this server closes (its process
died), the member is gone and its leases end at once (groups/members.py).
"""

from __future__ import annotations

import logging
from typing import Any

from ..auth import MANAGE
from ..config import UNSEEN
from ..errors import HQueueError, InvalidArgument
from ..groups.limits import check_lease, check_max_messages, check_member, check_wait
from ..groups.service import GroupService
from ..rpc import operations as op
from ..rpc import packed, wire
from ..rpc.connections import PeerGone, answer_slot_aside, current_connection, refuse_if_peer_gone
from ..rpc.loop import may_block, on_loop
from .calls import Calls, handler, served

logger = logging.getLogger(__name__)


class GroupCalls(Calls):
    """openGroup, groupReceive, groupAck, groupAckReceive, groupNack, groupDeadLetter, groupLeave,
    groupHeartbeat, listGroups, describeGroup, setGroupPosition, deleteGroup."""

    #: Set by the server once its coordinator runs.
    service: GroupService | None = None

    @property
    def groups(self) -> GroupService:
        if self.service is None:
            raise HQueueError("the server is starting: consumer groups are not served yet")
        return self.service

    openGroup = handler(op.OPEN_GROUP)
    listGroups = handler(op.LIST_GROUPS)
    describeGroup = handler(op.DESCRIBE_GROUP)
    groupPending = handler(op.GROUP_PENDING)
    deleteGroup = handler(op.DELETE_GROUP)

    def _as(self, queue: str, group: str, member: Any, what: str) -> None:
        """A call made as ``member``: by the token it called with first (while it is a member
        here: connected, or in its grace after its last connection closed), or by one that
        manages the group. Naming another token's member,
        a nack, a short extend, a dead-letter or a leave would send its messages out again,
        and a heartbeat or receive would keep it from being found gone."""
        holder = self.groups.holder(queue, group, member) if isinstance(member, str) else None
        if holder is not None and holder != self.guard.principal().name:
            self.guard.authorize(MANAGE, f"{what} another token's member {member!r} in", queue, ("group", group))

    def _attend(self, queue: str, group: str, member: str) -> None:
        """Tie ``member`` to the connection this call came on (once per connection)."""
        connection = current_connection()
        groups = self.groups
        if connection is not None and isinstance(member, str) and member:
            if groups.connected(connection.id, queue, group, member, self.guard.principal().name):
                connection.on_close.append(lambda: groups.disconnected(connection.id, queue, group, member))

    @served("consumer", inline=True)
    def groupReceive(
        self, queue: str, group: str, member: str, maxMessages: int, leaseMillis: int, waitMillis: int
    ) -> Any:
        if not all(isinstance(v, int) for v in (maxMessages, leaseMillis, waitMillis)):
            raise TypeError("'maxMessages', 'leaseMillis' and 'waitMillis' must be ints")
        wait = check_wait(waitMillis / 1000)  # refused here as on a worker, before any effect
        self._may_receive(queue, group, member)
        return self._receive(queue, group, member, maxMessages, leaseMillis, wait)

    def _may_receive(self, queue: str, group: str, member: str) -> None:
        """Before a receive takes anything (a groupAckReceive's: before its ack): the caller
        may receive as ``member``, its client is still there, and a receive that must run on
        a worker goes there now."""
        self._as(queue, group, member, "receive as")
        refuse_if_peer_gone()  # the member gave up on this receive (a paused server read it late): lease nothing
        if on_loop() and self.groups.off_loop(queue, group):
            may_block()  # rows of other topics read through (no topic index), or many topics: on a worker

    def _receive(self, queue: str, group: str, member: str, maxMessages: int, leaseMillis: int, wait: float) -> Any:
        # On the event loop, what is there now; none there, the wait goes to a worker.
        waits = 0 if on_loop() else wait
        try:
            keys, values, attempts = self.groups.receive_columns(
                queue, group, member, maxMessages, leaseMillis / 1000, waits, idle=answer_slot_aside
            )
        except PeerGone:  # it waited, and its client gave up meanwhile: nothing was leased
            self._attend(queue, group, member)  # (its connection's close finds the member gone)
            raise
        if not keys and waits < wait:
            may_block()  # before _attend: the worker's run ties the member
        self._attend(queue, group, member)  # before the answer: a close after it finds the member
        if keys:
            self.metrics.group_received.inc((queue, group), len(keys))
        given = self.groups.limits.lease(leaseMillis / 1000)  # (what receive_columns gave)
        return wire.T.TDeliveries(messages=packed.pack(keys, values), attempts=attempts, leaseMillis=int(given * 1000))

    @served("consumer", inline=True)
    def groupAck(self, queue: str, group: str, rowkeys: bytes) -> int:
        return self._ack(queue, group, rowkeys)

    def _ack(self, queue: str, group: str, rowkeys: bytes) -> int:
        count, unknown = self.groups.ack_receipts(queue, group, wire.packed_receipts(rowkeys))
        self.metrics.group_acked.inc((queue, group), count)
        if unknown:  # the IDL's answer is one count: the ignored ones are counted here (and logged)
            self.metrics.group_unknown_acks.inc((queue, group), unknown)
        return count

    @served("consumer", inline=True)
    def groupAckReceive(
        self, queue: str, group: str, member: str, rowkeys: bytes, maxMessages: int, leaseMillis: int
    ) -> Any:
        """groupAck, then groupReceive without waiting: a prefetching member's ack and its next
        batch in one call. Everything the receive checks is checked before the ack; once the
        ack is done, a receive that fails answers no messages (the next receive meets it)."""
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (maxMessages, leaseMillis)):
            raise TypeError("'maxMessages' and 'leaseMillis' must be ints")
        check_member(member)
        check_max_messages(maxMessages)
        check_lease(leaseMillis / 1000)
        self._may_receive(queue, group, member)  # (a move to a worker: before the ack, so it is not done twice)
        acked = self._ack(queue, group, rowkeys)
        try:
            deliveries = self._receive(queue, group, member, maxMessages, leaseMillis, 0.0)
        except HQueueError as e:  # (PeerGone among them: an answer no one reads)
            logger.debug("groupAckReceive %s/%s: acked %d, the receive after failed: %s", queue, group, acked, e)
            deliveries = wire.T.TDeliveries(messages=b"", attempts=[])
        deliveries.acked = acked
        return deliveries

    @served("consumer", inline=True)
    def groupNack(self, queue: str, group: str, member: str, rowkeys: bytes, delayMillis: int) -> int:
        if not isinstance(delayMillis, int):
            raise TypeError("'delayMillis' must be an int (-1: the backoff; -2: handed back unseen)")
        delay = UNSEEN if delayMillis == -2 else None if delayMillis < 0 else delayMillis / 1000
        self._as(queue, group, member, "nack the messages of")
        count = self.groups.nack(queue, group, member, wire.packed_receipts(rowkeys), delay)
        self._attend(queue, group, member)
        if delay != UNSEEN:  # (given back unseen: no nack the application made)
            self.metrics.group_nacked.inc((queue, group), count)
        return count

    @served("consumer")
    def groupExtend(self, queue: str, group: str, member: str, rowkeys: bytes, leaseMillis: int) -> int:
        if not isinstance(leaseMillis, int) or isinstance(leaseMillis, bool):
            raise TypeError("'leaseMillis' must be an int")
        self._as(queue, group, member, "extend the leases of")
        count = self.groups.extend(queue, group, member, wire.packed_receipts(rowkeys), leaseMillis / 1000)
        self._attend(queue, group, member)
        return count

    @served("consumer")
    def groupDeadLetter(self, queue: str, group: str, member: str, rowkeys: bytes) -> int:
        self._as(queue, group, member, "dead-letter the messages of")
        return self.groups.dead_letter(queue, group, member, wire.packed_receipts(rowkeys))

    @served("consumer")
    def groupLeave(self, queue: str, group: str, member: str) -> None:
        """A member leaves by itself (its own token); another token's member is made to
        leave only by a token that manages the group (its leases would go out again)."""
        self._as(queue, group, member, "end")
        self.groups.leave(queue, group, member)

    @served("consumer")
    def groupHeartbeat(self, queue: str, group: str, member: str) -> None:
        self._as(queue, group, member, "heartbeat as")
        self.groups.heartbeat(queue, group, member)
        self._attend(queue, group, member)

    @served(MANAGE, named=(1, "group"))
    def setGroupPosition(self, queue: str, group: str, partitionID: int, startID: Any) -> None:
        if startID is None:
            raise InvalidArgument("'startID' is required")
        self.groups.set_position(queue, group, partitionID, wire.from_tid(startID))
