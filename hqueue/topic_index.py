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
sorted run faster than the same keys shuffled (bench/topics.py). The key
layout and the hashes are in keys/index.py; this module reads through them.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from .config import TOPIC_INDEX_KEY, QueueInfo
from .keys.index import DEFAULT_HASH, HASH_KEY, entry_topic, index_range, message_key, topic_hash
from .message import key_after
from .storage.base import until_bytes

if TYPE_CHECKING:
    from .storage.base import Storage


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


#: A read of more topics than this scans the partition's rows instead.
MAX_INDEXED_TOPICS = 64


def usable(topics: Collection[bytes] | None) -> bool:
    return topics is not None and 0 < len(topics) <= MAX_INDEXED_TOPICS


def scan(
    storage: Storage,
    info: QueueInfo,
    start_key: bytes,
    stop_key: bytes,
    topics: Collection[bytes],
    limit: int,
    max_bytes: int | None = None,
) -> list[tuple[bytes, bytes]]:
    """A topic-filtered scan of one partition's message keys ``start_key <= key < stop_key``
    through the index: each topic's entries only, as (cell key, value), in key order
    (``limit`` and ``max_bytes`` as :meth:`Storage.scan`'s).

    The topics' entries are merged as they are read, each topic's a chunk at a time (its
    share of ``limit``, and of ``max_bytes``, doubled each time the merge took all of the
    last), so a read holds about two answers, whatever
    the topic count: reading every topic's ``limit`` entries, then merging, held 32 times
    an answer for 32 topics (620 MB of server for a 16-message read of 1 MiB messages)."""
    hash = topic_hash(info)
    if len(topics) > 1:
        # Each topic is a read of its own: one put meanwhile (of X, then of Y) could show in a
        # later topic's read and not in an earlier one's, and a reader moving past the last
        # message it got would skip X. Every read stops at what the partition held before the
        # first: all of it is visible to every one of them.
        last = storage.last_rowkey(info.name, int.from_bytes(start_key[:2], "big"))
        if last is None:
            return []
        stop_key = min(stop_key, key_after(last))
    chunk = max(1, -(-limit // len(topics)))
    budget = None if max_bytes is None else max(1, max_bytes // len(topics))

    def entries(topic: bytes) -> Iterator[tuple[bytes, bytes]]:
        start, stop = index_range(start_key, stop_key, topic, hash)
        asked, room = chunk, budget
        while True:
            cells = storage.scan(info.name, start, stop, None, asked, room)
            for key, value in cells:
                if entry_topic(key) == topic:  # (else another topic's: a hash collision)
                    yield message_key(key), value
            cut = room is not None and sum(len(k) + len(v) for k, v in cells) >= room
            if len(cells) < asked and not cut:
                return  # the end of this topic's entries
            start = cells[-1][0] + b"\x00"
            # The merge took all of it: this topic leads, its next chunk twice as big (a
            # topic holding the whole answer takes a few reads, not one per share).
            asked = min(limit, asked * 2)
            room = None if room is None or max_bytes is None else min(max_bytes, room * 2)

    merged = entries(next(iter(topics))) if len(topics) == 1 else heapq.merge(*map(entries, topics))
    found = islice(merged, limit)
    return list(found) if max_bytes is None else until_bytes(found, max_bytes)
