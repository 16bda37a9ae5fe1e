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
from .keys.index import (
    DEFAULT_HASH,
    HASH_KEY,
    HEAD_LENGTH,
    TopicHash,
    entry_topic,
    index_range,
    message_key,
    topic_hash,
)
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
#: A server reads at most this many topics' index entries on its event loop; more, on a worker.
INLINE_TOPICS = 4


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

    One topic's entries are read a chunk at a time, up to ``limit`` and ``max_bytes``;
    several topics' are picked by key first (:func:`_merged`), so a read holds about one
    answer, whatever the topic count."""
    hash = topic_hash(info)
    if len(topics) > 1:
        return _merged(storage, info, start_key, stop_key, topics, limit, max_bytes, hash)
    topic = next(iter(topics))
    start, stop = index_range(start_key, stop_key, topic, hash)
    asked, room = limit, max_bytes
    found: list[tuple[bytes, bytes]] = []
    while len(found) < limit:
        cells = storage.scan(info.name, start, stop, None, asked, room)
        found += [(message_key(key), value) for key, value in cells if entry_topic(key) == topic]  # (collisions)
        cut = room is not None and sum(len(k) + len(v) for k, v in cells) >= room
        if len(cells) < asked or cut:
            break
        start = cells[-1][0] + b"\x00"
        asked = min(limit, asked * 2)
    found = found[:limit]
    return found if max_bytes is None else until_bytes(found, max_bytes)


def _merged(
    storage: Storage,
    info: QueueInfo,
    start_key: bytes,
    stop_key: bytes,
    topics: Collection[bytes],
    limit: int,
    max_bytes: int | None,
    hash: TopicHash,
) -> list[tuple[bytes, bytes]]:
    """:func:`scan` of several topics: their entries' keys first (each topic's a chunk at a
    time, its share of ``limit``, doubled each time the merge took all of the last), merged
    in message order up to ``limit``; then the values of those, in that order, until
    ``max_bytes``, read in windows that double (at most about twice the answer is read).
    Reading each topic's first entry whole held one message per topic (64 messages of
    4 MiB for a one-message read: 260 MB of server, an attacker's pass)."""
    # Each topic is a read of its own: one put meanwhile (of X, then of Y) could show in a
    # later topic's read and not in an earlier one's, and a reader moving past the last
    # message it got would skip X. Every read stops at what the partition held before the
    # first: all of it is visible to every one of them.
    last = storage.last_rowkey(info.name, int.from_bytes(start_key[:2], "big"))
    if last is None:
        return []
    stop_key = min(stop_key, key_after(last))
    chunk = -(-limit // len(topics))

    def entry_keys(topic: bytes) -> Iterator[bytes]:
        start, stop = index_range(start_key, stop_key, topic, hash)
        asked = chunk
        while True:
            keys = storage.scan_keys(info.name, start, stop, asked)
            yield from (key for key in keys if entry_topic(key) == topic)  # (else a hash collision)
            if len(keys) < asked:
                return
            start = keys[-1] + b"\x00"
            asked = min(limit, asked * 2)

    chosen = list(islice(heapq.merge(*map(entry_keys, topics), key=message_key), limit))
    found: list[tuple[bytes, bytes]] = []
    room, at, window = max_bytes, 0, 1
    while at < len(chosen):
        # The next ``window`` of them (1, 2, 4…: twice as many each time the answer has room
        # for them all): one read a topic for its part of it (a topic's entries in a window are
        # contiguous in its index), not one a run of a topic (2 topics taking turns: a read each).
        part, at = chosen[at : at + window], at + window
        by_topic: dict[bytes, list[bytes]] = {}
        for key in part:
            by_topic.setdefault(key[:HEAD_LENGTH], []).append(key)
        values: dict[bytes, bytes] = {}
        for keys in by_topic.values():
            wanted = set(keys)
            cells = storage.scan(info.name, keys[0], keys[-1] + b"\x00", None, len(keys) + COLLISIONS)
            values.update(cell for cell in cells if cell[0] in wanted)
        for key in part:
            value = values.get(key)
            if value is None:  # (gone meanwhile: expired, truncated)
                continue
            found.append((message_key(key), value))
            if room is not None:
                room -= len(found[-1][0]) + len(value)
                if room <= 0:
                    return found
        window *= 2
    return found


#: Entries of other topics (a hash collision) a read of one run of a topic's entries may meet.
COLLISIONS = 16
