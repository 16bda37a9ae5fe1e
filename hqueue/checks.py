"""What a put must satisfy before anything is written: a partition of the
queue, and a batch that is not empty, of Message objects, with topics and
sizes in bounds, and no bigger than one put may be (:data:`MAX_BATCH_MESSAGES`
messages, :data:`MAX_BATCH_BYTES` bytes: a batch is atomic, so it is never
split). Each check names the first bad message; nothing is written when one
fails. The engine, the remote client and the server use
the same checks, so an error reads the same wherever it is raised.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
import zlib
from collections.abc import Callable, Sequence
from operator import add
from typing import Any, TypeVar

from .config import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, QueueInfo
from .errors import BatchTooLarge, InvalidArgument, InvalidMessage, InvalidPartition, MessageTooLarge
from .message import MAX_TOPIC_BYTES, Message, topics_of, values_of

#: A consumer group's or subscriber's name: it is a znode and a store key.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def check_partition(info: QueueInfo, partition_id: object) -> int:
    if not isinstance(partition_id, int) or isinstance(partition_id, bool):
        raise TypeError(f"'partition_id' must be an int, not {type(partition_id).__name__}")
    return partition_of(info.name, info.partitions, partition_id)


def partition_of(queue: str, partitions: int, partition_id: int) -> int:
    """``partition_id`` if ``queue`` (of ``partitions``) has it; InvalidPartition otherwise."""
    if not 0 <= partition_id < partitions:
        raise InvalidPartition(f"'partition_id' must be in 0..{partitions - 1} for queue {queue!r}, got {partition_id}")
    return partition_id


def receipt_partition(queue: str, partitions: int, partition_id: int) -> int:
    """A receipt's partition, if ``queue`` (of ``partitions``) has it; InvalidArgument otherwise."""
    if partition_id >= partitions:
        raise InvalidArgument(f"a receipt names partition {partition_id}; queue {queue!r} has {partitions}")
    return partition_id


def partition_for_key(key: bytes | str, partitions: int) -> int:
    """CRC32 of ``key`` mod ``partitions`` (the same in every client)."""
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise TypeError(f"'key' must be bytes or str, not {type(key).__name__}")
    return zlib.crc32(key) % partitions


def choose_partition(
    info: QueueInfo, partition_id: int | None, key: bytes | str | None, priority: int | None = None
) -> int:
    """Where a put goes: ``partition_id``; else, in ``priority``'s band of partitions
    (all of them on a queue without tiers), CRC32(``key``) or a random one."""
    if key is not None and partition_id is not None:
        raise TypeError("give 'partition_id' or 'key', not both")
    # (a priority checked as one of the queue's tiers first: [], '' or False were tier 0, or none)
    if priority is not None:
        band = info.tier_partitions(priority)
    else:
        band = info.tier_partitions(0) if info.priorities > 1 else range(info.partitions)
    if partition_id is not None:
        if priority is not None and info.tier_of(check_partition(info, partition_id)) != priority:
            raise InvalidPartition(f"partition {partition_id} of {info.name!r} is not in priority tier {priority}")
        return check_partition(info, partition_id)
    return band.start + (partition_for_key(key, len(band)) if key is not None else random.randrange(len(band)))


def check_columns(info: QueueInfo, topics: Sequence[bytes], values: Sequence[bytes]) -> None:
    """Reject a batch given as topics and values: empty, or a size out of bounds (checked in C)."""
    if not topics or len(topics) != len(values):
        raise InvalidMessage("a put needs at least one message, and as many values as topics")
    check_batch_bounds(len(topics), sum(map(len, topics)) + sum(map(len, values)))
    topic_sizes = list(map(len, topics))
    sizes = list(map(add, topic_sizes, map(len, values)))
    if min(topic_sizes) > 0 and max(topic_sizes) <= MAX_TOPIC_BYTES and max(sizes) <= info.max_message_bytes:
        return
    for index, (topic_size, size) in enumerate(zip(topic_sizes, sizes, strict=True)):  # say which one
        _check_sizes(info, index if len(topics) > 1 else None, topic_size, size)


def check_batch_bounds(count: int, size: int) -> None:
    """Refuse a batch over what one put may hold: it is atomic, so it is never split.
    (One message alone may be as large as its queue allows.)"""
    if count > MAX_BATCH_MESSAGES or (count > 1 and size > MAX_BATCH_BYTES):
        raise BatchTooLarge(
            f"a batch of {count} messages and {size} bytes is over one put's limit of {MAX_BATCH_MESSAGES} "
            f"messages and {MAX_BATCH_BYTES} bytes (topics + values); a batch is atomic, so it is not split: "
            "put it as several batches"
        )


def _check_sizes(info: QueueInfo, index: int | None, topic_size: int, size: int) -> None:
    """``index``: the message's place in its batch (None: a message alone)."""
    which = "the message" if index is None else f"message {index}"
    if not topic_size:
        raise InvalidMessage(f"{which} needs a non-empty topic")
    if topic_size > MAX_TOPIC_BYTES:
        raise InvalidMessage(f"{which} has a topic over {MAX_TOPIC_BYTES} bytes")
    if size > info.max_message_bytes:
        raise MessageTooLarge(
            f"{which} is {size} bytes; queue {info.name!r} takes at most {info.max_message_bytes} (topic + value)"
        )


def message_columns(info: QueueInfo, messages: Sequence[Message]) -> tuple[list[bytes], list[bytes]]:
    """A batch's topics and values, once it is checked: not empty, Message objects, sizes in bounds.

    Raises:
        InvalidMessage, MessageTooLarge, TypeError: naming the first bad message.
    """
    if len(messages) == 1:  # an unbatched put: fewer calls than the batch path below
        message = messages[0]
        if type(message) is Message:
            topic, value = message.topic, message.value
            _check_sizes(info, None, len(topic), len(topic) + len(value))
            return [topic], [value]
    if not messages:
        raise InvalidMessage("a put needs at least one message")
    if set(map(type, messages)) != {Message}:
        index, bad = next((i, m) for i, m in enumerate(messages) if type(m) is not Message)
        raise TypeError(f"message {index} must be a Message, not {type(bad).__name__}")
    topics, values = topics_of(messages), values_of(messages)
    check_columns(info, topics, values)
    return topics, values


def check_name(kind: str, name: object) -> str:
    """A group's or subscriber's name: 1-200 of ``A-Z a-z 0-9 _ . -``, not starting with . or -."""
    if not isinstance(name, str):
        raise TypeError(f"a {kind} name must be a str, not {type(name).__name__}")
    if not NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 60 else f"{name[:60]!r}… ({len(name)} characters)"
        raise InvalidArgument(f"a {kind} name is 1-200 of A-Z a-z 0-9 _ . - (not starting with . or -), got {shown}")
    return name


#: The most a scan's ``limit`` may be (a 64-bit count, as the CLI's ``--limit``).
MAX_SCAN_LIMIT = 2**63 - 1


#: The longest call deadline (7 days): past what sockets and polls can wait for (1e10 s
#: was taken, and then every call raised OverflowError from socket.settimeout).
MAX_CALL_TIMEOUT = 7 * 86400.0


def check_timeout(timeout: object) -> float:
    """A call's deadline in seconds: a number above 0, up to MAX_CALL_TIMEOUT."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_CALL_TIMEOUT:
        raise InvalidArgument(
            f"'timeout' must be > 0 and at most {MAX_CALL_TIMEOUT:.0f} seconds (7 days), got {timeout!r}"
        )
    return float(timeout)


def check_scan_limit(limit: object) -> int | None:
    """A scan's ``limit``: None (no limit) or an int in 0..MAX_SCAN_LIMIT."""
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_SCAN_LIMIT
    ):
        raise InvalidArgument(f"'limit' must be an int in 0..{MAX_SCAN_LIMIT}, got {limit!r}")
    return limit


def check_queue_name_type(name: object, param: str = "name") -> str:
    """A queue's name as a call gives it: a str, or TypeError at once, whatever the store (an
    unknown name was "does not exist" in this process, and an InvalidMessage or a StorageError
    through a server)."""
    if not isinstance(name, str):
        raise TypeError(f"'{param}' must be a str (the queue's name), not {type(name).__name__}")
    return name


_Method = TypeVar("_Method", bound=Callable[..., Any])


def names_a_queue(method: _Method) -> _Method:
    """A method (of an admin, blocking or asyncio) whose first argument is a queue's name:
    :func:`check_queue_name_type` first (given by position or by its name)."""
    param = list(inspect.signature(method).parameters)[1]

    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if args:
            check_queue_name_type(args[0], param)
        elif param in kwargs:
            check_queue_name_type(kwargs[param], param)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def checked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return await method(self, *args, **kwargs)

        return checked_async  # type: ignore[return-value]

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        check(args, kwargs)
        return method(self, *args, **kwargs)

    return checked  # type: ignore[return-value]
