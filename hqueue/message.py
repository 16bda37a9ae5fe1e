"""Messages, message IDs and the rowkey codec (SPEC C1).

A message lives in one HBase-style cell:

* rowkey = partition id (2 bytes) + timestamp (8 bytes) + sequence (2 bytes),
  all big-endian, so rows sort by partition and then by MessageID;
* column family ``message``, qualifier = the topic, value = the payload.

The storage layer moves *cells* around as ``(cell_key, value)`` pairs where
``cell_key = rowkey + topic``: HBase's own KeyValue layout, flattened.

:class:`Message` is an immutable tuple subclass on purpose. Scanners build
millions of messages a second, and a tuple built by ``map``/``zip`` costs no
Python frame per message; the tuple layout is an implementation detail.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache, partial
from itertools import chain, repeat
from operator import add, getitem, itemgetter
from typing import Any, NamedTuple

from .errors import InvalidArgument, InvalidMessage

__all__ = [
    "MAX_PARTITIONS",
    "MAX_SEQUENCE",
    "successor",
    "ROWKEY_LENGTH",
    "Message",
    "MessageID",
    "Topic",
    "decode_rowkey",
    "encode_rowkey",
]

#: Sequence numbers within one millisecond of one partition: 0..MAX_SEQUENCE.
MAX_SEQUENCE = 32767
#: A queue has 1..MAX_PARTITIONS partitions (partition ids are Java shorts).
MAX_PARTITIONS = 32767
#: Topics above this many bytes are rejected (a message's, and a read's or a group's).
MAX_TOPIC_BYTES = 1024
#: Bytes in a rowkey: 2 (partition) + 8 (timestamp) + 2 (sequence).
ROWKEY_LENGTH = 12
MAX_TIMESTAMP = 2**63 - 1

_ROWKEY = struct.Struct(">HQH")
_ID = struct.Struct(">QH")
_PID = struct.Struct(">H")
_NO_PARTITION = 0xFFFF
_NO_ID = bytes(10)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


class _MessageIDFields(NamedTuple):
    timestamp: int
    sequence: int


#: The last millisecond of the year 9999: the latest time a command (CLI, shell, console) takes.
LATEST_MS = 253_402_300_799_999


class MessageID(_MessageIDFields):
    """The ID the server gives a message: ``(timestamp, sequence)``.

    IDs are totally ordered (by timestamp, then sequence), hashable and
    immutable. ``timestamp`` is milliseconds since the epoch.

    Args:
        timestamp: Milliseconds since the epoch, ``>= 0``.
        sequence: Number within the millisecond, ``0..32767``.
    """

    __slots__ = ()

    def __new__(cls, timestamp: int, sequence: int = 0) -> MessageID:
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise TypeError(f"'timestamp' must be an int, not {type(timestamp).__name__}")
        if not isinstance(sequence, int) or isinstance(sequence, bool):
            raise TypeError(f"'sequence' must be an int, not {type(sequence).__name__}")
        if not 0 <= timestamp <= MAX_TIMESTAMP:
            raise InvalidArgument(f"'timestamp' must be in 0..2**63-1, got {timestamp}")
        if not 0 <= sequence <= MAX_SEQUENCE:
            raise InvalidArgument(f"'sequence' must be in 0..{MAX_SEQUENCE}, got {sequence}")
        return super().__new__(cls, timestamp, sequence)

    @classmethod
    def from_datetime(cls, when: datetime, sequence: int = 0) -> MessageID:
        """The first ID at ``when`` (naive datetimes are taken as UTC)."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        # (in whole numbers: timestamp() * 1000, a float, put 1 in 5 of 2038's milliseconds one early)
        return cls((when - _EPOCH) // _MILLISECOND, sequence)

    @classmethod
    def parse(cls, text: str) -> MessageID:
        """Parse ``"1700000000000"``, ``"1700000000000:5"`` or an ISO time.

        Raises:
            ValueError: ``text`` is none of those forms.
        """
        text = text.strip()
        head, _, tail = text.partition(":")
        if head.isdigit() and (not tail or tail.isdigit()):
            return cls(int(head), int(tail or 0))
        try:
            return cls.from_datetime(datetime.fromisoformat(text))
        except ValueError:
            raise InvalidArgument(
                f"not a message ID or ISO time: {text!r} (use 'millis', 'millis:sequence' or '2026-11-22T10:00')"
            ) from None

    @property
    def datetime(self) -> datetime:
        """The timestamp as an aware UTC datetime."""
        return _EPOCH + self.timestamp * _MILLISECOND

    def to_bytes(self) -> bytes:
        """The 10 bytes that follow the partition id in a rowkey."""
        return _ID.pack(self.timestamp, self.sequence)

    @classmethod
    def from_bytes(cls, data: bytes) -> MessageID:
        """Inverse of :meth:`to_bytes`."""
        return tuple.__new__(cls, _ID.unpack(data))

    def __repr__(self) -> str:
        return f"MessageID({self.timestamp}, {self.sequence})"

    def __str__(self) -> str:
        return f"{self.timestamp}:{self.sequence}"


def encode_rowkey(partition_id: int, message_id: MessageID) -> bytes:
    """The 12-byte rowkey of ``message_id`` in ``partition_id``."""
    if not 0 <= partition_id < MAX_PARTITIONS:
        raise InvalidArgument(f"'partition_id' must be in 0..{MAX_PARTITIONS - 1}, got {partition_id}")
    return _ROWKEY.pack(partition_id, message_id.timestamp, message_id.sequence)


def decode_rowkey(rowkey: bytes) -> tuple[int, MessageID]:
    """Inverse of :func:`encode_rowkey`: ``(partition_id, message_id)``.

    Raises:
        ValueError: ``rowkey`` is not 12 bytes or holds an invalid ID.
    """
    if len(rowkey) != ROWKEY_LENGTH:
        raise InvalidArgument(f"a rowkey is {ROWKEY_LENGTH} bytes, got {len(rowkey)}")
    pid, timestamp, sequence = _ROWKEY.unpack(rowkey)
    if pid >= MAX_PARTITIONS or sequence > MAX_SEQUENCE or timestamp > MAX_TIMESTAMP:
        raise InvalidArgument(f"invalid rowkey {rowkey.hex()}")
    return pid, tuple.__new__(MessageID, (timestamp, sequence))


def partition_prefix(partition_id: int) -> bytes:
    """The 2-byte prefix every rowkey of ``partition_id`` starts with."""
    return _PID.pack(partition_id)


def key_after(prefix: bytes) -> bytes:
    """The smallest key above ``prefix`` and every key that starts with it (same length)."""
    return (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")


class Topic(bytes):
    """A message's topic: the bytes stored, and equal to the ``str`` it was given as.

    Topics go in as ``str`` (encoded as UTF-8) or ``bytes`` and are stored as
    bytes (an HBase column qualifier), so a topic comes back as ``bytes``, as
    in every other place of the API; but ``Message("crawler", b"x").topic ==
    "crawler"`` holds, as does ``== b"crawler"``, so a comparison with the
    ``str`` a user wrote is never silently False. ``str(topic)`` is the text
    (with ``\\xNN`` for bytes that are not UTF-8). Its hash is the bytes', which
    Python makes the same as the str's for ASCII topics only: key a dict by
    one type.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return bytes(self) == other.encode("utf-8", "surrogateescape")
        return bytes.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = bytes.__hash__

    def __str__(self) -> str:
        return self.decode("utf-8", "backslashreplace")


def _as_topic(topic: str | bytes) -> bytes:
    if isinstance(topic, str):
        try:
            topic = topic.encode()
        except UnicodeEncodeError as e:  # (a lone surrogate: bytes that were not UTF-8, read as text)
            raise InvalidMessage(f"'topic' {topic!r} is not UTF-8 text (give bytes): {e.reason}") from None
    elif not isinstance(topic, bytes):
        raise TypeError(f"'topic' must be str or bytes, not {type(topic).__name__}")
    if not topic:
        raise InvalidMessage("'topic' must not be empty")
    return topic


def topic_filter(topic: str | bytes) -> bytes:
    """A topic a read or a group is to take (a scan's, a group's, a subscriber's): as a
    message's topic, at most MAX_TOPIC_BYTES (none longer can be stored)."""
    topic = _as_topic(topic)
    if len(topic) > MAX_TOPIC_BYTES:
        raise InvalidMessage(f"a topic has at most {MAX_TOPIC_BYTES} bytes; this one has {len(topic)}")
    return topic


class Message(tuple):
    """One message: a topic, a payload and, once written, an ID.

    Args:
        topic: Non-empty str (encoded as UTF-8) or bytes.
        value: The payload.
        id: The message's ID, set by the server when written.
        partition_id: The partition it lives in, set when written.

    Messages are immutable and compare equal when topic, value, ID and
    partition are equal.
    """

    __slots__ = ()

    def __new__(
        cls,
        topic: str | bytes,
        value: bytes,
        *,
        id: MessageID | None = None,
        partition_id: int | None = None,
    ) -> Message:
        topic = _as_topic(topic)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"'value' must be bytes, not {type(value).__name__}")
        if id is not None and not isinstance(id, MessageID):
            raise TypeError(f"'id' must be a MessageID, not {type(id).__name__}")
        if partition_id is None:
            pid = _NO_PARTITION
        elif isinstance(partition_id, int) and 0 <= partition_id < MAX_PARTITIONS:
            pid = partition_id
        else:
            raise InvalidArgument(f"'partition_id' must be in 0..{MAX_PARTITIONS - 1}, got {partition_id!r}")
        sort_key = id.to_bytes() if id is not None else b""
        cell_key = _PID.pack(pid) + (sort_key or _NO_ID) + topic
        return tuple.__new__(cls, (sort_key, cell_key, bytes(value)))

    @property
    def topic(self) -> Topic:
        """The topic (the HBase column qualifier): bytes, equal to the str it was given as (:class:`Topic`)."""
        return Topic(self[1][ROWKEY_LENGTH:])

    @property
    def value(self) -> bytes:
        """The payload."""
        return self[2]

    @property
    def id(self) -> MessageID | None:
        """The ID the server gave the message, or None before it is written."""
        return MessageID.from_bytes(self[0]) if self[0] else None

    @property
    def partition_id(self) -> int | None:
        """The partition the message lives in, or None before it is written."""
        pid = _PID.unpack_from(self[1])[0]
        return None if pid == _NO_PARTITION else pid

    @property
    def rowkey(self) -> bytes | None:
        """The 12-byte rowkey, or None before the message is written."""
        return self[1][:ROWKEY_LENGTH] if self[0] else None

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {self.value[:64]!r}, id={self.id!r}, partition_id={self.partition_id!r})"

    def __reduce__(self):  # type: ignore[override]
        return (_rebuild, (self[1][ROWKEY_LENGTH:], self.value, self.id, self.partition_id))


def _rebuild(topic: bytes, value: bytes, id: MessageID | None, pid: int | None) -> Message:
    return Message(topic, value, id=id, partition_id=pid)


def cell_keys(partition_id: int, id_runs: Sequence[tuple[int, range]], topics: Iterable[bytes]) -> list[bytes]:
    """The cell key (rowkey + topic) of each message written to ``partition_id``, built in C.

    ``id_runs``: the batch's IDs as :func:`hqueue.ids.runs` gives them.
    """
    if len(id_runs) == 1:  # one millisecond, the usual case: no generator (0.5 µs a put)
        timestamp, sequences = id_runs[0]
        rowkeys: Iterator[bytes] = map(_ROWKEY.pack, repeat(partition_id), repeat(timestamp), sequences)
    else:
        rowkeys = chain.from_iterable(
            map(_ROWKEY.pack, repeat(partition_id), repeat(timestamp), sequences) for timestamp, sequences in id_runs
        )
    return list(map(add, rowkeys, topics))


def rowkeys_by_partition(rowkeys: Iterable[bytes]) -> dict[int, list[bytes]]:
    """Rowkeys (or cell keys) grouped by their partition, in their order."""
    rowkeys = list(rowkeys)
    prefixes = set(map(_PREFIX, rowkeys))
    if len(prefixes) == 1:  # the usual case (a receive's batch from one partition): no loop in Python
        return {int.from_bytes(prefixes.pop(), "big"): rowkeys}
    by_prefix: dict[bytes, list[bytes]] = {}
    for rowkey in rowkeys:
        prefix = rowkey[:2]
        group = by_prefix.get(prefix)
        if group is None:
            group = by_prefix[prefix] = []
        group.append(rowkey)
    return {int.from_bytes(prefix, "big"): group for prefix, group in by_prefix.items()}


def checked_receipts(rowkeys: Iterable[bytes]) -> list[bytes]:
    """``rowkeys`` as a list, each checked to be a 12-byte rowkey (SPEC C1).

    Raises:
        TypeError: not a list of bytes (a plain ``bytes`` given for the list, say).
        InvalidArgument: one is not 12 bytes long.
    """
    if isinstance(rowkeys, (bytes, bytearray, str)):
        raise TypeError(f"receipts are a list of {ROWKEY_LENGTH}-byte rowkeys, not one {type(rowkeys).__name__}")
    listed = list(rowkeys)
    if set(map(type, listed)) - {bytes}:
        raise TypeError(f"a receipt is a received message's {ROWKEY_LENGTH}-byte rowkey (bytes)")
    if set(map(len, listed)) - {ROWKEY_LENGTH}:
        raise InvalidArgument(f"a receipt is a received message's {ROWKEY_LENGTH}-byte rowkey")
    return listed


class PackedReceipts(bytes):
    """Receipts as the wire carries them: 12-byte rowkeys, concatenated. Made by the
    server's wire layer only (``wire.packed_receipts``): a plain ``bytes`` given as
    receipts is refused, as a remote client refuses it."""

    __slots__ = ()


def ids_by_partition(receipts: PackedReceipts | Iterable[bytes]) -> dict[int, list[bytes]]:
    """Receipts as each partition's message IDs (10 bytes), in their order, each once.

    ``receipts``: 12-byte rowkeys (SPEC C1), or :class:`PackedReceipts`. Packed
    receipts of one partition (a receive's batch, acked: the usual case) are cut
    straight into IDs by one struct call, with no rowkey or partition prefix made
    of each.

    Raises:
        TypeError: not a list of bytes (:func:`checked_receipts`).
        InvalidArgument: one is not a 12-byte rowkey.
    """
    if isinstance(receipts, PackedReceipts):
        count, left = divmod(len(receipts), ROWKEY_LENGTH)
        if left:
            raise InvalidArgument(f"a receipt is a received message's {ROWKEY_LENGTH}-byte rowkey")
        if not count:
            return {}
        if count <= _SPLIT_RECEIPTS:
            first, second = receipts[0::ROWKEY_LENGTH], receipts[1::ROWKEY_LENGTH]  # each one's partition
            if first.count(first[0]) == count and second.count(second[0]) == count:
                return {int.from_bytes(receipts[:2], "big"): list(dict.fromkeys(_ids_splitter(count)(receipts)))}
            return _by_partition(_pid_id_splitter(count)(receipts))
        rowkeys = [receipts[i : i + ROWKEY_LENGTH] for i in range(0, len(receipts), ROWKEY_LENGTH)]
    else:
        rowkeys = checked_receipts(receipts)
    return {pid: list(dict.fromkeys(map(id_bytes, keys))) for pid, keys in rowkeys_by_partition(rowkeys).items()}


#: Concatenated receipts of up to this many are cut by one struct call (the last few counts' formats kept).
_SPLIT_RECEIPTS = 1000


@lru_cache(maxsize=16)
def _ids_splitter(count: int) -> Callable[[bytes], tuple[bytes, ...]]:
    return struct.Struct(f"2x{ROWKEY_LENGTH - 2}s" * count).unpack


@lru_cache(maxsize=16)
def _pid_id_splitter(count: int) -> Callable[[bytes], tuple[Any, ...]]:
    """Concatenated rowkeys cut into partition, ID, partition, ID... by one struct call."""
    return struct.Struct(">" + f"H{ROWKEY_LENGTH - 2}s" * count).unpack


def _by_partition(flat: tuple[Any, ...]) -> dict[int, list[bytes]]:
    """Partition, ID, partition, ID... as each partition's IDs, in their order, each once."""
    by_partition: dict[int, list[bytes]] = {}
    for pid, message_id in zip(flat[0::2], flat[1::2], strict=True):
        ids = by_partition.get(pid)
        if ids is None:
            ids = by_partition[pid] = []
        ids.append(message_id)
    return {pid: list(dict.fromkeys(ids)) for pid, ids in by_partition.items()}


def topics_of(messages: Iterable[Message]) -> list[bytes]:
    """The topic of each message (the cell key after its rowkey), in C."""
    return topics_of_keys(map(_CELL_KEY, messages))


def topics_of_keys(keys: Iterable[bytes]) -> list[bytes]:
    """The topic in each cell key, in C."""
    return list(map(getitem, keys, repeat(_TOPIC)))  # type: ignore[arg-type]


def ids_of_keys(keys: Iterable[bytes]) -> list[MessageID]:
    """The message ID in each cell key, in C."""
    return list(map(tuple.__new__, repeat(MessageID), map(_ID.unpack_from, keys, repeat(_PID.size))))


def values_of(messages: Iterable[Message]) -> list[bytes]:
    return list(map(_VALUE, messages))


def cell_keys_of(messages: Iterable[Message]) -> list[bytes]:
    """Each stored message's cell key: its rowkey (partition, ID), then its topic."""
    return list(map(_CELL_KEY, messages))


def stored_size(message: Message) -> int:
    """Bytes a stored message takes on the wire: cell key and value."""
    return len(message[1]) + len(message[2])


_CELL_KEY, _VALUE, _TOPIC = itemgetter(1), itemgetter(2), slice(ROWKEY_LENGTH, None)
_PREFIX = itemgetter(slice(0, 2))  # a rowkey's (or cell key's) partition, as bytes


def messages_from_columns(keys: Sequence[bytes], values: Sequence[bytes]) -> list[Message]:
    """Stored messages from their cell keys and values (as storage and the wire give them).

    Everything here runs in C (``zip``/``map``/``partial``): no Python frame
    per message, which is what keeps scanners near raw store speed.
    """
    return list(map(_build, zip(map(id_bytes, keys), keys, values, strict=False)))


_build = partial(tuple.__new__, Message)
#: A cell key's 10 ID bytes (``MessageID.to_bytes``), which sort as the IDs do.
id_bytes = itemgetter(slice(2, ROWKEY_LENGTH))


def successor(message_id: MessageID) -> MessageID:
    """The smallest ID after ``message_id``."""
    if message_id.sequence < MAX_SEQUENCE:
        return MessageID(message_id.timestamp, message_id.sequence + 1)
    return MessageID(message_id.timestamp + 1, 0)


#: A position in a queue: a MessageID, a datetime, or epoch milliseconds (None: none given).
TimeLike = MessageID | datetime | int | None


def as_message_id(value: TimeLike, name: str) -> MessageID | None:
    """A MessageID from a MessageID, a datetime or epoch milliseconds."""
    if value is None or isinstance(value, MessageID):
        return value
    if isinstance(value, datetime):
        return MessageID.from_datetime(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return MessageID(value)
    raise TypeError(f"{name!r} must be a MessageID, datetime or int milliseconds, not {type(value).__name__}")
