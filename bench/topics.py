"""Millions of topics (SPEC X4): put rate with 1M distinct topics, and what one topic's read costs.

Usage:
    python bench/topics.py [--json out.json] [--messages 1000000]

Embedded store, in process, 8 partitions, batches of 1000 messages of 100
bytes, ASYNC_WAL (so the store's write path, not fsync, is measured).

* put: the same number of messages with one topic, then each with its own
  topic (1M distinct), on a queue with the per-topic index; and with one
  topic on a queue without it (the index's cost). Ratios are measured side
  by side in this run.
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

from common import report  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 85  # + a 15-byte topic = 100 bytes
PARTITIONS = 8


def load(queue: HQueue, total: int, topic_of) -> float:
    """Put ``total`` messages in batches of 1000; messages/s."""
    started = time.perf_counter()
    for start in range(0, total, 1000):
        queue.put([Message(topic_of(i), PAYLOAD) for i in range(start, start + 1000)], (start // 1000) % PARTITIONS)
    return total / (time.perf_counter() - started)


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
    with tempfile.TemporaryDirectory() as workdir:
        url = f"local://{workdir}/data"
        with HQueueAdmin(url) as admin:
            for name, indexed in (("one", True), ("many", True), ("plain", False)):
                admin.create_queue(name, PARTITIONS, durability=Durability.ASYNC_WAL, topic_index=indexed)
        with HQueue("one", url) as one, HQueue("many", url) as many, HQueue("plain", url) as plain:
            one_rate = load(one, total, lambda i: "topic-0000000")
            many_rate = load(many, total, lambda i: f"topic-{i:07d}")
            plain_rate = load(plain, total, lambda i: f"topic-{i:07d}")
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
    report(
        f"topics: {total:,} messages, 8 partitions, embedded, ASYNC_WAL",
        rows,
        ["measure", "value", "plain_ms", "ratio"],
        args.json,
    )


if __name__ == "__main__":
    main()
