"""What a consumer group shows without changing anything (SPEC X3): describe, the
messages in flight (pending), and the counts metrics read.

A mixin of :class:`~hqueue.groups.service.GroupService` (as redis-py keeps its
commands in mixins of its client): it reads the state the service holds for
the partitions this process owns.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..deadletters import dead_letter_queue
from ..errors import HQueueError, QueueDisabled, QueueNotFound
from ..ids import wall_clock_ms
from ..lag import Ahead, finished_ahead, partition_lag
from ..message import MessageID
from ..storage.base import oldest_kept
from .limits import GroupLimits, check_pending_limit
from .state import GroupState, PartitionState

if TYPE_CHECKING:
    from ..coordination import Coordinator
    from ..engine import Engine
    from ..storage import Storage


class GroupViews:
    """describe, pending and snapshot, over the service's state (call on a GroupService)."""

    engine: Engine
    coordinator: Coordinator
    storage: Storage
    _lock: threading.Lock
    _groups: dict[tuple[str, str], GroupState]
    limits: GroupLimits

    def _group(self, queue: str, name: str) -> GroupState:
        raise NotImplementedError

    def _partition(self, group: GroupState, pid: int) -> PartitionState:
        raise NotImplementedError

    def _expire(self, group: GroupState, pid: int, state: PartitionState, now: float) -> None:
        raise NotImplementedError

    def _forget_silent(self, group: GroupState, now: float) -> None:
        raise NotImplementedError

    def describe(self, queue: str, name: str) -> dict[str, Any]:
        """Members, and per owned partition: cursors, in flight, retrying, held back, lag,
        and the messages past their retries that wait for the dead-letter queue to take
        them (``dead_letter_waiting``). ``dead_letters`` counts ``<queue>.dlq``; None while
        it cannot be read (disabled, on HBase).

        ``lag_messages`` counts the messages not yet acked: those from the
        completion cursor on, less those acked ahead of it."""
        group = self._group(queue, name)
        info = self.engine.queue_info(queue, fresh=True)
        now = time.monotonic()
        partitions = {}
        counts: dict[int, tuple[MessageID, Ahead, list[bytes]]] = {}
        with group.lock:
            self._forget_silent(group, now)
            members = sorted(group.seen)  # (any call in the last member_timeout: _forget_silent)
            for pid in self.coordinator.owned(queue, info.partitions):
                state = self._partition(group, pid)
                self._expire(group, pid, state, now)
                done = MessageID.from_bytes(state.done)
                counts[pid] = done, finished_ahead(state.acked), sorted(state.behind)
                partitions[pid] = {
                    "done": done,
                    "scan": MessageID.from_bytes(state.scan),
                    "in_flight": len(state.leases),
                    "retrying": len(state.ready) - len(state.unburied),
                    "dead_letter_waiting": len(state.unburied),
                    "dead_lettered": state.dead_lettered,
                    "held_back": len(state.affinity.back_ids) if state.affinity is not None else 0,
                    "acked_ahead": len(state.acked),
                    "retries": sum(state.retries.values()),
                }
        # Counted without the group's lock: a count of every row takes seconds in a deep
        # partition, and every receive and ack of the group (on the event loop) waited for it.
        kept = oldest_kept(info)
        for pid, (done, ahead, behind) in counts.items():
            lag, lag_ms = partition_lag(self.engine, queue, pid, done, group.config.topics, limit=None, ahead=ahead)
            if kept is not None:  # (expired or truncated meanwhile: not lag, as those it counts)
                behind = behind[bisect_left(behind, kept) :]
            if behind:  # unfinished ones the cursor jumped past: lag, the oldest of it
                lag += len(behind)
                lag_ms = max(lag_ms, wall_clock_ms() - MessageID.from_bytes(behind[0]).timestamp)
            partitions[pid].update(lag_messages=lag, lag_millis=lag_ms if lag else 0)
        return {
            "queue": queue,
            "group": name,
            "topics": group.config.topics,
            "start": group.config.start,
            "max_retries": group.config.max_retries,
            "key_affinity": group.config.key_affinity,
            "members": members,
            "partitions": partitions,
            "dead_letters": _count(self.engine, dead_letter_queue(queue)),
        }

    def pending(self, queue: str, name: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The group's messages in flight on the partitions owned here, in (partition, ID)
        order, at most ``limit``: each with its partition, ID, the member holding it (None
        while it waits to be retried), its attempt (1 for a first delivery), the seconds
        its lease has left, or the seconds before it goes out again."""
        check_pending_limit(limit)
        group = self._group(queue, name)
        info = self.engine.queue_info(queue, fresh=True)
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        with group.lock:
            self._forget_silent(group, now)
            for pid in self.coordinator.owned(queue, info.partitions):
                state = self._partition(group, pid)
                self._expire(group, pid, state, now)
                for message_id in sorted({*state.leases, *state.ready}):
                    lease = state.leases.get(message_id)
                    at = state.ready.get(message_id)
                    out.append(
                        {
                            "partition": pid,
                            "id": MessageID.from_bytes(message_id),
                            "member": lease[0] if lease else None,
                            "attempt": state.retries.get(message_id, 0) + 1,
                            "lease_left": max(0.0, lease[1] - now) if lease else None,
                            "retry_in": max(0.0, at - now) if at is not None and not lease else None,
                        }
                    )
                    if len(out) >= limit:
                        return out
        return out

    def snapshot(self) -> list[GroupSnapshot]:
        """Every group held here and its partitions' counts, read from memory only
        (metrics: a scrape costs O(groups x partitions), and reads no row)."""
        with self._lock:
            groups = list(self._groups.values())
        out = []
        now = time.monotonic()
        timeout = self.limits.member_timeout
        for group in groups:
            try:
                kept = oldest_kept(self.engine.queue_info(group.queue))
            except HQueueError:  # (dropped meanwhile)
                kept = None
            with group.lock:
                partitions = list(group.partitions.items())
                members = sum(now - seen <= timeout for seen in group.seen.values())
            out.append(GroupSnapshot(group, members, partitions, kept))
        return out

    def load_all(self) -> None:
        """Hold every stored group's state over every partition owned here (read from
        the store once each), so that metrics cover groups no member has used here yet."""
        prefix = "groups/"
        for key in self.storage.list_meta(prefix):
            queue, _, name = key[len(prefix) :].rpartition("/")
            try:
                group = self._group(queue, name)
                partitions = self.engine.queue_info(queue).partitions
                with group.lock:
                    for pid in self.coordinator.owned(queue, partitions):
                        if pid not in group.partitions:
                            self._partition(group, pid)
            except HQueueError:  # dropped meanwhile, or the store is away: the next round
                continue


@dataclass
class GroupSnapshot:
    """What metrics read of one group: its state, live members, and the partitions held
    here. A scrape reads each partition's counts (``done``, ``finished``, leases) without
    the lock: each is one read, and a lag never depends on two of them at once."""

    group: GroupState
    members: int
    partitions: list[tuple[int, PartitionState]]
    #: The lowest ID the queue may still hold (storage.base.oldest_kept); None: any.
    kept: bytes | None = None

    def behind(self, state: PartitionState) -> tuple[bytes | None, int, int]:
        """Of the unfinished messages the partition's cursor moved past (``behind``): the
        oldest still stored (None: none is), how many are, and how many are no longer
        (expired, truncated). Those gone count as finished: they are not lag, and each
        is finished for good once a receive finds it gone (as an ack would)."""
        with self.group.lock:
            return self._behind(state)

    def _behind(self, state: PartitionState) -> tuple[bytes | None, int, int]:
        behind = sorted(state.behind)
        gone = bisect_left(behind, self.kept) if self.kept is not None else 0
        return (behind[gone] if gone < len(behind) else None), len(behind) - gone, gone

    def progress(self, state: PartitionState) -> tuple[bytes, int, Ahead]:
        """What the lag book counts from (lag.py's Progress), read under the group's lock:
        the cursor, what was finished (with those behind it gone), and what was finished
        ahead of it, less the ones behind it still stored (lag)."""
        with self.group.lock:
            _, alive, gone = self._behind(state)
            return state.done, state.finished + gone, finished_ahead(state.acked, alive)


def _count(engine: Engine, queue: str) -> int | None:
    """Messages in ``queue`` (0 if it does not exist; None if it cannot be read now:
    a disabled table on HBase)."""
    try:
        info = engine.queue_info(queue, fresh=True)
        return sum(
            partition_lag(engine, queue, pid, MessageID(0), None, limit=None)[0] for pid in range(info.partitions)
        )
    except QueueNotFound:
        return 0
    except QueueDisabled:
        return None
