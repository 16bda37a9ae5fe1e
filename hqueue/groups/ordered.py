"""What a receive hands out of a partition in a group with key affinity (a mixin of
:class:`~hqueue.groups.service.GroupService`; the rules are in affinity.py).

In order: messages due for a retry (in ID order, each key's only while no
earlier one of it still waits, and only to the member holding the key, if
any), then held-back messages whose key is free for the member, then new
ones, each held back if its key is not free.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..keys.groups import id_after
from ..message import id_bytes, partition_prefix
from .handout import Handout
from .limits import GroupLimits
from .state import GroupState, PartitionState

if TYPE_CHECKING:
    from ..engine import Engine

#: Rows a scan for new messages reads at least, when some may be held back.
_SCAN_CHUNK = 100


class InOrder:
    """_take_in_order (call on a GroupService)."""

    engine: Engine
    limits: GroupLimits

    def _read(self, queue: str, pid: int, message_id: bytes) -> tuple[bytes, bytes] | None:
        raise NotImplementedError

    def _acked(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> int:
        raise NotImplementedError

    def _bury(self, group: GroupState, pid: int, state: PartitionState, message_id: bytes, *, at_once: bool) -> None:
        raise NotImplementedError

    def _read_new(
        self, group: GroupState, pid: int, state: PartitionState, asked: int, room: int
    ) -> tuple[Sequence[bytes], Sequence[bytes], bool, bytes | None]:
        """Up to ``asked`` cells after the partition's scan cursor, about ``room`` bytes of
        them (Storage.scan's max_bytes); whether they reach the partition's end: fewer
        than asked, and not for the bytes (acked ones after a restart, or held-back ones,
        may have taken those); and, when they do and the group reads some topics only
        (without the topic index), where the scan cursor may go once all of them are taken:
        past the partition's last row when the read began (rows are seen in ID order), or
        past the last one read if that is further (never back), not past the last one of
        the group's topics. Without it, each receive read again every row of other topics after
        that one, to the partition's end (1.3 s a receive over 5M rows: an attacker pass)."""
        topics = group.config.topics
        last = (
            self.engine.storage.last_rowkey(group.queue, pid) if self.engine.reads_past(group.queue, topics) else None
        )
        keys, values = self.engine.scan_columns(
            group.queue, partition_prefix(pid) + state.scan, partition_prefix(pid + 1), topics, asked, room
        )
        ended = len(keys) < asked and sum(map(len, keys)) + sum(map(len, values)) < room
        past = id_after(id_bytes(last)) if ended and last is not None else None
        return keys, values, ended, past

    def _take_in_order(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, limit: int, out: Handout
    ) -> None:
        """Lease up to ``limit`` of the partition's messages to ``member``, each key in order (under ``group.lock``)."""
        room = limit - self._due_in_order(group, pid, state, member, deadline, limit, out)
        if room > 0 and not out.full:
            room -= self._held_back(group, pid, state, member, deadline, room, out)
        if room > 0 and not out.full:
            self._new_in_order(group, pid, state, member, deadline, room, out)

    def _handed(
        self,
        group: GroupState,
        pid: int,
        state: PartitionState,
        ids: list[bytes],
        member: str,
        deadline: float,
        out: Handout,
        put_back: Callable[[list[bytes]], None] | None = None,
    ) -> int:
        """Read and lease ``ids`` to ``member`` while the reply has room; how many. Those
        left for a later receive go to ``put_back`` (None: they wait where they are); those
        gone from the store (TTL, truncate) are finished after that, since finishing one
        moves the group's cursor past every ID found nowhere."""
        taken: list[bytes] = []
        left: list[bytes] = []
        gone: list[bytes] = []
        for index, message_id in enumerate(ids):
            if out.full:
                left = ids[index:]
                break
            cell = self._read(group.queue, pid, message_id)
            if cell is None:
                gone.append(message_id)
                continue
            taken.append(message_id)
            out.add(cell[0], cell[1], state.retries.get(message_id, 0) + 1)
        if taken:
            state.lease(taken, member, deadline)
            out.again += taken
        if put_back is not None:
            put_back(left)
        if gone:
            self._acked(group, pid, state, gone)
        return len(taken)

    def _due_in_order(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, limit: int, out: Handout
    ) -> int:
        affinity = state.affinity
        assert affinity is not None
        if not state.ready:
            return 0
        if len(state.ready_heap) > 2 * len(state.ready) + 64:  # leased again since: drop what is stale
            state.ready_heap = [(at, i) for i, at in state.ready.items()]
            heapq.heapify(state.ready_heap)
        now = time.monotonic()
        blocked: set[bytes] = set()
        chosen: list[bytes] = []
        for message_id in sorted(state.ready):
            if len(chosen) >= limit:
                break
            key = affinity.keys[message_id]
            if key in blocked:
                continue
            if message_id in state.unburied:  # past its retries: never handed out again
                if state.ready[message_id] <= now:
                    self._bury(group, pid, state, message_id, at_once=False)  # its dead-letter write, again
                if message_id in state.ready:  # the dead-letter queue still refuses it: its key waits
                    blocked.add(key)
                continue
            if state.ready[message_id] > now or not affinity.may_retry(key, member):
                blocked.add(key)  # its later ones wait behind it
                continue
            chosen.append(message_id)
        return self._handed(group, pid, state, chosen, member, deadline, out)  # (those left stay in ready)

    def _held_back(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, limit: int, out: Handout
    ) -> int:
        assert state.affinity is not None
        if not state.affinity.back:
            return 0
        back = state.affinity.take_back(member, limit)
        return self._handed(group, pid, state, back, member, deadline, out, state.affinity.give_back)

    def _new_in_order(
        self, group: GroupState, pid: int, state: PartitionState, member: str, deadline: float, room: int, out: Handout
    ) -> None:
        affinity = state.affinity
        assert affinity is not None
        span = self.limits.max_span - state.in_flight
        while room > 0 and span > 0 and not out.full:
            asked = min(span, max(room, _SCAN_CHUNK)) + state.acked_ahead_of_scan
            found_keys, found_values, ended, past = self._read_new(group, pid, state, asked, out.room)
            taken: list[bytes] = []
            for cell_key, value in zip(found_keys, found_values, strict=True):
                if room <= 0 or span <= 0 or out.full:
                    break
                message_id = id_bytes(cell_key)
                state.scan = id_after(message_id)
                if message_id in state.acked:  # after a restart: acked before it
                    continue
                key = affinity.key_of_cell(cell_key)
                state.open.append(message_id)
                span -= 1
                if state.retries.get(message_id, 0) > group.config.max_retries:  # its holder went before
                    affinity.keys[message_id] = key  # its dead-letter write: that is due, not a delivery
                    state.out_again_at(message_id, time.monotonic(), group.config.max_retries)
                    continue
                if not affinity.new_for(key, member):
                    affinity.hold_back(message_id, key)
                    out.back.append(message_id)  # (noted where the mark is: not handed out below it)
                    continue
                affinity.keys[message_id] = key
                taken.append(message_id)
                if message_id in state.retries:  # (a record read past the cursor: marked out, as a retry is)
                    out.again.append(message_id)
                out.add(cell_key, value, state.retries.get(message_id, 0) + 1)
                room -= 1
            else:  # every one read was gone through: rows of other topics after them too
                if past is not None:  # (never back: one written after `last` was read may be among them)
                    state.scan = max(state.scan, past)
            if taken:
                state.lease(taken, member, deadline)
                state.handed_top = taken[-1]
            if ended:
                return
