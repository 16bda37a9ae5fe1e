"""The per-topic index (SPEC X4): reading one topic costs that topic's rows only.

A queue made with ``topic_index=True`` (config ``hqueue.topicIndex``) writes
each message twice in one atomic write: its row, and an index entry under
the prefix ``0xFFFF`` (above every partition and timer range), in the same
HBase table, or in the queue's own index column family on the embedded
store (storage/embedded.py)::

    0xFFFF + pid (2) + hash(topic) (8 bytes) + ID (10) + topic  ->  value

A topic's entries in a partition are contiguous and in ID order, so a
topic-filtered read (scanners, subscriptions, consumer groups, lag) scans
just them: O(the topic's rows), whatever else the partition holds. The index
covers the value, so no second lookup is needed. A topic costs nothing while
it is not written: no thread, no memory, no registration; a million topics
are a million key ranges.

The index entry's suffix after its 12-byte head is the message's cell key
after its 2-byte partition, so a range of message keys maps onto a range of
one topic's entries exactly.

The hash is XXH3-64 (config ``hqueue.topicIndexHash = xxh3``, set by
``create_queue``): a put computes one per message, and XXH3 costs 0.04 µs
where BLAKE2b cost 0.36. Queues made before it have no such key and keep
the 8-byte BLAKE2b their entries were written with. Either way the hash only
groups a topic's entries; the topic in the key tells colliding topics apart.

A put's entries are written in key order: RocksDB's memtable inserts a
sorted run faster than the same keys shuffled (bench/topics.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from itertools import repeat
from operator import add, itemgetter
from typing import TYPE_CHECKING

from xxhash import xxh3_64_digest

from .config import TOPIC_INDEX_KEY, QueueInfo
from .errors import InvalidArgument
from .message import ROWKEY_LENGTH, key_after

if TYPE_CHECKING:
    from .storage.base import Storage

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


def config_for(enabled: bool) -> dict[str, str]:
    """The config keys that make a new queue keep the index (or nothing)."""
    return {TOPIC_INDEX_KEY: "true", HASH_KEY: DEFAULT_HASH} if enabled else {}


def for_new_queue(info: QueueInfo) -> QueueInfo:
    """``info`` as a new queue is stored: with the index's hash named (the
    default when its config names none), and that hash known.

    Raises:
        InvalidArgument: for an unknown hash.
    """
    if not info.topic_index:
        return info
    if HASH_KEY not in info.config:
        info = info.evolve(config=info.config | {HASH_KEY: DEFAULT_HASH})
    topic_hash(info)
    return info


def topic_hash(info: QueueInfo) -> TopicHash:
    """The topic hash ``info``'s index entries were written with."""
    name = info.config.get(HASH_KEY, "blake2b")
    try:
        return HASHES[name]
    except KeyError:
        raise InvalidArgument(f"queue {info.name!r}: unknown {HASH_KEY} {name!r}; known: {sorted(HASHES)}") from None


#: A read of more topics than this scans the partition's rows instead.
MAX_INDEXED_TOPICS = 64


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


def usable(topics: Collection[bytes] | None) -> bool:
    return topics is not None and 0 < len(topics) <= MAX_INDEXED_TOPICS


def scan(
    storage: Storage, info: QueueInfo, start_key: bytes, stop_key: bytes, topics: Collection[bytes], limit: int
) -> list[tuple[bytes, bytes]]:
    """A topic-filtered scan of one partition's message keys ``start_key <= key < stop_key``
    through the index: each topic's entries only, as (cell key, value), in key order."""
    found: list[tuple[bytes, bytes]] = []
    hash = topic_hash(info)
    for topic in topics:
        start, stop = index_range(start_key, stop_key, topic, hash)
        taken = 0
        while taken < limit:
            asked = limit - taken
            cells = storage.scan(info.name, start, stop, None, asked)
            mine = [(message_key(k), v) for k, v in cells if entry_topic(k) == topic]
            found += mine
            taken += len(mine)
            if len(cells) < asked:  # the end of this topic's entries
                break
            start = cells[-1][0] + b"\x00"  # some were another topic's (a hash collision): go on
    if len(topics) > 1:
        found.sort()
    return found[:limit]
