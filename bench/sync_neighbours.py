"""What SYNC_WAL writers cost their neighbours on one server: an ASYNC_WAL client's latency.

Usage:
    python bench/sync_neighbours.py [--tree NAME=DIR ...] [--runs 2] [--writers 4] [--samples 1500] [--batch 1]

``hqueue server`` (embedded store) from each ``--tree`` (default: this
checkout; name another source tree to compare two versions in one run),
systems interleaved, ``--runs`` times. In each: ``--writers`` threads put
one 100-byte message at a time to a SYNC_WAL queue (4 partitions, a
connection each), without pause (``--batch``: that many in each put);
meanwhile one client puts ``--samples`` single messages to an ASYNC_WAL
queue, one at a time. Reported: that client's put latency p50 / p99, and
the SYNC_WAL writers' rate meanwhile (messages a second). Before SYNC_WAL
writes on the event loop shared one fsync a turn, each held the loop (and
the GIL) through its own fsync, and the ASYNC_WAL client waited behind
them. Batches of 1,000 are run by the server's workers, whose fsyncs held
the GIL, and so the loop, until hqueue synced the WAL itself
(storage/walsync.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import percentile, report  # noqa: E402
from remote import start_hqueue  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MESSAGE = Message("crawler", b"x" * 93)


def one_run(name: str, tree: str, writers: int, samples: int, batch: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-neighbours-")
    proc, port = start_hqueue(workdir, tree=tree)
    try:
        url = f"hqueue://127.0.0.1:{port}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("s", 4, durability=Durability.SYNC_WAL)
            admin.create_queue("a", 1, durability=Durability.ASYNC_WAL)
        stop, count = threading.Event(), [0]

        def sync_writer(pid: int) -> None:
            with HQueue("s", url) as queue:
                messages = MESSAGE if batch == 1 else [MESSAGE] * batch
                while not stop.is_set():
                    queue.put(messages, partition_id=pid % 4)
                    count[0] += batch

        threads = [threading.Thread(target=sync_writer, args=(n,)) for n in range(writers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        latencies = []
        with HQueue("a", url) as queue:
            queue.put(MESSAGE, partition_id=0)
            written, started = count[0], time.perf_counter()
            for _ in range(samples):
                begun = time.perf_counter()
                queue.put(MESSAGE, partition_id=0)
                latencies.append(time.perf_counter() - begun)
            seconds, written = time.perf_counter() - started, count[0] - written
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "system": name,
        "async_p50_ms": percentile(latencies, 0.5) * 1000,
        "async_p99_ms": percentile(latencies, 0.99) * 1000,
        "sync_writes_s": written / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR: an hqueue source tree")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=1, help="messages in each SYNC_WAL put")
    parser.add_argument("--json")
    args = parser.parse_args()
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("hqueue", HERE)]
    rows = [
        one_run(name, tree, args.writers, args.samples, args.batch) for _ in range(args.runs) for name, tree in trees
    ]
    report(
        f"an ASYNC_WAL client's single puts beside {args.writers} SYNC_WAL writers (puts of {args.batch}), one "
        "server; one row a run",
        rows, ["system", "async_p50_ms", "async_p99_ms", "sync_writes_s"], args.json,
    )  # fmt: skip


if __name__ == "__main__":
    main()
