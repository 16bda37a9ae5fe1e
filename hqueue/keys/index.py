"""The per-topic index's key layout (SPEC X4; the reads are hqueue/topic_index.py).

Each message of a queue with the index has an entry under the prefix
``0xFFFF`` (above every partition and timer range)::

    0xFFFF + pid (2) + hash(topic) (8 bytes) + ID (10) + topic  ->  value

A topic's entries in a partition are contiguous and in ID order. The entry's
suffix after its 12-byte head is the message's cell key after its 2-byte
partition, so a range of message keys maps onto a range of one topic's
entries exactly. The hash only groups a topic's entries; the topic in the
key tells colliding topics apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import add, itemgetter

from xxhash import xxh3_64_digest

from ..config import QueueInfo
from ..errors import InvalidArgument
from ..message import ROWKEY_LENGTH, key_after

INDEX_PREFIX = b"\xff\xff"


#: Index keys are this long before the message's ID (prefix, partition, topic hash).
HEAD_LENGTH = ROWKEY_LENGTH


#: The config key naming the topic hash; queues made before it existed use BLAKE2b.
HASH_KEY = "hqueue.topicIndexHash"


TopicHash = Callable[[bytes], bytes]


def _blake2b(topic: bytes) -> bytes:
    return hashlib.blake2b(topic, digest_size=8).digest()


#: The 8-byte topic hashes by their config name.
HASHES: dict[str, TopicHash] = {"xxh3": xxh3_64_digest, "blake2b": _blake2b}


#: The hash of the queues ``create_queue`` makes.
DEFAULT_HASH = "xxh3"


def topic_hash(info: QueueInfo) -> TopicHash:
    """The topic hash ``info``'s index entries were written with."""
    name = info.config.get(HASH_KEY, "blake2b")
    try:
        return HASHES[name]
    except KeyError:
        raise InvalidArgument(f"queue {info.name!r}: unknown {HASH_KEY} {name!r}; known: {sorted(HASHES)}") from None


def is_index_key(key: bytes) -> bool:
    return key[:2] == INDEX_PREFIX


def topic_head(partition_prefix: bytes, topic: bytes, hash: TopicHash) -> bytes:
    """The 12 bytes every index entry of ``topic`` in that partition starts with."""
    return INDEX_PREFIX + partition_prefix + hash(topic)


def index_cells(keys: Sequence[bytes], values: Sequence[bytes], hash: TopicHash) -> list[tuple[bytes, bytes]]:
    """The index entries, in key order, of one put's messages (one partition), given by
    their cell keys (``pid + ID + topic``, in ID order) and values.

    Built with ``map`` (no Python frame per message): a put pays for this on
    every message. Sorting by the hash alone gives key order, because the
    sort is stable and a topic's keys come in ID order.
    """
    if not keys:
        return []
    digests = list(map(hash, map(_TOPIC, keys)))
    order = sorted(range(len(keys)), key=digests.__getitem__)
    heads = map(add, repeat(INDEX_PREFIX + keys[0][:2]), map(digests.__getitem__, order))
    index_keys = map(add, heads, map(_AFTER_PARTITION, map(keys.__getitem__, order)))
    return list(zip(index_keys, map(values.__getitem__, order), strict=True))


_TOPIC, _AFTER_PARTITION = itemgetter(slice(ROWKEY_LENGTH, None)), itemgetter(slice(2, None))


def index_range(start_key: bytes, stop_key: bytes, topic: bytes, hash: TopicHash) -> tuple[bytes, bytes]:
    """The index entries of ``topic`` matching message keys ``start_key <= key < stop_key`` of one partition."""
    head = topic_head(start_key[:2], topic, hash)
    stop = head + stop_key[2:] if stop_key[:2] == start_key[:2] and len(stop_key) > 2 else key_after(head)
    return head + start_key[2:], stop


def entry_topic(index_key: bytes) -> bytes:
    """The topic an index entry is for (its hash alone may collide with another's)."""
    return index_key[HEAD_LENGTH + 10 :]


def message_key(index_key: bytes) -> bytes:
    """The message's cell key (``pid + ID + topic``) from its index entry's key."""
    return index_key[2:4] + index_key[HEAD_LENGTH:]
