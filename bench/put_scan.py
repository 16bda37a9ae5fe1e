"""Put and scan throughput of hqueue, side by side with raw RocksDB.

Usage:
    python bench/put_scan.py [--storage URL] [--json out.json] [--quick]

For each durability (SYNC_WAL = fsync per batch, the default; ASYNC_WAL),
batch size (1, 100, 1000) and shape (1 partition and 1 writer; 8 partitions
and 8 writer threads, one per partition), it times hqueue puts of 100-byte
messages and, in the same run, raw rocksdict WriteBatch writes of the same
rows with the same WriteOptions. Then it times a QueueScanner over the
8-partition queue against a raw rocksdict iteration of the same rows.

Every ratio is hqueue / raw from this one run; absolute figures depend on the
machine, which the output names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rocksdict  # noqa: E402
from common import report, timed  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402
from hqueue.storage.embedded import _write_options  # noqa: E402

PAYLOAD = b"x" * 93  # + 7-byte topic "crawler" = 100 bytes a message
TOPIC = "crawler"
_ROWKEY = struct.Struct(">HQH")


def messages_for(batch: int) -> int:
    return {1: 3000, 100: 60_000, 1000: 200_000}[batch]


def run_threads(partitions: int, work) -> None:
    threads = [threading.Thread(target=work, args=(pid,)) for pid in range(partitions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def hqueue_put(queue: HQueue, total: int, batch: int, partitions: int) -> None:
    per_partition = total // partitions
    message = Message(TOPIC, PAYLOAD)

    def work(pid: int) -> None:
        chunk = [message] * batch
        for _ in range(per_partition // batch):
            queue.put(chunk, partition_id=pid)

    run_threads(partitions, work)


def raw_put(db: rocksdict.Rdict, total: int, batch: int, partitions: int, durability: str) -> float:
    """The floor: keys are built before the clock starts, so only the store is timed."""
    per_partition = total // partitions
    options = _write_options(durability)
    keys = {pid: [_ROWKEY.pack(pid, ts, 0) + b"crawler" for ts in range(per_partition)] for pid in range(partitions)}

    def work(pid: int) -> None:
        mine = keys[pid]
        for start in range(0, per_partition - batch + 1, batch):
            wb = rocksdict.WriteBatch(raw_mode=True)
            for key in mine[start : start + batch]:
                wb.put(key, PAYLOAD)
            db.write(wb, options)

    seconds = timed(run_threads, partitions, work)
    return seconds


def raw_db(path: str) -> rocksdict.Rdict:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    return rocksdict.Rdict(path, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", help="store URL (default: a temp local:// store)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages (smoke run)")
    parser.add_argument("--label", default="", help="added to the title, e.g. 'HBase TEST STAND-IN, not HBase'")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-")
    url = args.storage or f"local://{workdir}/hqueue"
    raw = url.startswith("local://")
    rows = []
    try:
        with HQueueAdmin(url) as admin:
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                for partitions in (1, 8):
                    for batch in (1, 100, 1000):
                        total = max(messages_for(batch) // scale, batch * partitions)
                        name = f"bench_{durability}_{partitions}_{batch}".lower()
                        admin.create_queue(name, partitions, durability=durability)
                        with HQueue(name, url) as queue:
                            seconds = timed(hqueue_put, queue, total, batch, partitions)
                        row = {
                            "op": "put",
                            "durability": durability,
                            "partitions": partitions,
                            "batch": batch,
                            "messages": total,
                            "hqueue_msgs_s": total / seconds,
                        }
                        if raw:
                            db_path = f"{workdir}/raw_{name}"
                            db = raw_db(db_path)
                            raw_seconds = raw_put(db, total, batch, partitions, durability)
                            db.close()
                            shutil.rmtree(db_path)
                            row["raw_msgs_s"] = total / raw_seconds
                            row["ratio"] = row["hqueue_msgs_s"] / row["raw_msgs_s"]
                        rows.append(row)
            rows += scan_rows(admin, url, workdir, 400_000 // scale, raw)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    columns = ["op", "durability", "partitions", "batch", "messages", "hqueue_msgs_s", "raw_msgs_s", "ratio"]
    label = ("" if raw else f" (storage: {url})") + (f" [{args.label}]" if args.label else "")
    report(f"hqueue put/scan, 100-byte messages{label}", rows, columns, args.json)


def scan_rows(admin: HQueueAdmin, url: str, workdir: str, total: int, raw: bool) -> list[dict]:
    """Reading 8 partitions: the merged queue scanner, and batches of columns,
    each against raw iteration of the same rows."""
    admin.create_queue("bench_scan", 8, durability=Durability.ASYNC_WAL)
    counts: dict[str, int] = {}
    seconds: dict[str, float] = {}
    with HQueue("bench_scan", url) as queue:
        hqueue_put(queue, total, 1000, 8)

        def merged() -> None:
            with queue.get_queue_scanner() as scanner:
                counts["merged"] = sum(1 for _ in scanner)

        def batches() -> None:
            counts["batches"] = sum(len(batch.values) for batch in queue.scan_batches())

        for name, read in (("merged", merged), ("batches", batches)):
            timed(read)  # warm the block cache for both sides alike
            seconds[name] = min(timed(read) for _ in range(3))
    raw_seconds = None
    if raw:
        family = admin.engine.storage._family("bench_scan")  # the same rows, read raw

        def raw_scan() -> None:
            for _ in family.items():
                pass

        timed(raw_scan)
        raw_seconds = min(timed(raw_scan) for _ in range(3))
    rows = []
    for name, op in (("merged", "scan: queue scanner, merged"), ("batches", "scan: scan_batches, columns")):
        row = {"op": op, "durability": "-", "partitions": 8, "batch": "-", "messages": counts[name],
               "hqueue_msgs_s": counts[name] / seconds[name]}  # fmt: skip
        if raw_seconds:
            row["raw_msgs_s"] = counts[name] / raw_seconds
            row["ratio"] = row["hqueue_msgs_s"] / row["raw_msgs_s"]
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
