"""The per-topic index (SPEC X4): reading one topic costs that topic's rows only.

A queue made with ``topic_index=True`` (config ``hqueue.topicIndex``) writes
each message twice in one atomic write: its row, and an index entry in the
same table, under the prefix ``0xFFFF`` (above every partition and timer
range)::

    0xFFFF + pid (2) + hash(topic) (8 bytes of BLAKE2b) + ID (10) + topic  ->  value

A topic's entries in a partition are contiguous and in ID order, so a
topic-filtered read (scanners, subscriptions, consumer groups, lag) scans
just them: O(the topic's rows), whatever else the partition holds. The index
covers the value, so no second lookup is needed. A topic costs nothing while
it is not written: no thread, no memory, no registration; a million topics
are a million key ranges.

The index entry's suffix after its 12-byte head is the message's cell key
after its 2-byte partition, so a range of message keys maps onto a range of
one topic's entries exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

from .message import ROWKEY_LENGTH

INDEX_PREFIX = b"\xff\xff"
#: Index keys are this long before the message's ID (prefix, partition, topic hash).
HEAD_LENGTH = ROWKEY_LENGTH
#: The config key that turns the index on for a queue.
CONFIG_KEY = "hqueue.topicIndex"
#: A read of more topics than this scans the partition's rows instead.
MAX_INDEXED_TOPICS = 64


def is_index_key(key: bytes) -> bool:
    return key[:2] == INDEX_PREFIX


def topic_head(partition_prefix: bytes, topic: bytes) -> bytes:
    """The 12 bytes every index entry of ``topic`` in that partition starts with."""
    return INDEX_PREFIX + partition_prefix + hashlib.blake2b(topic, digest_size=8).digest()


def index_cells(keys: Sequence[bytes], values: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """The index entries of messages given by their cell keys (``pid + ID + topic``) and values."""
    heads: dict[bytes, bytes] = {}
    cells = []
    for key, value in zip(keys, values, strict=True):
        topic = key[ROWKEY_LENGTH:]
        head = heads.get(topic)
        if head is None:
            head = heads[topic] = topic_head(key[:2], topic)
        cells.append((head + key[2:], value))
    return cells


def _after(head: bytes) -> bytes:
    return (int.from_bytes(head, "big") + 1).to_bytes(len(head), "big")


def index_range(start_key: bytes, stop_key: bytes, topic: bytes) -> tuple[bytes, bytes]:
    """The index entries of ``topic`` matching message keys ``start_key <= key < stop_key`` of one partition."""
    head = topic_head(start_key[:2], topic)
    stop = head + stop_key[2:] if stop_key[:2] == start_key[:2] and len(stop_key) > 2 else _after(head)
    return head + start_key[2:], stop


def entry_topic(index_key: bytes) -> bytes:
    """The topic an index entry is for (its hash alone may collide with another's)."""
    return index_key[HEAD_LENGTH + 10 :]


def message_key(index_key: bytes) -> bytes:
    """The message's cell key (``pid + ID + topic``) from its index entry's key."""
    return index_key[2:4] + index_key[HEAD_LENGTH:]


def usable(topics: Collection[bytes] | None) -> bool:
    return topics is not None and 0 < len(topics) <= MAX_INDEXED_TOPICS
