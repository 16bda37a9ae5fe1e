"""A Processor's throughput: key-ordered handling of a backlog, embedded and through a server.

Usage:
    python bench/processor.py [--messages 20000] [--runs 3] [--json out.json]

A queue of 8 partitions holds ``--messages`` messages of 50 keys; a
:class:`~hqueue.Processor` (defaults: ``queue_size`` 100, ``commit_interval``
0.2 s) handles them all. Rows: the store (``local://`` in this process, or
``hqueue server`` on loopback), the handler (none: it only counts; or a 1 ms
sleep, as a call to another service, with 16 workers), and msgs/s from the
processor's start until the last message is handled (the median of
``--runs``, with the slowest and fastest). The ceiling of the 1 ms case is
its busiest worker's: the 50 keys fall 2 to 5 on each of the 16 workers
(``crc32(key) % 16``), so one worker has a tenth of the messages, at 1,000
a second: 10,000 msgs/s.

A member holds at most 1,000 messages unacked (the server's
``--max-member-in-flight``): a processor that acked on its commit interval
only ran at 1,000 per 0.2 s, whatever its handler.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import start_hqueue  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message, Processor  # noqa: E402

KEYS = 50


def one_run(url: str, name: str, messages: int, sleep: float, workers: int) -> float:
    """msgs/s of a new queue of ``messages`` handled by one Processor."""
    with HQueueAdmin(url) as admin:
        admin.create_queue(name, 8)
    with HQueue(name, url) as queue:
        for start in range(0, messages, 1000):
            batch = range(start, min(messages, start + 1000))
            queue.put([Message("t", b"k%d:%d" % (i % KEYS, i)) for i in batch])
        handled: list[None] = []

        def handle(message: Message) -> None:
            if sleep:
                time.sleep(sleep)
            handled.append(None)  # (atomic: workers run at once)

        started = time.perf_counter()
        with Processor(queue, "p", handle, key=lambda m: m.value.split(b":")[0], workers=workers):
            while len(handled) < messages:
                time.sleep(0.005)
            return messages / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        server, port = start_hqueue(workdir)
        try:
            for store, url in (("embedded", f"local://{workdir}/embedded"), ("server", f"hqueue://127.0.0.1:{port}")):
                for handler, sleep, workers in (("none", 0.0, 4), ("1 ms sleep", 0.001, 16)):
                    rates = [
                        one_run(url, f"q{len(rows)}-{run}", args.messages, sleep, workers) for run in range(args.runs)
                    ]
                    rows.append({"store": store, "handler": handler, "workers": workers,
                                 "msgs/s": statistics.median(rates), "min": min(rates), "max": max(rates)})  # fmt: skip
        finally:
            server.kill()
            server.wait()
    report(f"Processor over {args.messages:,} messages of {KEYS} keys", rows,
           ["store", "handler", "workers", "msgs/s", "min", "max"], args.json)  # fmt: skip


if __name__ == "__main__":
    main()
