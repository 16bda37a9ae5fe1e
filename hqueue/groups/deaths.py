"""A holder's death: what the process holding a group's partition had handed out when it
died counts as failed deliveries (a mixin of :class:`~hqueue.groups.service.GroupService`;
the rules are docs/consumer-groups.md's "A holder that dies counts").

The holder stores a *hand-out mark* per partition (the highest first delivery it handed
out, and its process's token), and marks a retry it hands out again as out (its retry
record ``"2+<token>"``); with key affinity it notes a message held back for its key as not
out (a record of its failures, ``"0"``: none below the mark counts unless out), and marks a
held-back one it hands out as out. The next holder, finding another process's mark, counts a failure
for each message the dead one held, and makes the mark its own. A clean stop, a member's
unseen give-back and a rebalance's hand-over leave nothing to count.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from .. import forks
from ..config import Durability
from ..errors import HQueueError
from ..keys.groups import id_after, state_prefix
from ..message import id_bytes, partition_prefix
from .state import GroupState, PartitionState

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger(__name__)

#: On a store of other processes (HBase: a round trip a write), a partition's hand-out mark
#: is stored at most this often (s): what was handed out after the last one does not count as
#: failed if its holder dies (see GroupDeaths._mark_out). An embedded store's (an unsynced
#: local write) is stored by every receive that hands out more.
OUT_MARK_INTERVAL = 0.1
#: A chunk of the read that counts the messages a holder died holding (cells, bytes).
CRASH_SCAN_CHUNK = (1000, 16 << 20)
#: A retry record's value ends with this while the retry is handed out (not waiting): a
#: holder's death counts it (see GroupDeaths._count_the_crash).
OUT_AGAIN = b"+"
#: This process, in its hand-out marks: a state it reads back after dropping it (a failed
#: write, a partition moved away and back) is no holder's death. A forked child is another.
HOLDER_BYTES = 8
_HOLDER = [os.urandom(HOLDER_BYTES)]


def out_key(group: GroupState, pid: int) -> str:
    """Where a partition's hand-out mark is kept, among its group state."""
    return state_prefix(group.queue, group.name, pid) + "out"


def _another_holder() -> list[object]:
    _HOLDER[0] = os.urandom(HOLDER_BYTES)
    return []


forks.on_fork(_another_holder)


class GroupDeaths:
    """Hand-out marks, and the count of a holder's death (call on a GroupService)."""

    engine: Engine
    _lock: threading.Lock
    _groups: dict[tuple[str, str], GroupState]

    def _init_deaths(self) -> None:
        self._mark_every = 0.0 if self.engine.storage.in_process else OUT_MARK_INTERVAL

    def _after_the_last_holder(
        self, group: GroupState, pid: int, state: PartitionState, mark: bytes, out_again: dict[bytes, bytes]
    ) -> None:
        """A state just read (``mark``: its stored hand-out mark; ``out_again``: its retries
        marked out, by holder): count the last holder's death, if it was another process's."""
        out_mark, holder = mark[:-HOLDER_BYTES], mark[-HOLDER_BYTES:]
        if holder == _HOLDER[0]:  # this process's: its state was dropped here (a failed write, a move), no death
            state.out_mark, state.marked = out_mark, True
        elif mark:
            try:
                self._count_the_crash(group, pid, state, out_mark, {i for i, h in out_again.items() if h == holder})
            except BaseException:  # (a store that failed meanwhile: read again, and counted, next time)
                group.partitions.pop(pid, None)
                raise

    def _mark_if_due(
        self, group: GroupState, pid: int, state: PartitionState, now: float, again: list[bytes], back: list[bytes]
    ) -> None:
        """After a receive's hand-outs from ``pid``: store the mark if it moved (at most every
        ``_mark_every``), or at once with retries handed out ``again`` or messages held ``back``
        (key affinity)."""
        if state.out_written == math.inf:  # (no mark, nothing to count: a clean stop or a hand-over under way)
            return
        state.back_unmarked += back
        if (
            again
            or state.back_unmarked
            or (state.handed_top > state.out_mark and now - state.out_written >= self._mark_every)
        ):
            self._mark_out(group, pid, state, now, again)

    def _clear_out_marks(self, partitions: set[tuple[str, int]] | None = None) -> None:
        """A clean stop, or ``partitions`` handed over to another server (a rebalance): the
        messages in flight there go out again without counting a failure (as when a member
        leaves), so the hand-out marks go, and none is written again here (best effort: a
        mark left counts)."""
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            with group.lock:
                marked = []
                for pid, state in group.partitions.items():
                    if partitions is None or (group.queue, pid) in partitions:
                        state.out_written = math.inf  # (no mark from a receive until the state goes)
                        if state.marked:
                            marked.append((pid, state))
                for pid, state in marked:
                    try:
                        self.engine.writers.write_meta(
                            group.queue, pid, {}, [out_key(group, pid)],
                            Durability.ASYNC_WAL,
                        )  # fmt: skip
                    except Exception as e:  # noqa: BLE001 - a stop goes on (a mark left counts the next time)
                        logger.debug("group %s of %s: hand-out mark of %d left: %s", group.name, group.queue, pid, e)
                    state.marked = False

    def _mark_out(
        self, group: GroupState, pid: int, state: PartitionState, now: float, again: Collection[bytes] = ()
    ) -> None:
        """Store the highest ID handed out here (not synced; see OUT_MARK_INTERVAL),
        and, for messages ``again`` (retries, or with key affinity held-back ones, handed out
        now), that they are out: a holder that dies leaves them, and the next one counts a
        failed delivery for each message it died holding (:meth:`_count_the_crash`). Messages
        held back for their key since the last mark get a record that they are not out (none
        may count below the mark). Best effort: a failed write skips the mark (a crash then
        counts less), never the receive."""
        key = state_prefix(group.queue, group.name, pid)
        out_again = OUT_AGAIN + _HOLDER[0]  # (this holder's: a record a clean stop left is no later death's)
        retries = state.retries
        held_back = state.affinity.back_ids if state.affinity is not None else ()
        back = [i for i in state.back_unmarked if i in held_back]  # (not handed out or gone since)
        puts = {f"{key}retry/{i.hex()}": b"%d" % retries.get(i, 0) for i in back}
        puts.update({f"{key}retry/{i.hex()}": b"%d%s" % (retries.get(i, 0), out_again) for i in again})
        top = max(state.handed_top, state.out_mark)  # (never below what the last mark covered)
        puts[out_key(group, pid)] = top + _HOLDER[0]
        try:
            self.engine.writers.write_meta(group.queue, pid, puts, (), self._mark_durability(group.queue))
        except HQueueError as e:
            logger.debug(
                "group %s of %s: hand-out mark of partition %d not stored: %s", group.name, group.queue, pid, e
            )
            return
        for message_id in (*back, *again):  # (a record each now, which the ack removes)
            retries.setdefault(message_id, 0)
        state.back_unmarked = []
        state.out_mark, state.out_written, state.marked = top, now, True

    def _unseen(self, group: GroupState, pid: int, state: PartitionState, ids: list[bytes]) -> None:
        """Leases given back unseen (a leave, a hand-back: call under ``group.lock``) wait,
        held by nobody: where this process's mark is stored, a record of their failures (none
        for a first delivery) says so, no longer marked out, and a death before they go out
        again does not count them (best effort)."""
        if not ids or not state.marked:
            return
        key = state_prefix(group.queue, group.name, pid)
        retries = state.retries
        try:
            self.engine.writers.write_meta(
                group.queue, pid, {f"{key}retry/{i.hex()}": b"%d" % retries.get(i, 0) for i in ids}, (),
                self._mark_durability(group.queue),
            )  # fmt: skip
        except HQueueError as e:  # (a death then counts them once more)
            logger.debug(
                "group %s of %s: messages given back in partition %d not noted: %s", group.name, group.queue, pid, e
            )
            return
        for message_id in ids:
            retries.setdefault(message_id, 0)

    def _mark_durability(self, queue: str) -> str:
        """Marks are never kept better than the acks they are read against: a SKIP_WAL
        queue's are lost with its acks (a mark that outlived an ack would count it)."""
        skip = self.engine.queue_info(queue).durability == Durability.SKIP_WAL
        return Durability.SKIP_WAL if skip else Durability.ASYNC_WAL

    def _count_the_crash(
        self, group: GroupState, pid: int, state: PartitionState, out_mark: bytes, out_again: set[bytes]
    ) -> None:
        """The last holder of this partition's state died holding messages: those it handed
        out as first deliveries up to ``out_mark`` (its hand-out mark), and the retries it
        marked out again (``out_again``). Each one not finished counts a failed delivery
        (stored), and goes out again now as a retry, or to the dead-letter queue when past
        its retries. So a message that makes its holder itself crash is dead-lettered too
        (its failures were counted only by the holder that died with it). A message
        waiting for its retry at the death (nacked, its lease run out, a failure counted
        already) is not counted again. The mark becomes this process's: a later holder's
        death counts what this one hands out, not these again."""
        prefix, top = partition_prefix(pid), max([out_mark, *out_again])
        start = prefix + state.done
        stop = prefix + id_after(top) if top else start
        crashed: list[bytes] = []
        waiting: list[bytes] = []
        affinity = state.affinity
        while start < stop:  # (in chunks: the values come too, and one may be megabytes)
            keys, _ = self.engine.scan_columns(group.queue, start, stop, group.config.topics, *CRASH_SCAN_CHUNK)
            for cell_key in keys:
                i = id_bytes(cell_key)
                if i in state.acked or i in state.behind:
                    continue
                held = i in out_again or (i <= out_mark and i not in state.retries)
                (crashed if held else waiting).append(i)
                if affinity is not None:  # (each goes out again in its key's order)
                    affinity.keys[i] = affinity.key_of_cell(cell_key)
            if not keys:
                break
            start = prefix + id_after(id_bytes(keys[-1]))
        counts = {i: state.retries.get(i, 0) + 1 for i in crashed}
        key = state_prefix(group.queue, group.name, pid)
        puts = {f"{key}retry/{i.hex()}": str(n).encode() for i, n in counts.items()}
        puts[out_key(group, pid)] = top + _HOLDER[0]
        self.engine.writers.write_meta(group.queue, pid, puts, (), self.engine.queue_info(group.queue).durability)
        state.retries.update(counts)
        state.out_mark = state.handed_top = top
        state.marked = True
        if top:
            state.scan = max(state.scan, id_after(top))  # (the unfinished ones below it go out as retries now)
        now = time.monotonic()
        for message_id in sorted(crashed + waiting):
            state.open.append(message_id)
            state.out_again_at(message_id, now, group.config.max_retries)
        if crashed:
            logger.warning(
                "group %s of %s: partition %d's last holder died holding %d messages not finished: "
                "each counts a failed delivery",
                group.name, group.queue, pid, len(crashed),
            )  # fmt: skip
