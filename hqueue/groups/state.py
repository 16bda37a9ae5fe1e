"""A consumer group's definition and its progress over one partition (SPEC X2, X3).

What the group service (groups.py) keeps per group: the :class:`GroupConfig`
(stored), the members and the partitions' state; per partition the two
cursors, the acks between them, leases and retries (:class:`PartitionState`);
and how live members share the partitions (:func:`assigned`,
:func:`served_order`). Nothing here reads or writes the store.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import threading
import time
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import itemgetter, or_
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..message import MessageID
from .limits import DEFAULT_MAX_RETRIES, MAX_WAIT, MEMBER_TIMEOUT

if TYPE_CHECKING:
    from ..config import QueueInfo
    from .affinity import KeyAffinity

#: IDs the lease heap may hold past twice the leases before it is pruned (PartitionState._prune).
HEAP_SLACK = 1024
#: Acks a partition's state keeps ahead of its completion cursor (an unfinished message holds
#: the cursor) before the cursor jumps to the scan and keeps the unfinished ones instead
#: (``PartitionState.behind``): what one stuck message costs stays bounded.
MAX_ACKED_AHEAD = 10_000
_MEMBER = itemgetter(0)  # of a lease: (member, deadline)
#: One receive in this many serves the lowest priority tier first (no starvation).
STARVE_GUARD = 4
#: ``start`` of a group that begins after each partition's last message when it is made.
LATEST = -1


class OpenIds:
    """Every ID a partition handed out and not finished, in ID order (cleaned lazily: a
    finished ID stays until the ones before it are finished too). A list read from ``head``
    on: the finished IDs at the front go by moving ``head``, and the first one still held
    is looked for by C's iteration, with no look-up per ID in Python."""

    __slots__ = ("ids", "head")

    def __init__(self, ids: Iterable[bytes] = ()) -> None:
        self.ids: list[bytes] = list(ids)
        self.head = 0

    def append(self, message_id: bytes) -> None:
        self.ids.append(message_id)

    def extend(self, ids: Iterable[bytes]) -> None:
        self.ids.extend(ids)

    def clear(self) -> None:
        self.ids, self.head = [], 0

    def __len__(self) -> int:
        return len(self.ids) - self.head

    def __iter__(self) -> Iterator[bytes]:
        return islice(self.ids, self.head, None)

    def first_open(self, holders: Sequence[Container[bytes]]) -> bytes | None:
        """The first ID that one of ``holders`` (leases, retries waiting, held back) still
        has; those before it go. None: every one is finished (all go)."""
        if not holders:
            self.clear()
            return None
        ids, head = self.ids, self.head
        held = map(holders[0].__contains__, islice(ids, head, None))
        for holder in holders[1:]:
            held = map(or_, held, map(holder.__contains__, islice(ids, head, None)))
        at = next(compress(itertools.count(head), held), len(ids))
        if at == len(ids):
            self.clear()
            return None
        if at > HEAP_SLACK and 2 * at > len(ids):  # (the list's front is given back now and then)
            del ids[:at]
            at = 0
        self.head = at
        return ids[at]

    def keep(self, holders: Sequence[Container[bytes]]) -> None:
        """Only the IDs one of ``holders`` still has stay."""
        self.ids, self.head = [i for i in self if any(i in h for h in holders)], 0

    def drop(self, ids: Container[bytes]) -> None:
        """The IDs in ``ids`` go."""
        self.ids, self.head = [i for i in self if i not in ids], 0


@dataclass(frozen=True)
class GroupConfig:
    """What a group takes, fixed when it is made.

    Attributes:
        topics: The topics it takes; None for all.
        start: Epoch ms where it starts in every partition (0: the beginning).
        max_retries: Failures a message may have beyond its first delivery.
        key_affinity: None, or the key whose messages the group hands out in
            order (``"topic"``, ``"partition"``; see :mod:`hqueue.groups.affinity`).
    """

    topics: frozenset[bytes] | None = None
    start: int = 0
    max_retries: int = DEFAULT_MAX_RETRIES
    #: A group made at the ``"latest"``: where each partition ended then.
    starts: dict[int, MessageID] = field(default_factory=dict)
    key_affinity: str | None = None

    def start_of(self, partition_id: int) -> MessageID:
        return self.starts.get(partition_id, MessageID(max(0, self.start)))

    def to_json(self) -> bytes:
        topics = sorted(t.hex() for t in self.topics) if self.topics is not None else None
        starts = {pid: str(i) for pid, i in self.starts.items()}
        d: dict[str, Any] = {"topics": topics, "start": self.start, "max_retries": self.max_retries, "starts": starts}
        if self.key_affinity is not None:
            d["key_affinity"] = self.key_affinity
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes) -> GroupConfig:
        d = json.loads(data)
        # (a group stored naming no topic, which took nothing, takes all, as one opened so does now)
        topics = frozenset(bytes.fromhex(t) for t in d["topics"]) if d["topics"] else None
        starts = {int(pid): MessageID.parse(i) for pid, i in d.get("starts", {}).items()}
        return cls(topics, d["start"], d["max_retries"], starts, d.get("key_affinity"))


@dataclass
class PartitionState:
    """One group's progress over one partition (held by the partition's owner).

    IDs are kept in their 10-byte stored form (:meth:`MessageID.to_bytes`),
    which sorts as IDs do: no object per message on the hot path.
    """

    done: bytes
    acked: set[bytes] = field(default_factory=set)
    retries: dict[bytes, int] = field(default_factory=dict)
    scan: bytes = b""
    #: Unfinished messages the completion cursor jumped past (MAX_ACKED_AHEAD): each in
    #: flight (leased or waiting to be retried), stored one by one, finished by an ack.
    behind: set[bytes] = field(default_factory=set)
    #: The highest ID of ``acked`` as the store had it (after a restart or a move): while the
    #: scan is not past it, what it reads may be acked already (skipped). Acks made since
    #: are of messages it read: none ahead of it.
    acked_top: bytes = b""
    #: Handed out now: ID -> (member, lease deadline).
    leases: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    #: Failed, to hand out again at a (monotonic) time.
    ready: dict[bytes, float] = field(default_factory=dict)
    #: Past their retries, refused by the dead-letter queue: ID -> refusals. They wait in
    #: ``ready`` for the next try of the dead-letter write, and are never handed out again.
    unburied: dict[bytes, int] = field(default_factory=dict)
    #: Past their retries, their dead letter being written: ID -> the lane of its idempotent
    #: put (stored first, ``bury/<id>``): written again after a crash, it is written once.
    burying: dict[bytes, bytes] = field(default_factory=dict)
    #: (deadline, batch number, the batch's IDs): one entry per receive, not per message.
    #: An ID acked stays in its entry (no search per ack) until the entry is popped at its
    #: deadline, or the heap is pruned: when most of its IDs are finished (``heap_ids``).
    lease_heap: list[tuple[float, int, list[bytes]]] = field(default_factory=list)
    heap_ids: int = 0
    ready_heap: list[tuple[float, bytes]] = field(default_factory=list)
    #: Every ID handed out and not acked, in ID order (cleaned lazily): the first is where ``done`` may go.
    open: OpenIds = field(default_factory=OpenIds)
    #: Messages leased to each member (members holding none are not kept).
    held: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: int = 0
    #: Messages acked (or dead-lettered) since this state was made: lag.py counts from it.
    finished: int = 0
    #: Messages the group moved from this partition to ``<queue>.dlq``, ever (stored).
    dead_lettered: int = 0
    #: The group's lag here counted once (lag.py's Seed), kept by the metrics' LagBook.
    lag_seed: Any = None
    #: A group with key affinity: each key's messages in order (affinity.py).
    affinity: KeyAffinity | None = None
    #: What the last metrics scrape wrote of this state (server/gauges.py), reused while it holds.
    metric_lines: Any = None
    #: The highest ID handed out as a first delivery here, and the highest of those stored
    #: (``out``) with when it was: what a holder that dies had in flight (service.py).
    handed_top: bytes = b""
    out_mark: bytes = b""
    out_written: float = 0.0
    #: Whether this process's mark is stored (a clean stop removes it).
    marked: bool = False
    #: Held back (key affinity) since the last mark written: noted with the next one.
    back_unmarked: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scan = max(self.scan, self.done)
        if self.acked and not self.acked_top:
            self.acked_top = max(self.acked)

    @property
    def acked_ahead_of_scan(self) -> int:
        """How many acked IDs a read from the scan cursor may meet (at most): those loaded
        from the store, until the scan passes the highest; then none. (Counting every ack
        kept made a receive read that many more cells: with one message unfinished and
        100,000 acked after it, 13 MB a receive.)"""
        return len(self.acked) if self.acked and self.scan <= self.acked_top else 0

    @property
    def in_flight(self) -> int:
        held_back = len(self.affinity.back_ids) if self.affinity is not None else 0
        return len(self.leases) + len(self.ready) + held_back

    def lowest_open(self) -> bytes:
        """The lowest ID handed out and not finished (``scan`` if there is none):
        where ``done`` may move to.

        With nothing in flight (a member that acks what it received: the usual
        case) every ID in ``open`` is finished, and they go at once; otherwise the
        first one still open is looked for in C (:meth:`OpenIds.first_open`).
        """
        leases, ready = self.leases, self.ready
        back = self.affinity.back_ids if self.affinity is not None else ()
        if not leases and not ready and not back:
            self.open.clear()
            return self.scan
        holders = [c for c in (leases, ready, back) if c]
        first = self.open.first_open(holders)
        if len(self.open) > 2 * (len(leases) + len(ready) + len(back)) + HEAP_SLACK:
            # One unfinished message at the front kept every ID handed out after it: only the
            # unfinished ones stay (O(1) each, spread over the IDs finished since the last time).
            self.open.keep(holders)
        return self.scan if first is None else first

    def handed_out(self, message_id: bytes) -> bool:
        """Whether the group handed ``message_id`` out and it is not finished: an ack counts."""
        return message_id in self.leases or message_id in self.ready

    def lease(self, ids: list[bytes], member: str, deadline: float) -> None:
        """Lease ``ids`` (none leased now: new ones, or ones due for a retry) to ``member``."""
        affinity, ready = self.affinity, self.ready
        if affinity is not None:
            for message_id in ids:
                affinity.leased(message_id, member, ready.pop(message_id, None) is not None)
        elif ready:  # (none waits for a retry, the usual case: no look-up per ID)
            for message_id in ids:
                ready.pop(message_id, None)
        if not self.leases:  # every lease ended (members ack all they get: the usual case), so
            self.lease_heap, self.heap_ids = [], 0  # is every heap entry: none to look through
        self.leases.update(zip(ids, repeat((member, deadline))))
        self.held[member] += len(ids)
        self._push_leases(deadline, ids)

    def extend(self, ids: list[bytes], member: str, deadline: float) -> list[bytes]:
        """Move the lease of each of ``ids`` that ``member`` holds to ``deadline``; those moved."""
        moved = [i for i in ids if (lease := self.leases.get(i)) is not None and lease[0] == member]
        if moved:
            self.leases.update(zip(moved, repeat((member, deadline))))
            self._push_leases(deadline, moved)  # the old entries go stale
        return moved

    def _push_leases(self, deadline: float, ids: list[bytes]) -> None:
        self.batches += 1
        heapq.heappush(self.lease_heap, (deadline, self.batches, ids))
        self.heap_ids += len(ids)
        if self.heap_ids > 2 * len(self.leases) + HEAP_SLACK:
            self._prune()

    def _prune(self) -> None:
        """Drop the finished IDs from the heap's entries, and the entries left empty.

        Without it the heap holds every ID handed out for a lease's length after its ack
        (30 s at 100,000 msgs/s: 3M IDs, ~170 MB; a lease of hours: without bound). Run
        once the heap holds twice the leases (plus a slack), its cost is spread over the
        IDs that went stale since the last prune: O(1) each.
        """
        if not self.leases:  # (every member acked what it received: the usual case)
            self.lease_heap, self.heap_ids = [], 0
            return
        kept = []
        for deadline, batch, ids in self.lease_heap:
            live = self._leased_until(ids, deadline)
            if live:
                kept.append((deadline, batch, live))
        heapq.heapify(kept)
        self.lease_heap, self.heap_ids = kept, sum(len(entry[2]) for entry in kept)

    def expired(self, now: float) -> list[bytes]:
        out = []
        while self.lease_heap and self.lease_heap[0][0] <= now:
            deadline, _, ids = heapq.heappop(self.lease_heap)
            self.heap_ids -= len(ids)
            out += self._leased_until(ids, deadline)
        return out

    def _leased_until(self, ids: list[bytes], deadline: float) -> list[bytes]:
        """Those of a heap entry's ``ids`` still leased until its ``deadline`` (the others were
        finished, given back, or leased again since: a later entry has them)."""
        leases = self.leases
        return [i for i in ids if (lease := leases.get(i)) is not None and lease[1] == deadline]

    def due_again(self, ids: Iterable[bytes]) -> None:
        """Put IDs that :meth:`due` gave and a receive did not take back in line."""
        for message_id in ids:
            at = self.ready.get(message_id)
            if at is not None:
                heapq.heappush(self.ready_heap, (at, message_id))

    def due(self, now: float, limit: int) -> list[bytes]:
        out: list[bytes] = []
        while self.ready_heap and len(out) < limit and self.ready_heap[0][0] <= now:
            at, message_id = heapq.heappop(self.ready_heap)
            if self.ready.get(message_id) == at:
                out.append(message_id)
        return out

    def release(self, message_id: bytes) -> None:
        """``message_id`` is no longer leased (acked, failed, or given back)."""
        lease = self.leases.pop(message_id, None)
        if lease is not None:
            member = lease[0]
            self.held[member] -= 1
            if self.held[member] <= 0:
                del self.held[member]
            if self.affinity is not None:
                self.affinity.released(message_id, member)

    def retry_at(self, message_id: bytes, at: float) -> None:
        self.release(message_id)
        if message_id not in self.ready and self.affinity is not None:
            self.affinity.waits(message_id)
        self.ready[message_id] = at
        heapq.heappush(self.ready_heap, (at, message_id))

    def out_again_at(self, message_id: bytes, at: float, max_retries: int) -> None:
        """``message_id`` is due at ``at``: as a retry, or, its retries spent (past
        ``max_retries``), for its dead-letter write (never a delivery again)."""
        if self.retries.get(message_id, 0) > max_retries:
            self.unburied[message_id] = 0
        self.retry_at(message_id, at)

    def finish(self, message_id: bytes) -> None:
        """``message_id`` is done (acked or dead-lettered): neither leased nor waiting."""
        self.release(message_id)
        was_waiting = self.ready.pop(message_id, None) is not None
        if self.affinity is not None:
            self.affinity.finished(message_id, was_waiting)

    def finish_many(self, ids: list[bytes]) -> None:
        """:meth:`finish` each of ``ids``: at a few calls' cost for a batch when no key order is kept."""
        if self.affinity is not None:
            for message_id in ids:
                self.finish(message_id)
            return
        held = self.held
        ended = list(filter(None, map(self.leases.pop, ids, repeat(None))))
        members = set(map(_MEMBER, ended))
        if len(members) == 1:  # the usual case: one member's acks
            holders = {members.pop(): len(ended)}
        else:
            holders = collections.Counter(map(_MEMBER, ended))
        for member, count in holders.items():
            left = held[member] - count
            if left > 0:
                held[member] = left
            else:
                held.pop(member, None)
        if self.ready:
            pop = self.ready.pop
            for message_id in ids:
                pop(message_id, None)

    def leases_of(self, member: str) -> list[bytes]:
        """The IDs ``member`` holds here, in ID order."""
        if member not in self.held:
            return []
        return sorted(i for i, lease in self.leases.items() if lease[0] == member)


class Departures:
    """When each member left (by a key: its name in a group, or ``(queue, group, member)``),
    kept for the longest receive's wait: a receive the member began before it left takes
    nothing more. A cancelled long poll outlives its client's leave, and each take counts
    its member in again, so the others would wait for its partitions until its timeout."""

    def __init__(self) -> None:
        self._at: collections.OrderedDict[Any, float] = collections.OrderedDict()  # oldest first

    def leave(self, key: Any) -> None:
        now = time.monotonic()
        at = self._at
        while at and next(iter(at.values())) < now - MAX_WAIT - 1:  # (the oldest first: each goes once)
            at.popitem(last=False)
        at[key] = now
        at.move_to_end(key)

    def since(self, key: Any, started: float) -> bool:
        """Whether ``key`` left at or after ``started`` (``time.monotonic()``)."""
        return self._at.get(key, -1.0) >= started


class GroupState:
    def __init__(self, queue: str, name: str, config: GroupConfig) -> None:
        self.queue, self.name, self.config = queue, name, config
        self.lock = threading.Lock()
        #: Deleted: nothing more of it is written (an ack that still holds it gets GroupNotFound).
        self.deleted = False
        #: Writes under way with ``lock`` let go (SYNC_WAL acks waiting for their fsync), and
        #: what a delete waits on for them to end (so none lands after it).
        self.writing = 0
        self.written = threading.Condition(self.lock)
        #: Members that receive: member -> when it last called receive (the assignment's members).
        self.members: dict[str, float] = {}
        #: Every member heard from: member -> when it last called (receive or heartbeat).
        self.seen: dict[str, float] = {}
        #: When members left, by name.
        self.left = Departures()
        self.dead_lettered = 0
        self.partitions: dict[int, PartitionState] = {}
        self.turn = 0
        #: Acks of receipts the group never handed out (ignored), and when one was last logged.
        self.unknown_acks = 0
        self.unknown_logged = 0.0
        #: When a dead-letter queue's refusal was last logged.
        self.unburied_logged = 0.0

    def settle(self) -> None:
        """Wait (under ``lock``, which the wait lets go) until no write that let the lock go is
        under way: what is read from the store after this has every ack answered so far."""
        while self.writing:
            self.written.wait()

    def held_by(self, member: str) -> int:
        """Messages ``member`` holds in this group's partitions here (call under ``lock``)."""
        return sum(state.held.get(member, 0) for state in self.partitions.values())

    def members_with_room(self, members: list[str], cap: int, asking: str) -> list[str]:
        """``members`` less those holding ``cap`` messages here (``asking`` stays): a
        member that holds all it may cannot keep its partitions from the others."""
        if len(members) == 1 and members[0] == asking:
            return members
        if sum(len(state.leases) for state in self.partitions.values()) < cap:
            return members  # none can hold ``cap``: no count per member (it was most of a receive's cost)
        held: collections.Counter[str] = collections.Counter()
        for state in self.partitions.values():
            held.update(state.held)
        return [m for m in members if m == asking or held[m] < cap]

    def live_members(self, now: float, timeout: float = MEMBER_TIMEOUT) -> list[str]:
        """The members that share the partitions: those that called receive in the last ``timeout`` s."""
        for member in [m for m, seen in self.members.items() if now - seen > timeout]:
            del self.members[member]
        return sorted(self.members)

    def silent(self, now: float, timeout: float) -> list[str]:
        """Members that made no call for ``timeout`` seconds: gone, forgotten here."""
        gone = [m for m, seen in self.seen.items() if now - seen > timeout]
        for member in gone:
            del self.seen[member]
            self.members.pop(member, None)
        return gone


def served_order(partitions: list[int], info: QueueInfo, turn: int) -> list[int]:
    """The order a receive visits a member's partitions: in turn within a tier, and
    the highest priority tier first, except one receive in ``STARVE_GUARD``, which
    starts at the lowest, so that lower tiers are never starved (SPEC X4)."""
    if not partitions:
        return partitions
    shift = turn % len(partitions)
    rotated = partitions[shift:] + partitions[:shift]
    if info.priorities == 1:
        return rotated
    highest_first = turn % STARVE_GUARD != 0
    return sorted(rotated, key=info.tier_of, reverse=highest_first)  # stable: keeps the turn within a tier


def assigned(members: list[str], member: str, partitions: int) -> list[int]:
    """The partitions ``member`` reads among the sorted live ``members``."""
    index, count = members.index(member), len(members)
    if count <= partitions:
        return list(range(index, partitions, count))
    return [index % partitions]


def start_ms(start: object) -> int:
    """Where a new group starts: ``"earliest"``, ``"latest"`` (now), a datetime or epoch ms."""
    from datetime import datetime

    if start == "earliest":
        return 0
    if start == "latest":
        return LATEST
    if isinstance(start, datetime):
        return MessageID.from_datetime(start).timestamp
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return start
    raise InvalidArgument(f"'start' must be 'earliest', 'latest', a datetime or epoch ms, got {start!r}")
