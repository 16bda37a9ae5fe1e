"""Consumer groups (SPEC X3), with retries and dead letters (SPEC X2).

A group reads a queue as a work queue. ``receive`` leases messages to one
member; ``ack`` finishes them; ``nack``, or a lease that runs out, hands them
out again (after a backoff for a nack); a message that fails more than
``max_retries`` times goes to the dead-letter queue ``<queue>.dlq``. Every
group gets every message (broadcast); within a group each message is with
one member at a time (clustering).

Where the state lives: the owner of a partition keeps every group's state
for that partition (SPEC C10), so servers share nothing but the store. Per
(group, partition):

* the *completion cursor* ``done``: every message below it is acked.
  Persisted.
* the *scan cursor*: every message below it has been handed out. In memory;
  after a restart or a failover it starts again at ``done``.
* the acked IDs between the two, persisted one key each and forgotten once
  ``done`` passes them: one slow message never blocks new ones, and an acked
  message is never handed out again.
* leases (in memory) and retry counts (persisted at each failure).

Members (members.py): a member shares the partitions while it calls
``receive`` (at least every ``member_timeout`` seconds). The live members,
sorted, share the partitions: partition p goes to member ``p mod M``, and
with more members than partitions several members share a partition, the
per-message leases keeping each message with one of them. A member polls
every server, so every server sees the same members. When a member joins or
leaves the assignment changes at once; a leaving member gives its leases
back, and a member that is gone (silent past ``member_timeout``, or its last
connection closed) has its leases end at once.

Key affinity (affinity.py): a group made with ``key_affinity`` hands each
key's messages out in order, to one member at a time, even across retries,
nacks and members that are gone.

Limits (:class:`GroupLimits`, ``hqueue server --max-lease``,
``--max-member-in-flight``, ``--member-timeout``): a lease (and a nack's delay) is at most
``max_lease``, and a member holds at most ``max_member_in_flight`` messages
per group here, so one member that never acks cannot starve the others. An
ack counts only for a message the group handed out (see
:meth:`GroupAcks.ack_receipts`): a made-up receipt costs no stored state.

Delivery is at least once: a message whose lease is lost with its owner (a
server crash) is handed out again; a message acked before the crash never is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..errors import GroupNotFound, InvalidArgument, LimitExceeded
from ..keys.groups import group_key, groups_prefix, id_after, state_prefix
from ..message import (
    Message,
    MessageID,
    id_bytes,
    messages_from_columns,
    partition_prefix,
    successor,
    topic_filter,
)
from .acks import GroupAcks
from .affinity import KeyAffinity, check_key_affinity
from .arrivals import Arrivals
from .deaths import OUT_AGAIN, GroupDeaths, out_key
from .handout import Columns, Handout
from .limits import (
    GroupLimits,
    check_group_name,
    check_max_messages,
    check_max_retries,
    check_member,
    check_wait,
)
from .members import GroupMembers
from .ordered import InOrder
from .state import LATEST, GroupConfig, GroupState, PartitionState, assigned, served_order
from .views import GroupViews

if TYPE_CHECKING:
    from ..coordination import Coordinator
    from ..engine import Engine

logger = logging.getLogger(__name__)

#: A receive that found no room for its answer (a server's budget full) looks again after this.
ROOM_RETRY = 0.05
#: A waiting receive looks again after this at most, woken or not (a lease that ran out wakes
#: nobody). Writes, acks, nacks and leaves wake it at once: an ack that gives a member at its
#: --max-member-in-flight room (or a key in order its next message) is not seen a second late.
RECHECK = 1.0


class GroupService(GroupDeaths, GroupAcks, GroupMembers, InOrder, GroupViews):
    """Every consumer group's state for the partitions this process owns.

    Args:
        limits: What one member may take (the longest lease, messages held at
            once); see :class:`GroupLimits`.
    """

    def __init__(self, engine: Engine, coordinator: Coordinator, *, limits: GroupLimits | None = None) -> None:
        self.engine, self.coordinator, self.storage = engine, coordinator, engine.storage
        self.limits = limits or GroupLimits()
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], GroupState] = {}
        #: What waiting receives wait for: writes to their queue, acks in their group.
        self.arrivals = Arrivals()
        self._stopped = False
        self._init_members()
        self._init_deaths()

    def start(self) -> None:
        self.coordinator.add_listener(self._ownership_changed)
        self.coordinator.add_release_listener(self._clear_out_marks)
        self.engine.events.on_write(self._on_write)
        self.engine.events.on_drop(self.forget)
        self.engine.events.on_truncate(self._truncated)

    def stop(self) -> None:
        self._stopped = True
        self._clear_out_marks()
        self.engine.events.off(self._on_write)  # a stopped service hears nothing more (nor is kept alive)
        self.engine.events.off(self.forget)
        self.engine.events.off(self._truncated)
        self.arrivals.stop()

    def _on_write(self, queue: str, partition_id: int) -> None:
        """A write: wake the receives waiting on that queue, if any."""
        self.arrivals.written(queue)

    def _on_finished(self, queue: str, name: str) -> None:
        """An ack, nack, dead-letter or leave in a group: wake its waiting receives, if any (a
        member at its max_member_in_flight has room now; a key in order may have its next
        message; a member gone has its own end, and its leases go to the others)."""
        self.arrivals.finished(queue, name)

    def _on_freed(self, queue: str, name: str, members: set[str]) -> None:
        """Acks gave ``members``, at their max_member_in_flight, room: wake their own waiting
        receives (another member gets nothing more from it)."""
        self.arrivals.freed(queue, name, members)

    def _ownership_changed(self, gained: set[tuple[str, int]], lost: set[tuple[str, int]]) -> None:
        """A partition that moved away takes its leases with it: the new owner starts from ``done``."""
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            with group.lock:
                for queue, pid in lost:
                    if queue == group.queue:
                        group.partitions.pop(pid, None)

    # -- groups ------------------------------------------------------------------------

    def open(
        self,
        queue: str,
        name: str,
        topics: Collection[bytes] | None,
        start: int,
        max_retries: int,
        key_affinity: str | None = None,
    ) -> GroupConfig:
        """Make the group if it is new; check that an existing one takes the same topics
        and, if ``key_affinity`` is given, keeps the same key in order."""
        check_group_name(name)
        check_key_affinity(key_affinity)
        check_max_retries(max_retries)
        info = self.engine.queue_info(queue, fresh=True)
        if not isinstance(start, int) or start < LATEST:
            raise InvalidArgument(f"'start' must be epoch ms >= 0 (or -1: the latest), got {start!r}")
        wanted = GroupConfig(  # (no topics, or none named: all of them)
            frozenset(topics) if topics else None, start, max_retries, key_affinity=key_affinity
        )
        stored = self.storage.get_meta(group_key(queue, name))
        if stored is None:
            for topic in topics or ():  # (a server's client may send any; one stored before is joined)
                topic_filter(topic)
            info.require_enabled()  # (a member of a disabled queue gets nothing: no group made for it)
            self._check_room(queue)
            if start == LATEST:
                last = {pid: self.engine.last_id(queue, pid) for pid in range(info.partitions)}
                wanted = replace(wanted, starts={pid: successor(i) for pid, i in last.items() if i is not None})
            self.storage.put_meta(group_key(queue, name), wanted.to_json())
            self._load(queue, name, info.partitions)
            return wanted
        config = GroupConfig.from_json(stored)
        if config.topics != wanted.topics:
            raise InvalidArgument(
                f"consumer group {name!r} of {queue!r} takes topics {_show(config.topics)}, not "
                f"{_show(wanted.topics)}: use another group, or delete this one first"
            )
        if key_affinity is not None and config.key_affinity != key_affinity:
            raise InvalidArgument(
                f"consumer group {name!r} of {queue!r} keeps key order by {config.key_affinity or 'nothing'}, "
                f"not by {key_affinity}: use another group, or delete this one first"
            )
        return config

    def _check_room(self, queue: str) -> None:
        """LimitExceeded when ``queue`` has ``limits.max_groups`` groups (a new one is refused)."""
        limit = self.limits.max_groups
        if len(self.storage.list_meta(groups_prefix(queue))) >= limit:
            raise LimitExceeded(
                "max_groups",
                limit,
                f"queue {queue!r} has {limit} consumer groups, the most a queue may have here "
                "(--max-groups): delete one, or use one of them",
            )

    def _load(self, queue: str, name: str, partitions: int) -> None:
        """Hold a new group's state over the partitions owned here (metrics show it at once)."""
        group = self._group(queue, name)
        with group.lock:
            for pid in self.coordinator.owned(queue, partitions):
                self._partition(group, pid)

    def _group(self, queue: str, name: str) -> GroupState:
        with self._lock:
            group = self._groups.get((queue, name))
            if group is None:
                check_group_name(name)  # (before a key is made of it: a name no group may have is none)
                stored = self.storage.get_meta(group_key(queue, name))
                if stored is not None:
                    group = self._groups[(queue, name)] = GroupState(queue, name, GroupConfig.from_json(stored))
        if group is None:
            self.engine.queue_info(queue, fresh=True)  # a missing queue says more than "no group"
            raise GroupNotFound(queue, name)
        return group

    def _partition(self, group: GroupState, pid: int) -> PartitionState:
        """The group's state over ``pid``, read from the store on first use (call under group.lock),
        once the partition is taken: a former owner's ack can no longer land after the read.

        A first read first waits for the acks under way (:meth:`GroupState.settle`), which
        lets ``group.lock`` go meanwhile: what the caller read of the group before may
        have moved. Raises GroupNotFound if the group was deleted meanwhile.
        """
        state = group.partitions.get(pid)
        if state is None:
            group.settle()  # read what every ack answered so far wrote
            if group.deleted:
                raise GroupNotFound(group.queue, group.name)
            state = group.partitions.get(pid)  # (another may have read it meanwhile)
            if state is not None:
                return state
            self.engine.writers.fence(group.queue, pid)
            stored = self.storage.list_meta(state_prefix(group.queue, group.name, pid))
            done = (
                stored.get(state_prefix(group.queue, group.name, pid) + "done") or group.config.start_of(pid).to_bytes()
            )
            acked, retries, behind, out_again, burying = set(), {}, set(), {}, {}
            for key, value in stored.items():
                kind, _, text = key.rpartition("/")
                if kind.endswith("/ack"):
                    acked.add(bytes.fromhex(text))
                elif kind.endswith("/retry"):
                    count, out, holder = value.partition(OUT_AGAIN)  # "2", or "2+<holder>" while out again (deaths.py)
                    retries[message_id := bytes.fromhex(text)] = int(count)
                    if out:
                        out_again[message_id] = holder
                elif kind.endswith("/behind"):
                    behind.add(bytes.fromhex(text))
                elif kind.endswith("/bury"):
                    burying[bytes.fromhex(text)] = value
            state = group.partitions[pid] = PartitionState(done, {a for a in acked if a >= done}, retries)
            state.burying = burying
            if behind:  # unfinished messages the cursor jumped past: their leases died, out again now
                state.behind, now = behind, time.monotonic()
                for message_id in sorted(behind):
                    state.out_again_at(message_id, now, group.config.max_retries)
            state.dead_lettered = int(stored.get(state_prefix(group.queue, group.name, pid) + "dead") or 0)
            if group.config.key_affinity is not None:
                state.affinity = KeyAffinity(group.config.key_affinity)
            self._after_the_last_holder(group, pid, state, stored.get(out_key(group, pid)) or b"", out_again)
        return state

    def held(self) -> list[tuple[str, str]]:
        """The (queue, group) pairs whose state this service holds now (any it served and
        that were not deleted since)."""
        with self._lock:
            return list(self._groups)

    def names(self, queue: str) -> list[str]:
        self.engine.queue_info(queue, fresh=True)
        prefix = f"groups/{queue}/"
        return sorted(key[len(prefix) :] for key in self.storage.list_meta(prefix))

    def forget(self, queue: str) -> None:
        """The queue is dropped: forget its groups' state held here, once the acks under way
        have landed (the engine removes the groups' progress after this: none may come after)."""
        with self._lock:
            groups = [self._groups.pop(key) for key in [k for k in self._groups if k[0] == queue]]
        for group in groups:
            with group.lock:
                group.deleted = True
                group.settle()
        self.arrivals.forget(queue)

    def _truncated(self, queue: str) -> None:
        """The queue was truncated (its writers' locks still held: the work goes to a thread
        of its own, as a group's lock is taken before a writer's elsewhere)."""
        threading.Thread(
            target=self._finish_truncated, args=(queue,), name="hqueue-group-truncated", daemon=True
        ).start()

    def _finish_truncated(self, queue: str) -> None:
        """Finish, in each group of ``queue`` held here, the messages in flight, waiting to
        go out again or held back for their keys that the truncate removed: they showed as
        in flight, then retrying (or held back), in ``describe_group``, ``pending`` and the
        metrics until a member's next receive from their partition found them gone (which
        finishes them the same way)."""
        try:
            floor = self.engine.queue_info(queue, fresh=True).id_floor
        except Exception:  # (dropped meanwhile: forget did the rest; or the store closed)
            return
        below = MessageID(floor + 1, 0).to_bytes()  # every ID given after the truncate is above its floor
        with self._lock:
            groups = [group for key, group in self._groups.items() if key[0] == queue]
        for group in groups:
            try:
                with group.lock:
                    if group.deleted:
                        continue
                    for pid, state in list(group.partitions.items()):
                        back: list[bytes] = []
                        if state.affinity is not None:
                            back = [i for i in state.affinity.back_ids if i < below]
                            state.affinity.drop_back(back)
                        gone = [i for i in (*state.leases, *state.ready) if i < below] + back
                        if gone:
                            self._acked(group, pid, state, gone)
            except Exception:  # (the store failing or closed, a partition lost: the next receive finishes them)
                logger.debug(
                    "finishing the truncated messages of group %s of %s failed", group.name, queue, exc_info=True
                )

    def delete(self, queue: str, name: str) -> None:
        """Forget the group and its progress. Under its lock, once the acks under way have
        landed: an ack written after the keys were listed would outlive the group, and a
        group made again under its name would start from it."""
        group = self._group(queue, name)
        with group.lock:
            group.deleted = True
            group.settle()
            try:
                keys = list(self.storage.list_meta(state_prefix(queue, name)))
                self.storage.write_meta({}, [*keys, group_key(queue, name)])
            except BaseException:
                group.deleted = False  # not deleted: it goes on as it was
                raise
            # Forgotten only now: a call that came meanwhile found this state, deleted, and not
            # a new one read from the group's key before its delete landed.
            with self._lock:
                if self._groups.get((queue, name)) is group:
                    del self._groups[(queue, name)]
            self.arrivals.forget(queue, name)

    # -- receive -----------------------------------------------------------------------

    def receive(
        self, queue: str, name: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        """Lease up to ``max_messages`` to ``member``, waiting up to ``wait`` seconds for some.

        The lease is at most ``limits.max_lease`` (a longer one asked for is
        shortened), and a member gets no more than it may still hold
        (``limits.max_member_in_flight`` less what it holds): none while it
        holds that many. Returns (message, attempt) pairs; attempt 1 is a
        first delivery.
        """
        keys, values, attempts = self.receive_columns(queue, name, member, max_messages, lease, wait)
        return list(zip(messages_from_columns(keys, values), attempts, strict=True))

    def off_loop(self, queue: str, name: str) -> bool:
        """Whether a server runs the group's receives on a worker (they may read through rows
        of other topics than the group's, or merge many topics' index entries): Engine.off_loop."""
        return self.engine.off_loop(queue, self._group(queue, name).config.topics)

    def receive_columns(
        self,
        queue: str,
        name: str,
        member: str,
        max_messages: int,
        lease: float,
        wait: float,
        idle: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> Columns:
        """:meth:`receive` as cell keys, values and attempts: no object per message (the
        server's path). ``idle()`` is entered around each wait for messages: a server's
        thread gives back the bytes it holds for the answer meanwhile, and what it gives
        (``held``: 0 when no room came back) says whether the receive may take messages
        now, or waits again first (at its deadline it returns none)."""
        check_member(member)
        check_max_messages(max_messages)
        lease = self.limits.lease(lease)
        check_wait(wait)
        group = self._group(queue, name)
        started = time.monotonic()
        deadline = started + wait
        arrivals = self.arrivals
        with arrivals.receiving(queue, name, member) if wait > 0 else nullcontext():
            taken: Columns = ([], [], [])
            room, next_ready = True, RECHECK
            while True:
                seen = arrivals.seen(queue, name, member)
                if self._stopped:  # woken by the stop: the store may be closing (the client asks again)
                    return taken
                if group.left.since(member, started):  # it left meanwhile (its client closed): nothing
                    return taken
                if room:
                    taken, next_ready = self._take(group, member, max_messages, lease, started)
                left = deadline - time.monotonic()
                if taken[0] or left <= 0:
                    return taken
                with idle() as slot:
                    if room:
                        arrivals.wait(queue, name, member, seen, min(left, next_ready, RECHECK))
                    else:  # (no room for the answer last time: look again soon, messages or not)
                        arrivals.wait(queue, name, member, None, min(left, ROOM_RETRY))
                room = slot is None or bool(slot.held)

    def _take(self, group: GroupState, member: str, limit: int, lease: float, since: float) -> tuple[Columns, float]:
        """What ``member`` gets now (nothing if it left after ``since``, when its receive
        began), and seconds until a retry falls due or a lease runs out."""
        info = self.engine.enabled_queue(group.queue)
        now = time.monotonic()
        out = Handout()
        next_ready = RECHECK
        with group.lock:
            if group.deleted:  # held from before its delete: nothing more of it goes out
                raise GroupNotFound(group.queue, group.name)
            if group.left.since(member, since):
                return out.columns(), next_ready
            group.members[member] = group.seen[member] = now
            self._forget_silent(group, now)
            members = group.live_members(now, self.limits.member_timeout)
            members = group.members_with_room(members, self.limits.max_member_in_flight, member)
            mine = [p for p in assigned(members, member, info.partitions) if self.coordinator.owns(group.queue, p)]
            group.turn += 1
            mine = served_order(mine, info, group.turn)
            for pid in mine:
                if pid not in group.partitions:
                    self._partition(group, pid)
            for pid, state in list(group.partitions.items()):  # run-out leases are no longer held
                if state.lease_heap and state.lease_heap[0][0] <= now:
                    self._expire(group, pid, state, now)
            room = self.limits.max_member_in_flight - group.held_by(member)
            limit = min(limit, room)
            if room <= 0:  # at its cap: it gets room when a lease of its runs out, if not acked first
                heads = [state.lease_heap[0][0] for state in group.partitions.values() if state.lease_heap]
                next_ready = min([next_ready, *(max(0.001, head - now) for head in heads)])
            for pid in mine:
                if len(out.keys) >= limit or out.full:
                    break
                state = self._partition(group, pid)
                out.again, out.back = [], []  # (marked with the partition's mark, before they go)
                if state.affinity is not None:
                    self._take_in_order(group, pid, state, member, now + lease, limit - len(out.keys), out)
                else:
                    self._redeliver(group, pid, state, member, now + lease, limit - len(out.keys), out)
                    self._new(group, pid, state, member, now + lease, limit - len(out.keys), out)
                self._mark_if_due(group, pid, state, now, out.again, out.back)
                if state.ready_heap:
                    next_ready = min(next_ready, max(0.001, state.ready_heap[0][0] - now))
                if state.lease_heap:  # (a lease running out: its message goes out again)
                    next_ready = min(next_ready, max(0.001, state.lease_heap[0][0] - now))
        if out.keys and len(out.keys) >= room and len(members) > 1 and info.partitions > 1:
            # At its cap now: the others share its partitions out, and their waiting receives
            # look again (of one partition, all read it: nothing moves).
            self._on_finished(group.queue, group.name)
        return out.columns(), next_ready

    def _expire(self, group: GroupState, pid: int, state: PartitionState, now: float) -> None:
        self._failed_many(group, pid, state, state.expired(now))

    def _redeliver(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, limit: int, out: Handout
    ) -> None:
        taken = []
        due = state.due(time.monotonic(), limit)
        for index, message_id in enumerate(due):
            if out.full:  # the reply's bytes are taken: the rest wait for the next receive
                state.due_again(due[index:])
                break
            if message_id in state.unburied:  # past its retries: its dead-letter write is due again
                self._bury(group, pid, state, message_id, at_once=False)
                continue
            cell = self._read(group.queue, pid, message_id)
            if cell is None:  # gone (TTL, truncate): nothing left to do
                self._acked(group, pid, state, [message_id])
                continue
            taken.append(message_id)
            out.add(cell[0], cell[1], state.retries.get(message_id, 0) + 1)
        if taken:
            out.again += [i for i in taken if i in state.retries]
            state.lease(taken, member, deadline)

    def _new(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, limit: int, out: Handout
    ) -> None:
        room = min(limit, self.limits.max_span - state.in_flight)
        while room > 0 and not out.full:
            asked = room + state.acked_ahead_of_scan  # acked ones are skipped: ask for enough to fill the room
            found_keys, found_values, ended, past = self._read_new(group, pid, state, asked, out.room)
            if not found_keys:
                if past is not None:  # (rows of other topics only, to the partition's end)
                    state.scan = max(state.scan, past)
                return
            keys, values = found_keys, found_values
            ids: list[bytes] = list(map(id_bytes, keys))
            read_to = ids[-1]
            if state.acked_ahead_of_scan:  # after a restart: skip what was acked before it
                kept = [i for i, message_id in enumerate(ids) if message_id not in state.acked]
                keys, values, ids = [keys[i] for i in kept], [values[i] for i in kept], [ids[i] for i in kept]
            if len(ids) > room:
                keys, values = keys[:room], values[:room]
            taken, size = out.fitting(keys, values)
            # The scan goes on after the last one taken, or, all taken, after the last one read.
            state.scan = id_after(ids[taken - 1] if taken < len(ids) else read_to)
            if past is not None and taken == len(ids):  # all taken: rows of other topics after them too
                state.scan = max(state.scan, past)  # (never back: one written after `last` was read is among them)
            if taken:
                if taken < len(keys):
                    keys, values = keys[:taken], values[:taken]
                ids = ids[:taken]
                handed = ids
                if state.retries:  # retries read past the cursor: ones handed out before a restart or a move
                    handed, keys, values = self._spent(group, state, ids, keys, values)
                state.lease(handed, member, deadline)
                state.open.extend(ids)
                state.handed_top = ids[-1]
                if state.retries:
                    out.again += [i for i in handed if i in state.retries]
                attempts = [state.retries.get(i, 0) + 1 for i in handed] if state.retries else repeat(1, taken)
                out.extend(keys, values, attempts, size)
                room -= taken
            if ended:
                return

    def _spent(
        self, group: GroupState, state: PartitionState, ids: list[bytes], keys: Sequence[bytes], values: Sequence[bytes]
    ) -> tuple[list[bytes], Sequence[bytes], Sequence[bytes]]:
        """Of ``ids`` (and their cells) read past the cursor, those to hand out: one whose
        retries are spent (its holder went before its dead-letter write) goes to the
        dead-letter queue instead (due now, as :meth:`_redeliver` buries)."""
        most = group.config.max_retries
        if all(state.retries.get(i, 0) <= most for i in ids):
            return ids, keys, values
        now, kept = time.monotonic(), []
        for n, message_id in enumerate(ids):
            if state.retries.get(message_id, 0) > most:
                state.out_again_at(message_id, now, most)  # (its dead-letter write)
            else:
                kept.append(n)
        return [ids[n] for n in kept], [keys[n] for n in kept], [values[n] for n in kept]

    def _read(self, queue: str, pid: int, message_id: bytes) -> tuple[bytes, bytes] | None:
        start = partition_prefix(pid) + message_id
        cells = self.storage.scan(queue, start, partition_prefix(pid) + id_after(message_id), None, 1)
        return cells[0] if cells else None

    def set_position(self, queue: str, name: str, partition_id: int | None, start: MessageID) -> None:
        """Replay (or skip): the group takes the partition (None: all) again from ``start``.

        Leases, retries and acks kept there are dropped; members get the
        messages from ``start`` on, as if the group had been made there.
        """
        group = self._group(queue, name)
        info = self.engine.queue_info(queue, fresh=True)
        pids = list(range(info.partitions)) if partition_id is None else [partition_id]
        with group.lock:
            for pid in pids:
                if not isinstance(pid, int) or not 0 <= pid < info.partitions:
                    raise InvalidArgument(f"'partition' must be in 0..{info.partitions - 1}, got {pid!r}")
                self.coordinator.require_owner(queue, pid)
            group.settle()  # an ack under way would land after the stale keys were listed
            for pid in pids:
                prefix = state_prefix(queue, name, pid)
                stale = [key for key in self.storage.list_meta(prefix) if key != prefix + "done"]
                self._write(group, pid, {prefix + "done": start.to_bytes()}, stale)
                group.partitions.pop(pid, None)


def _show(topics: frozenset[bytes] | None) -> str:
    return (
        "all"
        if topics is None
        else "[" + ", ".join(repr(t.decode("utf-8", "backslashreplace")) for t in sorted(topics)) + "]"
    )
