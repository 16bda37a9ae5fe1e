"""Scans and scanners (SPEC C6).

* :class:`Scan` says what to read: ``[start_id, stop_id)`` and a topic set.
* :class:`PartitionScanner` reads one partition in ID order.
* :class:`CombinedPartitionScanner` reads several partitions, each with its
  own Scan, merged in MessageID order; :class:`QueueScanner` is the one that
  reads every partition with the same Scan.

Scanners fetch in chunks of ``caching`` messages (HBase's scanner caching)
from a *source*: the in-process engine, or a remote server. ``next()``
returns None at the end; scanners are iterators and context managers.

An embedded scanner holds no store resources between chunks: each chunk is
a fresh bounded read, so an abandoned scanner costs nothing. Remote scanners
are closed on the server by ``close()`` or by the server's idle timeout.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from . import forks
from .errors import InvalidArgument, QueueNotFound
from .message import (
    MAX_SEQUENCE,
    MAX_TIMESTAMP,
    ROWKEY_LENGTH,
    Message,
    MessageID,
    messages_from_columns,
    partition_prefix,
    topic_filter,
)

if TYPE_CHECKING:
    from .config import QueueInfo

logger = logging.getLogger(__name__)

__all__ = ["CombinedPartitionScanner", "PartitionScanner", "QueueScanner", "Scan"]

DEFAULT_CACHING = 1000
#: A scanner's ``created`` when it is not told which queue it began on (nothing checked).
UNCHECKED: object = object()
_ID_END = b"\xff" * 10


class Cursor(Protocol):
    """Reads one partition chunk by chunk; ``done`` once a chunk came up short."""

    done: bool

    def fetch(self) -> list[Message]: ...

    def fetch_columns(self) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """The next chunk as (cell keys, values), without Message objects."""
        ...

    def close(self) -> None: ...


class ScanSource(Protocol):
    """Where scanners read from: the in-process engine, or a remote server."""

    def open_cursor(self, queue: str, partition_id: int, scan: Scan, caching: int) -> Cursor: ...

    def queue_info(self, name: str, *, fresh: bool = False) -> QueueInfo: ...


class ChunkSource(Protocol):
    def scan_columns(
        self, name: str, start_key: bytes, stop_key: bytes, topics: Collection[bytes] | None, limit: int
    ) -> tuple[Sequence[bytes], Sequence[bytes]]: ...

    def queue_info(self, name: str) -> QueueInfo: ...


class Scan:
    """What a scanner reads: IDs in ``[start_id, stop_id)``, and some topics.

    Args:
        start_id: First ID to return (inclusive); None for the beginning.
        stop_id: ID to stop before (exclusive); None for the end.
        topics: Topics to return; none added means all topics.
    """

    def __init__(
        self,
        start_id: MessageID | None = None,
        stop_id: MessageID | None = None,
        topics: Iterable[str | bytes] | None = None,
    ) -> None:
        for arg, value in (("start_id", start_id), ("stop_id", stop_id)):
            if value is not None and not isinstance(value, MessageID):
                raise TypeError(f"{arg!r} must be a MessageID or None, not {type(value).__name__}")
        self.start_id = start_id
        self.stop_id = stop_id
        self._topics: set[bytes] = set()
        if isinstance(topics, (str, bytes)):
            raise TypeError("'topics' must be a collection of topics, not one topic")
        for topic in topics or ():
            self.add_topic(topic)

    def add_topic(self, topic: str | bytes) -> Scan:
        """Also return messages of ``topic``; returns the scan for chaining."""
        self._topics.add(topic_filter(topic))
        return self

    @property
    def topics(self) -> frozenset[bytes] | None:
        """The topic set, or None for all topics."""
        return frozenset(self._topics) if self._topics else None

    def key_range(self, partition_id: int) -> tuple[bytes, bytes]:
        """The ``[start, stop)`` rowkey range of this scan in one partition."""
        prefix = partition_prefix(partition_id)
        start = prefix + (self.start_id.to_bytes() if self.start_id else b"")
        stop = prefix + (self.stop_id.to_bytes() if self.stop_id else _ID_END)
        return start, stop

    def after(self, cell_key: bytes) -> Scan | None:
        """The rest of this scan after the message of ``cell_key`` (a cursor that lost
        its scanner opens another there); None when nothing can follow it."""
        last = MessageID.from_bytes(cell_key[ROWKEY_LENGTH - 10 : ROWKEY_LENGTH])
        if last.sequence < MAX_SEQUENCE:
            start = MessageID(last.timestamp, last.sequence + 1)
        elif last.timestamp < MAX_TIMESTAMP:
            start = MessageID(last.timestamp + 1, 0)
        else:
            return None
        if self.stop_id is not None and start >= self.stop_id:
            return None
        return Scan(start, self.stop_id, self._topics)

    def __repr__(self) -> str:
        topics = sorted(self._topics) or "all"
        return f"Scan(start_id={self.start_id!r}, stop_id={self.stop_id!r}, topics={topics})"


class _Chunks:
    """Chunks a scan has read (for the logs), and the process it was opened in: held by
    the scanner and by its generator, which must not hold the scanner (see
    :class:`_Scanner`)."""

    __slots__ = ("count", "fork")

    def __init__(self) -> None:
        self.count = 0
        self.fork = forks.generation()  # (a scanner is not carried across fork(): forks.py)

    def read(self, cursor: Cursor) -> list[Message]:
        """The cursor's next chunk, counted."""
        forks.check(self.fork, "this scanner")
        self.count += 1
        return cursor.fetch()


class _Scanner:
    """What every scanner shares: next(), iteration, close(), ``with``.

    The messages come from a generator that holds the cursors, not the scanner: a scan
    left unfinished (a ``break``) is let go at once, and the generator's end closes its
    cursors (a remote one gives back its connection); a cycle would have held them until
    a garbage collection.
    """

    def __init__(self, messages: Generator[Message, None, None], chunks: _Chunks) -> None:
        self._messages, self._chunks = messages, chunks
        self.closed = False

    @property
    def count(self) -> int:
        """Chunks read so far."""
        return self._chunks.count

    def __iter__(self) -> Iterator[Message]:
        # The generator itself: a for loop runs at C speed, and shares the
        # position with next().
        return self._messages

    def __next__(self) -> Message:
        return next(self._messages)

    def next(self) -> Message | None:
        """The next message, or None at the end."""
        return next(self._messages, None)

    def close(self) -> None:
        """Stop the scan and free what it holds."""
        if not self.closed:
            self.closed = True
            self._messages.close()
            logger.debug("closed %s after %d chunk(s)", self, self.count)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_columns(
    source: ScanSource, queue: str, partition_id: int, scan: Scan, caching: int, created: object = UNCHECKED
) -> Iterator[tuple[Sequence[bytes], Sequence[bytes]]]:
    """One partition's chunks as (cell keys, values), the cursor closed at the end; given
    ``created``, of the queue that has it (:func:`check_opened`)."""
    cursor = source.open_cursor(queue, partition_id, scan, caching)
    try:
        check_opened(source, queue, created)
        while not cursor.done:
            keys, values = cursor.fetch_columns()
            if keys:
                yield keys, values
    finally:
        cursor.close()


class OpenedOnAnother(QueueNotFound):
    """A scan's cursors were opened on another queue than the definition it began with
    (:func:`check_opened`). Nothing was read yet: a definition that came from a client's
    cache (up to ``INFO_CACHE_SECONDS`` old) may be read again, fresh, and the scan opened
    again (:meth:`HQueue.get_queue_scanner <hqueue.HQueue.get_queue_scanner>` does)."""


def check_opened(source: ScanSource, queue: str, created: object) -> None:
    """After a scan opened its cursors: its queue is still the one it began on (``created``,
    read from its definition before; UNCHECKED: not checked), so each cursor, which holds the
    queue it was opened on, reads that one. A queue made again under the name has another
    ``created``, and none comes back, so one fresh read after the opening is enough.

    Raises:
        OpenedOnAnother: it is not.
    """
    if created is not UNCHECKED and source.queue_info(queue, fresh=True).created != created:
        raise recreated(queue, OpenedOnAnother)


def recreated(queue: str, error: type[QueueNotFound] = QueueNotFound) -> QueueNotFound:
    """The error of a scan whose queue was deleted and made again under its name while it
    read it (its ``created`` changed): the rest of it would be another queue's messages."""
    return error(queue, f"queue {queue!r} was deleted and created again while this scan read it")


class KeyRangeCursor:
    """A cursor over a rowkey range, one bounded read a chunk.

    It holds nothing between chunks, so an abandoned cursor costs nothing.
    A queue deleted and created again under its name while the cursor reads
    it is another queue (:attr:`QueueInfo.created <hqueue.config.QueueInfo.created>`):
    the next chunk raises QueueNotFound, as it does once the queue is deleted.
    """

    def __init__(self, source: ChunkSource, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.source, self.queue, self.caching = source, queue, caching
        self.start, self.stop = scan.key_range(partition_id)
        self.topics = scan.topics
        self.done = False
        #: The queue's ``created`` when the cursor was opened: each chunk is read from it.
        self.created = source.queue_info(queue).created

    def fetch(self) -> list[Message]:
        return messages_from_columns(*self.fetch_columns())

    def fetch_columns(self) -> tuple[Sequence[bytes], Sequence[bytes]]:
        keys, values = self.source.scan_columns(self.queue, self.start, self.stop, self.topics, self.caching)
        if self.source.queue_info(self.queue).created != self.created:  # (after the read: it read that queue)
            self.done = True
            raise recreated(self.queue)
        if len(keys) < self.caching:
            self.done = True
        else:
            # The smallest key after the last cell: rowkeys are unique.
            self.start = keys[-1] + b"\x00"
        return keys, values

    def close(self) -> None:
        self.done = True


class PartitionScanner(_Scanner):
    """Reads one partition of a queue in MessageID order."""

    def __init__(
        self,
        source: ScanSource,
        queue: str,
        partition_id: int,
        scan: Scan,
        caching: int = DEFAULT_CACHING,
        *,
        created: object = UNCHECKED,
    ) -> None:
        check_caching(caching)
        cursor = source.open_cursor(queue, partition_id, scan, caching)
        _checked(source, queue, created, [cursor])
        self.queue, self.partition_id = queue, partition_id
        chunks = _Chunks()
        super().__init__(_read(cursor, chunks), chunks)
        logger.debug("opened %s with %r", self, scan)

    def __repr__(self) -> str:
        return f"PartitionScanner({self.queue!r}, {self.partition_id})"


class CombinedPartitionScanner(_Scanner):
    """Reads chosen partitions, each with its own Scan, in MessageID order.

    The merge works chunk-wise rather than message-wise: it refills any
    partition that has less than a chunk pending, then emits, sorted, every
    pending message up to the lowest "last fetched" ID of the partitions
    still being read. Everything at or below that bound is known, so the
    order is exact; the sort runs in C over already-sorted runs.
    """

    def __init__(
        self,
        source: ScanSource,
        queue: str,
        scans: Mapping[int, Scan],
        caching: int = DEFAULT_CACHING,
        *,
        created: object = UNCHECKED,
    ) -> None:
        check_caching(caching)
        if not isinstance(scans, Mapping) or not scans:
            raise InvalidArgument("'scans' must be a non-empty mapping of partition id to Scan")
        for pid, scan in scans.items():
            if not isinstance(scan, Scan):
                raise TypeError(f"scan for partition {pid} must be a Scan, not {type(scan).__name__}")
        self.queue, self.caching = queue, caching
        self.partitions = sorted(scans)
        cursors: list[Cursor] = []
        try:
            cursors += (source.open_cursor(queue, pid, scans[pid], caching) for pid in self.partitions)
        except BaseException:
            _close_all(cursors)
            raise
        _checked(source, queue, created, cursors)
        chunks = _Chunks()
        super().__init__(_merged(cursors, caching, chunks), chunks)
        logger.debug("opened %s", self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.queue!r}, partitions={len(self.partitions)})"


def _checked(source: ScanSource, queue: str, created: object, cursors: list[Cursor]) -> None:
    """:func:`check_opened`, the cursors closed if it raises."""
    try:
        check_opened(source, queue, created)
    except BaseException:
        _close_all(cursors)
        raise


def _close_all(cursors: list[Cursor]) -> None:
    for cursor in cursors:
        try:
            cursor.close()
        except Exception as e:  # (the first error is the caller's)
            logger.debug("closing a cursor: %r", e)


def _read(cursor: Cursor, chunks: _Chunks) -> Generator[Message, None, None]:
    """One cursor's messages, the cursor closed at the end."""
    try:
        while not cursor.done:
            yield from chunks.read(cursor)
    finally:
        cursor.close()


def _merged(cursors: list[Cursor], caching: int, chunks: _Chunks) -> Generator[Message, None, None]:
    """The cursors' messages in ID order (see :class:`CombinedPartitionScanner`), the
    cursors closed at the end."""
    try:
        pending: dict[Cursor, list[Message]] = {cursor: [] for cursor in cursors}
        while pending:
            for cursor, messages in pending.items():
                if not cursor.done and len(messages) < caching:
                    messages += chunks.read(cursor)
            reading = [messages[-1] for cursor, messages in pending.items() if not cursor.done]
            out: list[Message] = []
            if reading:
                bound = min(reading)
                for messages in pending.values():
                    cut = bisect_right(messages, bound)
                    out += messages[:cut]
                    del messages[:cut]
            else:
                for messages in pending.values():
                    out += messages
                    messages.clear()
            pending = {c: m for c, m in pending.items() if m or not c.done}
            out.sort()
            yield from out
    finally:
        for cursor in cursors:
            cursor.close()


class QueueScanner(CombinedPartitionScanner):
    """Reads every partition of a queue with one Scan, in MessageID order."""

    def __init__(
        self,
        source: ScanSource,
        queue: str,
        partitions: int,
        scan: Scan,
        caching: int = DEFAULT_CACHING,
        *,
        created: object = UNCHECKED,
    ) -> None:
        if not isinstance(scan, Scan):
            raise TypeError(f"'scan' must be a Scan, not {type(scan).__name__}")
        super().__init__(source, queue, dict.fromkeys(range(partitions), scan), caching, created=created)


#: The most messages a scan fetches a round trip per partition (``caching``): what the wire's i32 carries,
#: on every store alike.
MAX_CACHING = 2**31 - 1


def check_caching(caching: object) -> None:
    """A scan's ``caching``: an int in 1..MAX_CACHING (InvalidArgument)."""
    if not isinstance(caching, int) or isinstance(caching, bool) or not 1 <= caching <= MAX_CACHING:
        raise InvalidArgument(f"'caching' must be an int in 1..{MAX_CACHING}, got {caching!r}")
