"""The timers' key layout (SPEC X1), and the Timer handle.

A timer is stored in the queue's own table, in the partition's *timer
range*: rows whose 2-byte prefix is ``pid | 0x8000`` (real partitions are
below 32768, so the two ranges never meet). Its cell key is::

    timer_prefix(pid) + due (8 bytes, ms) + 0x0000 + write ID (10 bytes) + topic

so the store keeps timers sorted by due time, and the write ID (taken from
the partition's ID allocator) makes each one unique. One more cell per
partition, under the highest due time, remembers the partition's highest
timer write ID (``high_water_key``). The firing loop is hqueue/timers.py.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from ..errors import InvalidArgument, InvalidPartition
from ..ids import wall_clock_ms
from ..message import MAX_PARTITIONS, MAX_TIMESTAMP, ROWKEY_LENGTH, MessageID, key_after

TIMER_FLAG = 0x8000
_TIMER_ROW = struct.Struct(">HQH")
#: Where a timer's write ID starts and its topic starts, in its cell key.
_ID_AT, _TOPIC_AT = ROWKEY_LENGTH, ROWKEY_LENGTH + 10
#: The cell that remembers a partition's highest timer write ID (above every due time).
_HIGH_WATER_DUE = 2**64 - 1


@dataclass(frozen=True, order=True)
class Timer:
    """A pending timer message, as returned by ``put(..., delay=…)``.

    Pass it to :meth:`HQueue.cancel <hqueue.HQueue.cancel>`; ``str(timer)``
    gives a form that :meth:`parse` (and ``hqueue cancel``) reads back.

    Attributes:
        partition_id: Where the message will be written.
        due: Epoch milliseconds at which it is delivered.
        id: Its write ID (unique within the partition, not across queues).
        queue: The queue it is a timer of (None: a handle read from its text, which does
            not say): a queue refuses to cancel another queue's timer, whose partition,
            due time and ID may well be those of one of its own.
    """

    partition_id: int
    due: int
    id: MessageID
    queue: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.partition_id}/{self.due}/{self.id}"

    @classmethod
    def parse(cls, text: str) -> Timer:
        """Read back ``str(timer)``: ``"pid/due/timestamp:sequence"``."""
        try:
            pid, due, message_id = text.strip().split("/")
            timer = cls(int(pid), int(due), MessageID.parse(message_id))
            check_due(timer.due)
            return timer
        except (ValueError, TypeError, InvalidArgument):
            raise InvalidArgument(
                f"not a timer handle: {text!r} (expected 'partition/due/timestamp:sequence')"
            ) from None

    @property
    def due_datetime(self) -> datetime:
        return MessageID(self.due).datetime


def timer_prefix(partition_id: int) -> bytes:
    return (partition_id | TIMER_FLAG).to_bytes(2, "big")


def timer_row(partition_id: int, due: int) -> bytes:
    return _TIMER_ROW.pack(partition_id | TIMER_FLAG, due, 0)


def timer_cell_keys(
    partition_id: int, due: int | Sequence[int], ids: Iterable[MessageID], topics: Iterable[bytes]
) -> list[bytes]:
    """The cell keys of timers: one ``due`` for them all, or one per timer."""
    if isinstance(due, int):
        row = timer_row(partition_id, due)
        return [row + i.to_bytes() + t for i, t in zip(ids, topics, strict=True)]
    head = partition_id | TIMER_FLAG
    rows = [_TIMER_ROW.pack(head, d, 0) for d in due]
    return [r + i.to_bytes() + t for r, i, t in zip(rows, ids, topics, strict=True)]


def high_water_key(partition_id: int) -> bytes:
    return _TIMER_ROW.pack(partition_id | TIMER_FLAG, _HIGH_WATER_DUE, 0)


#: The qualifier of the cell that keeps a partition's highest timer write ID.
HIGH_WATER_QUALIFIER = b"timer-high-water"


def high_water_range(partition_id: int) -> tuple[bytes, bytes]:
    """The key range holding the partition's high-water cell."""
    key = high_water_key(partition_id) + HIGH_WATER_QUALIFIER
    return key, key + b"\x00"


def due_of(key: bytes) -> int:
    return int.from_bytes(key[2:10], "big")


def id_of(key: bytes) -> MessageID:
    return MessageID.from_bytes(key[_ID_AT:_TOPIC_AT])


def topic_of(key: bytes) -> bytes:
    return key[_TOPIC_AT:]


def pending_range(partition_id: int, until: int | None = None, since: int = 0) -> tuple[bytes, bytes]:
    """The key range of the partition's timers due at ``since`` or after and before
    ``until`` (None: all of them).

    Starting at ``since`` rather than at the range's head matters on RocksDB: a
    fired timer leaves a tombstone until compaction, and a scan from the head
    steps over every one of them (at 10,000 fires a second, most of a fire's CPU).
    """
    stop = _TIMER_ROW.pack(
        partition_id | TIMER_FLAG, min(until, MAX_TIMESTAMP) if until is not None else MAX_TIMESTAMP, 0
    )
    return (timer_row(partition_id, since) if since else timer_prefix(partition_id)), stop


#: The latest due time a timer may have (epoch ms): what scheduleTimers takes. One
#: below the largest timestamp, which ends :func:`pending_range` (a timer due then
#: would be pending and never counted, listed or fired).
MAX_DUE = MAX_TIMESTAMP - 1


def check_due(due: object) -> int:
    """``due`` if it is a timer's due time (epoch ms in 0..MAX_DUE); InvalidArgument otherwise."""
    if not isinstance(due, int) or isinstance(due, bool) or not 0 <= due <= MAX_DUE:
        raise InvalidArgument(f"a timer's due time must be epoch ms in 0..{MAX_DUE}, got {due!r}")
    return due


def one_timer_range(timer: Timer) -> tuple[bytes, bytes]:
    """The key range holding exactly ``timer``'s cell (its topic is not in the handle).

    Raises:
        InvalidArgument: a due time no timer can have (a handle made up, not returned by a put).
    """
    check_due(timer.due)
    prefix = timer_row(timer.partition_id, timer.due) + timer.id.to_bytes()
    return prefix, key_after(prefix)


def due_ms(deliver_at: datetime | int | Sequence[datetime | int] | None, delay: float | None) -> int | list[int]:
    """The due time in epoch ms from ``deliver_at`` (a datetime or epoch ms, or a
    sequence of them: one per message) or ``delay`` (seconds)."""
    if (deliver_at is None) == (delay is None):
        raise TypeError("give 'deliver_at' or 'delay', not both")
    if delay is not None:
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay < math.inf:
            raise InvalidArgument(f"'delay' must be finite seconds >= 0, got {delay!r}")
        return _checked(wall_clock_ms() + round(delay * 1000))
    if isinstance(deliver_at, (list, tuple)):
        return [_one_due(d) for d in deliver_at]
    return _one_due(deliver_at)  # type: ignore[arg-type]


def _one_due(deliver_at: datetime | int) -> int:
    if isinstance(deliver_at, datetime):
        return _checked(MessageID.from_datetime(deliver_at).timestamp)
    if isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
        return _checked(deliver_at)
    raise TypeError(
        "'deliver_at' must be a datetime or epoch milliseconds (or a list of them, one per message),"
        f" not {type(deliver_at).__name__}"
    )


def _checked(due: int) -> int:
    if not 0 <= due <= MAX_DUE:
        raise InvalidArgument(f"a due time must be in 0..{MAX_DUE} ms, got {due}")
    return due


def check_dues(due: int | Sequence[int], count: int) -> int | list[int]:
    """``due`` checked for a batch of ``count`` timers: one due time, or one per timer.

    Raises:
        InvalidArgument: a due time outside 0..MAX_DUE, or not one per message.
    """
    if isinstance(due, bool):
        raise InvalidArgument(f"a due time must be epoch ms, got {due!r}")
    if isinstance(due, int):
        return _checked(due)
    dues = list(due)
    if len(dues) != count:
        raise InvalidArgument(f"{len(dues)} due times for {count} messages: give one, or one per message")
    for one in dues:
        if not isinstance(one, int) or isinstance(one, bool):
            raise InvalidArgument(f"a due time must be epoch ms, got {one!r}")
        _checked(one)
    return dues


def kept_dues(due: int | list[int], ids: Sequence[MessageID], ttl: int) -> int | list[int]:
    """The due times a queue keeps for timers written with ``ids``: ``due`` (one for them all,
    or one per timer), except that on a queue with a TTL (``ttl`` > 0) a due time before its
    timer's ID is the ID's time, about when it was written. A timer's TTL counts from its due
    time: one due further back than the TTL would expire as it was written, and one just inside
    it before the firing loop came to it. Such a timer fires at once either way. Taken from the
    ID, not from a clock, the rule gives every client the handles the server keeps, whatever
    its clock, and a put sent again the same ones."""
    if not ttl:
        return due
    if isinstance(due, int):
        return [max(due, i.timestamp) for i in ids]
    return [max(one, i.timestamp) for one, i in zip(due, ids, strict=True)]


def timer_handles(queue: str, partition_id: int, due: int | Sequence[int], ids: Sequence[MessageID]) -> list[Timer]:
    """The handles of ``queue``'s timers written with ``ids``: one ``due`` for them all, or one per timer."""
    if isinstance(due, int):
        return [Timer(partition_id, due, i, queue) for i in ids]
    return [Timer(partition_id, d, i, queue) for d, i in zip(due, ids, strict=True)]


def timer_of(queue: str, timer: object) -> Timer:
    """``timer`` (a :class:`Timer`, or its handle's text) as a timer of ``queue``.

    Raises:
        InvalidArgument: text that is not a handle, or a timer of another queue.
        TypeError: neither a Timer nor text.
    """
    if isinstance(timer, str):
        return Timer.parse(timer)
    if not isinstance(timer, Timer):
        raise TypeError(f"'timer' must be a Timer (from put(..., delay=…)) or its handle, not {type(timer).__name__}")
    # (checked here for every store: through a server a bool partition was sent as 1 and a
    # float due as its int, and a str partition failed inside the client)
    if not isinstance(timer.partition_id, int) or isinstance(timer.partition_id, bool):
        raise TypeError(f"a timer's partition_id must be an int, not {type(timer.partition_id).__name__}")
    if not 0 <= timer.partition_id < MAX_PARTITIONS:
        raise InvalidPartition(f"a timer's partition_id must be in 0..{MAX_PARTITIONS - 1}, got {timer.partition_id}")
    check_due(timer.due)
    if not isinstance(timer.id, MessageID):
        raise TypeError(f"a timer's id must be a MessageID, not {type(timer.id).__name__}")
    if timer.queue is not None and timer.queue != queue:
        raise InvalidArgument(
            f"timer {timer} is a timer of queue {timer.queue!r}, not of {queue!r}: give it to its own queue "
            "(two queues' timers may have the same partition, due time and ID)"
        )
    return timer


class Fired(NamedTuple):
    """What one firing pass over a partition did (``Engine.fire_timers``)."""

    #: How many timers fired.
    fired: int
    #: Every timer of the partition still pending is due at this time or later.
    floor: int
    #: The earliest due time still pending (None: none is).
    next_due: int | None


def is_high_water(key: bytes) -> bool:
    """Whether a cell key is a partition's high-water cell (one per partition, rewritten)."""
    return key[:1] >= b"\x80" and key[2:10] == b"\xff" * 8
