"""Idempotent puts' key layout, and the Request a put carries (hqueue/requests.py).

A put that carries a request (a lane and its sequence) leaves a *record*
in the queue's own table, in the same atomic write as its messages, under
the prefix ``0x7FFF`` (the partition that cannot exist: partitions are
below 32767, timers above 0x8000, the topic index at 0xFFFF)::

    0x7FFF + pid (2) + lane (16)  ->  sequence (8) + written at (8, ms) + first ID (10) + count (4)

One record per lane and partition, overwritten by the lane's next put.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import InvalidArgument
from ..message import MessageID, key_after

REQUEST_PREFIX = b"\x7f\xff"
#: A lane's length, in bytes.
LANE_LENGTH = 16
#: The longest ``created`` a request may carry (a queue's hqueue.created is 33 characters).
MAX_CREATED = 64
_VALUE = struct.Struct(">qq10si")


class Request(NamedTuple):
    """Who sends a put: its lane, the put's number on it, and whether it may have gone before."""

    lane: bytes
    sequence: int
    resent: bool = False
    #: The queue's ``created`` the client checked and routed the put by (None: not said).
    created: str | None = None

    def checked(self) -> Request:
        """This request, if it is well formed.

        Raises:
            InvalidArgument: a lane that is not 16 bytes, a sequence below 1, or a
                ``created`` that is no queue's.
        """
        if not isinstance(self.lane, bytes) or len(self.lane) != LANE_LENGTH:
            raise InvalidArgument(f"a request's lane is {LANE_LENGTH} bytes, got {self.lane!r:.60}")
        if not isinstance(self.sequence, int) or not 0 < self.sequence < 2**63:
            raise InvalidArgument(f"a request's sequence is 1 or more, got {self.sequence!r}")
        if self.created is not None and (not isinstance(self.created, str) or len(self.created) > MAX_CREATED):
            raise InvalidArgument(f"a request's created is a queue's hqueue.created, got {self.created!r:.60}")
        return self


class Record(NamedTuple):
    """A lane's last put in a partition: its sequence, when it was written and its IDs."""

    sequence: int
    written_at: int
    first: MessageID
    size: int


def record_key(partition_id: int, lane: bytes) -> bytes:
    return REQUEST_PREFIX + partition_id.to_bytes(2, "big") + lane


def records_range(partition_id: int) -> tuple[bytes, bytes]:
    """The keys of the partition's records: ``[start, stop)``."""
    start = REQUEST_PREFIX + partition_id.to_bytes(2, "big")
    return start, key_after(start)


def pack_record(record: Record) -> bytes:
    return _VALUE.pack(record.sequence, record.written_at, record.first.to_bytes(), record.size)


def unpack_record(value: bytes) -> Record:
    sequence, written_at, first, count = _VALUE.unpack(value)
    return Record(sequence, written_at, MessageID.from_bytes(first), count)
