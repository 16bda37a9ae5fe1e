"""Millions of topics (SPEC X4): put rate with 1M distinct topics, and what one topic's read costs.

Usage:
    python bench/topics.py [--json out.json] [--messages 1000000]

Embedded store, in process, 8 partitions, batches of 1000 messages of 100
bytes, ASYNC_WAL (so the store's write path, not fsync, is measured).

* put: the same number of messages with one topic, then each with its own
  topic (1M distinct), on a queue with the per-topic index; and with one
  topic on a queue without it (the index's cost). Ratios are measured side
  by side in this run.
* raw store: the same rows and index entries, keys built before the clock
  starts, written straight to rocksdict in the same batches and column
  families as hqueue's: what RocksDB itself gives for one topic against a
  million, and so the ratio the store allows hqueue.
* server: the two indexed loads again through ``hqueue server`` (its own
  process, embedded store), as a remote producer sees them.
* read: after the 1M-topic load, topics with 1, 100 and 10,000 messages
  (spread over every partition) are read through the index and, for
  comparison, by a filtered scan of a queue without the index, holding the
  same rows. Through the index the time follows the topic's rows; without
  it, the whole queue is read each time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rocksdict  # noqa: E402
from common import report  # noqa: E402
from remote import start_hqueue  # noqa: E402
from xxhash import xxh3_64_digest  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message, MessageID  # noqa: E402
from hqueue.keys.index import index_cells
from hqueue.storage.embedded import INDEX_WRITE_BUFFER_BYTES  # noqa: E402

PAYLOAD = b"x" * 85  # + a 15-byte topic = 100 bytes
PARTITIONS = 8


def load(queue: HQueue, total: int, topic_of) -> float:
    """Put ``total`` messages in batches of 1000; messages/s.

    The topic strings are made before the clock starts (formatting a million
    of them is the bench's work, not the queue's); the Message objects are
    made inside it, as a producer would.
    """
    topics = [topic_of(i) for i in range(total)]
    started = time.perf_counter()
    for start in range(0, total, 1000):
        batch = range(start, min(start + 1000, total))  # (the last one short when total is not a multiple)
        queue.put([Message(topics[i], PAYLOAD) for i in batch], (start // 1000) % PARTITIONS)
    return total / (time.perf_counter() - started)


def raw_load(path: str, total: int, topic_of) -> float:
    """The same rows and sorted index entries written straight to rocksdict; messages/s."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_max_background_jobs(2)
    db = rocksdict.Rdict(path, options)
    index_options = rocksdict.Options(raw_mode=True)
    index_options.set_write_buffer_size(INDEX_WRITE_BUFFER_BYTES)
    db.create_column_family("q", rocksdict.Options(raw_mode=True))
    db.create_column_family("i", index_options)
    rows, index = db.get_column_family_handle("q"), db.get_column_family_handle("i")
    batches = []
    for start in range(0, total, 1000):
        prefix = ((start // 1000) % PARTITIONS).to_bytes(2, "big")
        keys = [
            prefix + MessageID(1 + i // 1000, i % 1000).to_bytes() + topic_of(i).encode()
            for i in range(start, min(start + 1000, total))
        ]
        batches.append((keys, [k for k, _ in index_cells(keys, [PAYLOAD] * len(keys), xxh3_64_digest)]))
    write_options = rocksdict.WriteOptions()
    started = time.perf_counter()
    for keys, index_keys in batches:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key in keys:
            batch.put(key, PAYLOAD, rows)
        for key in index_keys:
            batch.put(key, PAYLOAD, index)
        db.write(batch, write_options)
    rate = total / (time.perf_counter() - started)
    del rows, index
    db.close()
    return rate


def read_seconds(queue: HQueue, topic: str) -> tuple[int, float]:
    started = time.perf_counter()
    count = sum(len(batch) for batch in queue.scan_batches(topics=[topic]))
    return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    total = args.messages
    with tempfile.TemporaryDirectory(prefix="hqueue-bench-topics-") as workdir:
        # Each case in a store of its own: a load never pays for another's memtables and compactions.
        urls = {name: f"local://{workdir}/{name}" for name in ("one", "many", "plain")}
        for name, indexed in (("one", True), ("many", True), ("plain", False)):
            with HQueueAdmin(urls[name]) as admin:
                admin.create_queue(name, PARTITIONS, durability=Durability.ASYNC_WAL, topic_index=indexed)
        with (
            HQueue("one", urls["one"]) as one,
            HQueue("many", urls["many"]) as many,
            HQueue("plain", urls["plain"]) as plain,
        ):
            one_rate = load(one, total, lambda i: "topic-0000000")
            many_rate = load(many, total, lambda i: f"topic-{i:07d}")
            plain_rate = load(plain, total, lambda i: f"topic-{i:07d}")
            raw_one = raw_load(f"{workdir}/raw-one", total, lambda i: "topic-0000000")
            raw_many = raw_load(f"{workdir}/raw-many", total, lambda i: f"topic-{i:07d}")
            rows = [
                {"measure": "put, 1 topic, indexed (msgs/s)", "value": one_rate, "ratio": 1.0},
                {
                    "measure": f"put, {total:,} topics, indexed (msgs/s)",
                    "value": many_rate,
                    "ratio": many_rate / one_rate,
                },
                {
                    "measure": f"put, {total:,} topics, no index (msgs/s)",
                    "value": plain_rate,
                    "ratio": plain_rate / one_rate,
                },
                {"measure": "raw rocksdict, rows + index, 1 topic (msgs/s)", "value": raw_one, "ratio": 1.0},
                {
                    "measure": f"raw rocksdict, rows + index, {total:,} topics (msgs/s)",
                    "value": raw_many,
                    "ratio": raw_many / raw_one,
                },
            ]
            for size in (1, 100, 10_000):  # one topic of this many rows, among the million
                topic = f"sized-{size:08d}"
                for queue in (many, plain):
                    for start in range(0, size, 1000):
                        batch = [Message(topic, PAYLOAD)] * min(1000, size - start)
                        queue.put(batch, (start // 1000) % PARTITIONS)
                count, indexed_s = read_seconds(many, topic)
                _, plain_s = read_seconds(plain, topic)
                rows.append(
                    {
                        "measure": f"read a topic of {count:,} rows: index / filtered scan (ms)",
                        "value": indexed_s * 1000,
                        "plain_ms": plain_s * 1000,
                        "ratio": indexed_s / plain_s,
                    }
                )
    rates = {}
    for name, topic in (("one", lambda i: "topic-0000000"), ("many", lambda i: f"topic-{i:07d}")):
        with tempfile.TemporaryDirectory(prefix="hqueue-bench-topics-") as workdir:  # a server and store each
            proc, port = start_hqueue(workdir)
            try:
                url = f"hqueue://127.0.0.1:{port}"
                with HQueueAdmin(url) as admin:
                    admin.create_queue(name, PARTITIONS, durability=Durability.ASYNC_WAL, topic_index=True)
                with HQueue(name, url) as queue:
                    rates[name] = load(queue, total, topic)
            finally:
                proc.terminate()
                proc.wait()
    server_one, server_many = rates["one"], rates["many"]
    rows[3:3] = [
        {"measure": "through hqueue server: put, 1 topic (msgs/s)", "value": server_one, "ratio": 1.0},
        {
            "measure": f"through hqueue server: put, {total:,} topics (msgs/s)",
            "value": server_many,
            "ratio": server_many / server_one,
        },
    ]
    report(
        f"topics: {total:,} messages, 8 partitions, ASYNC_WAL, embedded (and through hqueue server)",
        rows,
        ["measure", "value", "plain_ms", "ratio"],
        args.json,
    )


if __name__ == "__main__":
    main()
