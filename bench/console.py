"""What the web console's pages cost with many queues and groups.

Usage:
    python bench/console.py [--queues 10000] [--groups 1000] [--store memory] [--json out.json]

A Console in this process over a store of ``--queues`` queues (4 partitions
each) and ``--groups`` consumer groups (spread over the first 10 queues), a
few messages in each of those. Each row is one page or JSON endpoint, fetched
over HTTP by a logged-in client: its median and slowest time over
``--repeat`` fetches, and its size. The last rows: this process's RSS
before the console was made, after every page was fetched, and after the
sampler took 720 samples (an hour's worth, taken back to back) with every
queue written between two of them.

``--store memory`` (default) keeps the queues in memory: creating 10,000
queues in an embedded store makes 10,000 RocksDB column families (about
0.1 s each here), which is the store's cost, not the console's; ``--store
local`` measures over RocksDB (use fewer queues).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report, rss_mb  # noqa: E402

from hqueue import HQueueAdmin, Message  # noqa: E402
from hqueue.console import Console  # noqa: E402
from hqueue.console.series import POINTS, Counters  # noqa: E402
from tests.helpers.console_http import ConsoleUser  # noqa: E402

PAGES = [
    "/",
    "/queues",
    "/queues?page=100",
    "/queues?q=q09999",
    "/queues/q00000",
    "/groups",
    "/groups?q=q00009/",
    "/queues/q00000/groups/g0000",
    "/messages?queue=q00000&partition=0",
    "/timers",
    "/audit",
    "/api/overview",
    "/api/queues/q00000",
    "/api/queues/q00000/groups/g0000",
]


def build(admin: HQueueAdmin, queues: int, groups: int) -> None:
    for i in range(queues):
        admin.create_queue(f"q{i:05d}", 4)
    for i in range(groups):
        with admin.queue(f"q{i % 10:05d}") as queue:
            if i < 10:
                queue.put([Message("t", b"message %d" % n) for n in range(100)], 0)
            queue.consumer(f"g{i:04d}").close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--store", choices=("memory", "local"), default="memory")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    data = None if args.store == "memory" else tempfile.mkdtemp(prefix="hqueue-bench-console-")
    url = f"memory://console-bench-{os.getpid()}" if data is None else f"local://{data}"
    admin = HQueueAdmin(url)
    started = time.perf_counter()
    build(admin, args.queues, args.groups)
    print(f"made {args.queues} queues and {args.groups} groups in {time.perf_counter() - started:.1f} s")
    counts = {f"q{i:05d}": 0 for i in range(args.queues)}
    rss_before = rss_mb(os.getpid())
    console = Console(admin, counters=Counters(puts=lambda: counts), sample_interval=3600).start()
    user = ConsoleUser(console.url)
    user.log_in(console.login_token)
    rows = []
    for path in PAGES:
        times, size = [], 0
        for _ in range(args.repeat):
            began = time.perf_counter()
            answer = user.get(path)
            times.append((time.perf_counter() - began) * 1000)
            assert answer.status == 200, (path, answer.status, answer.body[:300])
            size = len(answer.body)
        rows.append({"what": path, "median ms": statistics.median(times), "max ms": max(times), "KB": size / 1024})
    rows.append({"what": "RSS before the console (MB)", "median ms": rss_before})
    rows.append({"what": "RSS after every page (MB)", "median ms": rss_mb(os.getpid())})
    began = time.perf_counter()
    for _ in range(POINTS):
        for name in counts:
            counts[name] += 1
        console.sampler.sample()
    per_sample = (time.perf_counter() - began) * 1000 / POINTS
    rows.append({"what": f"one sample, {args.queues} queues written (ms)", "median ms": per_sample})
    rows.append({"what": "RSS after an hour of samples (MB)", "median ms": rss_mb(os.getpid())})
    console.stop()
    admin.close()
    if data is not None:
        shutil.rmtree(data, ignore_errors=True)
    report(
        f"Console pages: {args.queues} queues, {args.groups} groups ({args.store} store), {args.repeat} fetches each",
        rows,
        ["what", "median ms", "max ms", "KB"],
        args.json,
    )


if __name__ == "__main__":
    main()
