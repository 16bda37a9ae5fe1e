"""Idempotent puts: a put sent again after a broken connection is written once.

A remote client cannot tell a put the server never got from one whose
answer was lost when the connection broke (the server was killed, or a
shared store's serving process went). It sends the put again, and without
more the second copy would be stored under new IDs (a timer would fire
twice). So each put a client sends carries a :class:`Request`, as Kafka's
idempotent producer numbers its batches:

* **Lanes** (:class:`Lanes`, client side). A lane is 16 random bytes that
  carries one put at a time, numbered 1, 2, 3, ... A call takes a free lane
  (or makes one), sends every try of its put with the lane's next sequence,
  and gives the lane back when it has its answer. A lane whose put ended
  unknown (:class:`~hqueue.errors.OutcomeUnknown`: a stalled server may still
  write it) is never used again.
* **Records** (:class:`RequestLog`, on the partition's writer). A put with a
  request writes its lane's record (keys/requests.py) in the same atomic
  write as its messages. Before writing, the writer looks the lane up: in
  what it holds, and, for a put marked ``resent``, in the store (another
  process may have written the first copy before it died: the store's
  fence makes it the only writer since). A put whose lane and sequence are
  recorded is answered with the recorded IDs, and nothing is written.

Records are kept :data:`RETENTION_MS` (an hour) after their lane's last
put, well past any call's deadline: a client sends a put again only within
its call. A client that sends no request (an older client, another
language's) gets the old behaviour: its put sent again is stored again.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import HQueueError, InvalidArgument, OutcomeUnknown
from .ids import wall_clock_ms
from .keys.requests import LANE_LENGTH, Record, Request, pack_record, record_key, records_range, unpack_record
from .message import MessageID

#: How long a lane's record is kept after its last put, in ms.
RETENTION_MS = 3_600_000
#: Lanes a partition's writer holds in memory (the store keeps them all).
HELD_LANES = 1024
#: The writer looks for expired records after this many recorded puts.
SWEEP_EVERY = 4096
#: Records read (and expired ones deleted) per sweep.
SWEEP_LIMIT = 10_000

Cell = tuple[bytes, bytes]


class Lane:
    """One put at a time, numbered: see :class:`Lanes`. ``created``: the queue definition its
    put is checked and routed by (set for each put; None: not said)."""

    __slots__ = ("id", "sequence", "created")

    def __init__(self) -> None:
        self.id, self.sequence = os.urandom(LANE_LENGTH), 0
        self.created: str | None = None

    def request(self, resent: bool) -> Request:
        return Request(self.id, self.sequence, resent, self.created)


class Lanes:
    """A client's free lanes (safe from many threads and tasks)."""

    def __init__(self) -> None:
        self._free: list[Lane] = []
        self._lock = threading.Lock()

    @contextmanager
    def lane(self) -> Iterator[Lane]:
        """A free lane, on its next sequence, for one put's tries.

        It is free again once the put has its answer (IDs, or an error the
        server answered, or one that says nothing was sent). After any other
        end (OutcomeUnknown, a cancelled task) it is never used again: a
        stalled server may still write its put, and a lane's puts must reach
        the writer in their order.
        """
        with self._lock:
            lane = self._free.pop() if self._free else Lane()
        lane.sequence += 1
        try:
            yield lane
        except HQueueError as e:
            if not isinstance(e, OutcomeUnknown):
                self._give(lane)
            raise
        else:
            self._give(lane)

    def _give(self, lane: Lane) -> None:
        with self._lock:
            self._free.append(lane)


class RequestLog:
    """The lanes' last puts in one partition, as its writer knows them (call under its lock)."""

    def __init__(self, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._held: OrderedDict[bytes, Record] = OrderedDict()
        self._clock = clock
        self._recorded = 0

    def answered(self, read: Callable[[bytes], bytes | None], pid: int, request: Request, count: int) -> Record | None:
        """The record of ``request`` if its put was written already, else None.

        ``read(key)`` reads a record from the store; it is asked only for a
        put marked resent that this writer does not hold.

        Raises:
            InvalidArgument: the lane's put of that sequence had another number of messages.
        """
        record = self._held.get(request.lane)
        if record is None and request.resent:
            value = read(record_key(pid, request.lane))
            record = unpack_record(value) if value else None
        if record is None or record.sequence < request.sequence:
            return None
        if record.sequence > request.sequence:
            raise InvalidArgument(
                f"request {request.lane.hex()}/{request.sequence} is older than its lane's last put "
                f"({record.sequence}): a lane carries its puts in order"
            )
        if record.size != count:
            raise InvalidArgument(
                f"request {request.lane.hex()}/{request.sequence} was a put of {record.size} message(s), "
                f"sent again with {count}"
            )
        return record

    def record(self, request: Request, first: MessageID, count: int) -> Record:
        """The record of ``request``'s put (:meth:`cell` writes it with the put's messages)."""
        return Record(request.sequence, self._clock(), first, count)

    @staticmethod
    def cell(pid: int, lane: bytes, record: Record) -> Cell:
        return record_key(pid, lane), pack_record(record)

    def written(self, lane: bytes, record: Record) -> None:
        """The put of ``lane`` recorded by ``record`` is stored."""
        held = self._held
        held[lane] = record
        held.move_to_end(lane)
        if len(held) > HELD_LANES:
            held.popitem(last=False)
        self._recorded += 1

    def sweep_due(self) -> bool:
        """Whether enough puts were recorded since the last sweep (:meth:`expired`)."""
        if self._recorded < SWEEP_EVERY:
            return False
        self._recorded = 0
        return True

    def expired(self, scan: Callable[[bytes, bytes, int], list[Cell]], pid: int) -> list[bytes]:
        """The keys of the partition's records older than :data:`RETENTION_MS` (to delete)."""
        oldest = self._clock() - RETENTION_MS
        cells = scan(*records_range(pid), SWEEP_LIMIT)
        return [key for key, value in cells if unpack_record(value).written_at < oldest]
