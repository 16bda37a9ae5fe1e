"""Queue definitions: name rules, durability, state and per-queue settings."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeGuard

from .errors import InvalidArgument, InvalidPartition, InvalidQueueName, QueueDisabled, QueueNotFound
from .message import MAX_PARTITIONS

__all__ = [
    "Durability",
    "InfoCache",
    "QueueInfo",
    "QueueState",
    "check_config",
    "validate_new_queue_name",
    "validate_queue_name",
]

#: How long queue metadata is cached before it is read again, in seconds.
#: Changes made through the same engine or client are seen at once; changes
#: made by another process sharing the store are seen within this time.
INFO_CACHE_SECONDS = 2.0

#: Messages (topic + value) above this many bytes are rejected by default.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The most messages one put (a batch, atomic) may hold, on every backend and per server call.
MAX_BATCH_MESSAGES = 10_000
#: The most bytes (topics + values) one put may hold; frames stay far below the server's 64 MiB.
MAX_BATCH_BYTES = 16 * 1024 * 1024

#: A nack's ``delay`` that hands messages back unseen: to the group at once, not counted as a
#: failed delivery (what a consumer gives back that it never handed to the application: a
#: cancelled receive's, a loop left early). On the wire, ``groupNack``'s delayMillis -2.
UNSEEN = -2.0
#: The longest queue name.
MAX_QUEUE_NAME = 200
# HBase table-name rules (TableName.isLegalTableQualifierName), without namespaces.
_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_QUEUE_NAME - 1}}}")
MAX_NAME_LENGTH = MAX_QUEUE_NAME
#: What a queue's dead-letter queue adds to its name (``deadletters.py``: ``<queue>.dlq``).
DEAD_LETTER_SUFFIX = ".dlq"


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a legal queue name, else raise.

    Raises:
        TypeError: ``name`` is not a str.
        InvalidQueueName: empty, over 200 characters, or not ``[A-Za-z0-9_.-]``.
    """
    if not isinstance(name, str):
        raise TypeError(f"'name' must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise InvalidQueueName(
            f"invalid queue name {name!r}: use 1-200 characters from [A-Za-z0-9_.-], not starting with '.' or '-'"
        )
    return name


def validate_new_queue_name(name: object) -> str:
    """:func:`validate_queue_name`, and room for the queue's dead-letter queue:
    ``<name>.dlq`` must be a legal name too, so a new queue has at most 196
    characters. A name that ends in ``.dlq`` (a dead-letter queue, made on
    first use) may have 200; a dead-letter queue that long has no dead-letter
    queue of its own.

    Raises:
        TypeError, InvalidQueueName.
    """
    validate_queue_name(name)
    assert isinstance(name, str)
    most = MAX_NAME_LENGTH - len(DEAD_LETTER_SUFFIX)
    if len(name) > most and not name.endswith(DEAD_LETTER_SUFFIX):
        raise InvalidQueueName(
            f"invalid queue name {name[:40]!r}… ({len(name)} characters): a queue name has at most {most} "
            f"characters, so that its dead-letter queue '<name>{DEAD_LETTER_SUFFIX}' is a legal name too"
        )
    return name


def check_config(config: object) -> dict[str, str]:
    """A new queue's free-form settings: a dict of text to text, each valid UTF-8 (a value
    read from bytes that are not, kept as lone surrogates, was stored, and then no server
    could send the queue's definition: every client's ``list`` failed).

    Raises:
        TypeError, InvalidArgument.
    """
    if not _is_text_map(config):
        raise TypeError("'config' must be a dict of str to str")
    for key, value in config.items():
        for text in (key, value):
            if _as_utf8(text) is not text:
                raise InvalidArgument(f"'config': {_as_utf8(text)!r} is not valid UTF-8 text")
    if CREATED_KEY in config:  # (it was replaced, silently)
        raise InvalidArgument(f"'config': {CREATED_KEY} is set by hqueue when the queue is made")
    flag = config.get(TOPIC_INDEX_KEY)
    if flag is not None and flag.lower() not in FLAG_TRUE + FLAG_FALSE:  # ('on' made a queue without it, silently)
        raise InvalidArgument(f"'config': {TOPIC_INDEX_KEY} must be true or false, got {flag!r}")
    return config


#: The spellings of a config flag (``hqueue.topicIndex``), as true and as false.
FLAG_TRUE, FLAG_FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _is_text_map(config: object) -> TypeGuard[dict[str, str]]:
    """Whether ``config`` is a dict of str to str."""
    return isinstance(config, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in config.items())


def _as_utf8(text: str) -> str:
    """``text`` itself if it is UTF-8 text, else with its lone surrogates (bytes that were
    not UTF-8, read as text) written ``\\xNN`` (or ``\\udNNN``)."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode(errors="surrogateescape").decode(errors="backslashreplace")
    except UnicodeEncodeError:
        return text.encode(errors="backslashreplace").decode()


class Durability:
    """When a put is acknowledged, after HBase's ``Durability`` (SPEC C3).

    * ``SYNC_WAL`` (default): the write-ahead log is fsynced before the ack.
      Survives a crash of the process and of the machine.
    * ``ASYNC_WAL``: written to the WAL (the OS page cache) before the ack,
      fsynced in the background. Survives a crash of the process; a power
      loss can lose the last moments.
    * ``SKIP_WAL``: no WAL; only the memtable. A crash of the process loses
      everything not yet flushed. For data you can regenerate.
    """

    SYNC_WAL = "SYNC_WAL"
    ASYNC_WAL = "ASYNC_WAL"
    SKIP_WAL = "SKIP_WAL"
    ALL = (SYNC_WAL, ASYNC_WAL, SKIP_WAL)

    @classmethod
    def validate(cls, value: object) -> str:
        if value not in cls.ALL:
            raise InvalidArgument(f"'durability' must be one of {', '.join(cls.ALL)}, got {value!r}")
        return value  # type: ignore[return-value]


#: The config key of a queue's priority tiers (QueueInfo.priorities).
PRIORITIES_KEY = "hqueue.priorities"
#: The config key that turns a queue's per-topic index on (QueueInfo.topic_index, topic_index.py).
TOPIC_INDEX_KEY = "hqueue.topicIndex"
#: The config key set when a queue is created: when (UTC, ms) and a random tag. A queue
#: deleted and made again under its name is another queue: an open scan of it says so.
CREATED_KEY = "hqueue.created"


class QueueState:
    """Whether a queue takes puts and scans."""

    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


@dataclass(frozen=True)
class QueueInfo:
    """Everything stored about a queue, besides its messages.

    Attributes:
        name: The queue name.
        partitions: Number of partitions, fixed at creation.
        ttl: Seconds a message stays visible; 0 keeps messages forever.
        durability: One of :class:`Durability`.
        state: One of :class:`QueueState`.
        config: Free-form settings (``hbase.hqueue.partitionsPerRegion`` …).
        max_message_bytes: Size limit of topic + value.
        id_floor: Every ID ever given in this queue is at or below this
            timestamp; survives truncate so IDs never go backwards.
    """

    name: str
    partitions: int
    ttl: int = 0
    durability: str = Durability.SYNC_WAL
    state: str = QueueState.ENABLED
    config: dict[str, str] = field(default_factory=dict)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    id_floor: int = 0

    def __post_init__(self) -> None:
        validate_queue_name(self.name)
        _check_int("partitions", self.partitions, 1, MAX_PARTITIONS)
        tiers = self.config.get(PRIORITIES_KEY, "1") if isinstance(self.config, dict) else "1"
        if (  # (ASCII digits: '²' is a digit int() cannot read, and '٢' one it can)
            not (tiers.isascii() and tiers.isdigit())
            or not 1 <= int(tiers) <= self.partitions
            or self.partitions % int(tiers)
        ):
            raise InvalidArgument(
                f"'priorities' must be 1..partitions and divide the partitions ({self.partitions}), got {tiers!r}"
            )
        _check_int("ttl", self.ttl, 0, 2**31 - 1)
        _check_int("max_message_bytes", self.max_message_bytes, 1, 2**31 - 1)
        Durability.validate(self.durability)
        if not _is_text_map(self.config):
            raise TypeError("'config' must be a dict of str to str")

    @property
    def enabled(self) -> bool:
        return self.state == QueueState.ENABLED

    def require_enabled(self) -> QueueInfo:
        """This info, if the queue is enabled; raises QueueDisabled."""
        if not self.enabled:
            raise QueueDisabled(self.name)
        return self

    @property
    def partitions_per_region(self) -> int:
        """HBase pre-split granularity (``hbase.hqueue.partitionsPerRegion``)."""
        return max(1, int(self.config.get("hbase.hqueue.partitionsPerRegion", "1")))

    @property
    def priorities(self) -> int:
        """Priority tiers (``hqueue.priorities``, SPEC X4): the partitions split into this many equal bands."""
        return int(self.config.get(PRIORITIES_KEY, "1"))

    def tier_of(self, partition_id: int) -> int:
        """The priority tier a partition serves (0 is the lowest)."""
        return partition_id // (self.partitions // self.priorities)

    def tier_partitions(self, priority: int) -> range:
        """The partitions of priority tier ``priority``."""
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority < self.priorities:
            # (a tier past this definition's is the InvalidPartition of a put routed by it: a client
            # reads the queue again, which may have been made again with more tiers since)
            error = (
                InvalidPartition if isinstance(priority, int) and priority >= self.priorities > 0 else InvalidArgument
            )
            raise error(f"'priority' must be in 0..{self.priorities - 1} for queue {self.name!r}, got {priority!r}")
        band = self.partitions // self.priorities
        return range(priority * band, (priority + 1) * band)

    @property
    def topic_index(self) -> bool:
        """Whether puts also write the per-topic index (``hqueue.topicIndex``, SPEC X4)."""
        return self.config.get(TOPIC_INDEX_KEY, "false").lower() in FLAG_TRUE

    @property
    def created(self) -> str | None:
        """When (and as which) the queue was created (``hqueue.created``); None for a queue
        created before hqueue kept it."""
        return self.config.get(CREATED_KEY)

    def evolve(self, **changes: Any) -> QueueInfo:
        return replace(self, **changes)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> QueueInfo:
        """A stored definition; a config text that is not UTF-8 (stored before
        :func:`check_config` refused it, and then no server could send the definition)
        is read with those bytes written ``\\xNN``."""
        fields = json.loads(data)
        config = fields.get("config")
        if _is_text_map(config):
            fields["config"] = {_as_utf8(k): _as_utf8(v) for k, v in config.items()}
        return cls(**fields)


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name!r} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"{name!r} must be in {low}..{high}, got {value}")


def check_routed(info: QueueInfo, routed_by: str | None) -> None:
    """A put (or timer put) its client checked and routed by the definition whose ``created``
    is ``routed_by`` goes to ``info``'s queue only if it is that one (None: not said, not checked).

    Raises:
        QueueNotFound: the queue was deleted and made again since: nothing is written (a key's
            partition may be another in the new one, of another count), and the client reads
            the definition again.
    """
    if routed_by is not None and routed_by != info.created:
        raise QueueNotFound(
            info.name,
            f"queue {info.name!r} was deleted and created again since this client read its definition: "
            "nothing was written (read the definition again, and route the put by it)",
        )


class InfoCache:
    """Queue infos, cached for :data:`INFO_CACHE_SECONDS` (puts read one each).

    Args:
        load: Reads one queue's info afresh (raises QueueNotFound).
        stale_on: Errors of ``load`` on which a cached info is served stale
            rather than failing (a remote client while no server answers).
    """

    def __init__(self, load: Callable[[str], QueueInfo], stale_on: tuple[type[Exception], ...] = ()) -> None:
        self._load, self._stale_on = load, stale_on
        self._infos: dict[str, tuple[float, QueueInfo]] = {}
        #: Forgets so far: a load begun before one is not kept (it may read what the change
        #: replaced, and would be served for INFO_CACHE_SECONDS after it: an attacker's pass
        #: saw a queue made again served as the deleted one, its puts going to partitions the
        #: new one lacks, and as disabled 0.5 s after it was made).
        self._forgets = 0
        self._lock = threading.Lock()

    def get(self, name: str, *, fresh: bool = False) -> QueueInfo:
        cached = self._infos.get(name)
        if cached and not fresh and time.monotonic() - cached[0] < INFO_CACHE_SECONDS:
            return cached[1]
        forgets = self._forgets
        try:
            info = self._load(name)
        except self._stale_on:
            if cached is None or fresh:
                raise
            self._keep(name, cached[1], forgets)  # ask again later, not on every call
            return cached[1]
        self._keep(name, info, forgets)
        return info

    def _keep(self, name: str, info: QueueInfo, forgets: int) -> None:
        with self._lock:
            if self._forgets == forgets:  # (else a queue changed meanwhile: read again next time)
                self._infos[name] = (time.monotonic(), info)

    def enabled(self, name: str) -> QueueInfo:
        """The info of an enabled queue; raises QueueDisabled."""
        return self.get(name).require_enabled()

    def forget(self, name: str) -> None:
        with self._lock:
            self._forgets += 1  # (a load under way now is not kept)
            self._infos.pop(name, None)
