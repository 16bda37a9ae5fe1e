"""Whether reading stays flat as a queue grows: ``scan_batches`` at each size, against raw iteration.

Usage:
    python bench/scan_flat.py [--sizes 1000000,10000000] [--passes 3] [--json out.json]

One embedded store, one ASYNC_WAL partition of 100-byte messages, filled to
each size in turn. At each size, ``--passes`` rounds of: raw rocksdict
iteration of the queue's column family, the store's bounded scans (10,000
cells a call, what a cursor reads), and ``HQueue.scan_batches()``;
min / median / max of the rounds. To compare two versions, run it with each
on ``PYTHONPATH``.
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

from common import report  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402


def rates(queue: HQueue, admin: HQueueAdmin, passes: int) -> dict[str, list[float]]:
    storage = admin.engine.storage
    family = storage._family(queue.name)  # the same rows, read raw

    def raw() -> int:
        return sum(1 for _ in family.items())

    def store_scan() -> int:
        count, start = 0, b"\x00\x00"
        while True:
            cells = storage.scan(queue.name, start, b"\x00\x01", None, 10_000)
            count += len(cells)
            if len(cells) < 10_000:
                return count
            start = cells[-1][0] + b"\x00"

    def batches() -> int:
        return sum(len(batch.values) for batch in queue.scan_batches())

    out: dict[str, list[float]] = {"raw iteration": [], "storage.scan": [], "scan_batches": []}
    for _ in range(passes):
        for name, read in zip(out, (raw, store_scan, batches), strict=True):
            started = time.perf_counter()
            count = read()
            out[name].append(count / (time.perf_counter() - started))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-flat-")
    rows = []
    try:
        url = f"local://{workdir}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("flat", 1, durability=Durability.ASYNC_WAL)
        with HQueueAdmin(url) as admin, HQueue("flat", url) as queue:
            chunk, have = [Message("crawler", b"x" * 93)] * 1000, 0
            for size in map(int, args.sizes.split(",")):
                while have < size:
                    queue.put(chunk, partition_id=0)
                    have += len(chunk)
                for name, measured in rates(queue, admin, args.passes).items():
                    measured.sort()
                    rows.append({"rows": have, "read": name, "min": measured[0],
                                 "median": statistics.median(measured), "max": measured[-1]})  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report("reading as the queue grows (msgs/s)", rows, ["rows", "read", "min", "median", "max"], args.json)


if __name__ == "__main__":
    main()
