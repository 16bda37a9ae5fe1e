"""A consumer group's members: who is there, and what a member that is gone leaves
behind (a mixin of :class:`~hqueue.groups.service.GroupService`).

A member is heard from when it calls ``receive`` or ``heartbeat`` (the
:class:`~hqueue.consumer.Consumer` heartbeats every second while it is open).
Two timestamps per member, two meanings:

* the members that called ``receive`` in the last ``member_timeout`` seconds
  share the partitions (a member that stops receiving, but is still open,
  leaves its partitions to the others);
* a member that made no call at all for ``member_timeout`` seconds (10 by
  default: ``hqueue server --member-timeout``), or none for
  :data:`GONE_GRACE` seconds after its last connection to this server
  closed (the process died: kill -9 closes its sockets), is *gone*: its
  leases end then, as if they ran out, each counting as a failed delivery
  (so a message that kills every consumer that takes it still reaches the
  dead-letter queue), instead of after the lease. The grace is for members
  that live on: a client's pool may close an idle connection the member
  called on (the asyncio client keeps 16 idle), and a live member calls
  again, on another, within a heartbeat or two; its leave may also come
  after its connection's close.

A member that ``leave``\\ s gives its leases back without counting them as
failures. On the embedded store the members live in the process that has
the store open: when it dies, so does every lease.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from .limits import GroupLimits, check_member
from .state import GroupState, PartitionState

#: Members one connection is watched for; more (made-up names) are left to ``member_timeout``.
MAX_MEMBERS_PER_CONNECTION = 1000
#: Seconds a member whose last connection closed has to call again (a heartbeat, on another
#: connection) before it is gone: two heartbeats and a half (limits.HEARTBEAT_INTERVAL).
GONE_GRACE = 2.5


class GroupMembers:
    """heartbeat, leave, and members that are gone (call on a GroupService)."""

    limits: GroupLimits
    _lock: threading.Lock
    _groups: dict[tuple[str, str], GroupState]

    def _group(self, queue: str, name: str) -> GroupState:
        raise NotImplementedError

    def _failed_many(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> None:
        raise NotImplementedError

    def _unseen(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> None:
        raise NotImplementedError

    def _on_finished(self, queue: str, name: str) -> None:
        raise NotImplementedError

    def _init_members(self) -> None:
        #: A server's stop under way: the connections it closes are not their members' going.
        self.draining = False
        #: (queue, group, member) -> the connections it called on that are still open.
        self._connections: dict[tuple[str, str, str], set[int]] = {}
        #: (queue, group, member) -> the token it first called with, while it has connections here.
        self._holders: dict[tuple[str, str, str], str] = {}
        self._members_on: Counter[int] = Counter()

    def heartbeat(self, queue: str, name: str, member: str) -> None:
        """``member`` is still there (it is not gone while it calls this at least every ``member_timeout``)."""
        check_member(member)
        group = self._group(queue, name)
        with group.lock:
            group.seen[member] = time.monotonic()

    def leave(self, queue: str, name: str, member: str) -> None:
        """``member`` stops: its leases are given back at once, without counting as failures."""
        group = self._group(queue, name)
        now = time.monotonic()
        with group.lock:
            group.members.pop(member, None)
            group.seen.pop(member, None)
            group.left.leave(member)
            self._let_go(queue, name, member)
            for pid, state in group.partitions.items():
                back = state.leases_of(member)
                for message_id in back:
                    state.retry_at(message_id, now)
                self._unseen(group, pid, state, back)
            # Its waiting receives wake, and end; the others take its leases. Under the lock, as
            # delete() forgets the group's generation: a deleted group's is not made again.
            if not group.deleted:
                self._on_finished(queue, name)

    # -- gone -----------------------------------------------------------------------------

    def _forget_silent(self, group: GroupState, now: float) -> None:
        """End the leases of members silent past ``member_timeout`` (call under ``group.lock``)."""
        for member in group.silent(now, self.limits.member_timeout):
            self._release(group, member)

    def _release(self, group: GroupState, member: str) -> None:
        """``member`` is gone: its leases end now, as failed deliveries (call under ``group.lock``)."""
        group.members.pop(member, None)
        group.seen.pop(member, None)
        self._let_go(group.queue, group.name, member)
        for pid, state in list(group.partitions.items()):
            self._failed_many(group, pid, state, state.leases_of(member))

    def _let_go(self, queue: str, name: str, member: str) -> None:
        """``member`` is no longer one: unless a connection of it is still open here, its
        token holds the name no more, and a new member of the name may hold it."""
        if not self._connections.get((queue, name, member)):
            self._holders.pop((queue, name, member), None)

    def connected(self, connection: int, queue: str, name: str, member: str, holder: str = "") -> bool:
        """``member`` called on ``connection`` (a server's) with the token named ``holder``;
        True the first time, when the caller must call :meth:`disconnected` once the
        connection closes. The first token a member calls with holds it (:meth:`holder`)."""
        with self._lock:
            connections = self._connections.get((queue, name, member), set())
            if connection in connections or self._members_on[connection] >= MAX_MEMBERS_PER_CONNECTION:
                return False
            self._connections[(queue, name, member)] = connections | {connection}
            self._holders.setdefault((queue, name, member), holder)
            self._members_on[connection] += 1
            return True

    def holder(self, queue: str, name: str, member: str) -> str | None:
        """The token ``member`` called with, while it is a member: connected, or in its grace
        after its last connection closed (None: none)."""
        with self._lock:
            return self._holders.get((queue, name, member))

    def disconnected(self, connection: int, queue: str, name: str, member: str) -> None:
        """A connection ``member`` called on closed; if it was its last here, the member is gone."""
        with self._lock:
            self._members_on[connection] -= 1
            if self._members_on[connection] <= 0:
                del self._members_on[connection]
            connections = self._connections.get((queue, name, member), set()) - {connection}
            if connections:
                self._connections[(queue, name, member)] = connections
                return
            self._connections.pop((queue, name, member), None)  # (its holder stays until it is gone)
            group = self._groups.get((queue, name))
        if group is None:
            return
        if self.draining:  # the server closed it, stopping: what it holds goes back unseen, as at a leave
            self.leave(queue, name, member)
            return
        with group.lock:
            if member not in group.seen and member not in group.members:
                self._holders.pop((queue, name, member), None)
                return  # it left, or was found silent, before
            # Silent from now on, it is found so GONE_GRACE from now (_forget_silent: by the
            # next receive or view; a waiting receive looks again every second at least)
            now = time.monotonic()
            group.seen[member] = min(group.seen.get(member, now), now - self.limits.member_timeout + GONE_GRACE)
