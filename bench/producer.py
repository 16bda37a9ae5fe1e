"""Many threads sending one message at a time: hqueue's producer vs unpipelined XADD.

Usage:
    python bench/producer.py [--json out.json] [--runs 3] [--messages 2000] [--threads 16]

Needs Debian's redis-server and the redis package with hiredis (pip install '.[bench]').

Side by side in each run, all servers local subprocesses: ``hqueue server``
(embedded store) and two ``redis-server`` with their AOF, ``appendfsync
always`` (SYNC_WAL's durability: acknowledged once on disk) and
``everysec`` (ASYNC_WAL's). ``--threads`` threads each send ``--messages``
100-byte messages one at a time, each waiting for its acknowledgement:

* hqueue, producer: one ``queue.producer()`` shared by the threads, each
  thread ``send(m).result()``; concurrent sends go out as one put;
* hqueue, put: each thread ``queue.put(m)`` on its own pooled connection
  (one put a call; the server's group commit shares the fsync);
* Redis: each thread its own connection, ``XADD`` and wait for the reply.

Also reported: the servers' CPU per message (from /proc). ``--group-commit``
measures the store alone: 16 threads writing SYNC_WAL batches of one
message, raw rocksdict against the embedded store's commit queue.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import cpu_seconds, load, redis_client_module, report, spread  # noqa: E402
from remote import start_hqueue, start_redis  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # + the 7-byte topic = 100 bytes


def in_threads(threads: int, work) -> float:
    """Seconds until ``work(t)`` returned in every one of ``threads`` threads started together."""
    start = threading.Barrier(threads + 1)

    def run(t: int) -> None:
        start.wait()
        work(t)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - started


def hqueue_producer(url: str, name: str, threads: int, messages: int) -> float:
    with HQueue(name, url) as queue, queue.producer() as producer:
        message = Message("crawler", PAYLOAD)
        producer.send(message).result()  # connected

        def work(_: int) -> None:
            for _ in range(messages):
                producer.send(message).result()

        return in_threads(threads, work)


def hqueue_puts(url: str, name: str, threads: int, messages: int, partitions: int) -> float:
    with HQueue(name, url) as queue:
        message = Message("crawler", PAYLOAD)

        def work(t: int) -> None:
            for _ in range(messages):
                queue.put(message, partition_id=t % partitions)

        return in_threads(threads, work)


def redis_xadd(redis, port: int, threads: int, messages: int) -> float:
    clients = [redis.Redis(port=port) for _ in range(threads)]
    for client in clients:
        client.ping()

    def work(t: int) -> None:
        for _ in range(messages):
            clients[t].xadd("stream", {"crawler": PAYLOAD})

    seconds = in_threads(threads, work)
    for client in clients:
        client.close()
    return seconds


def measured(pid: int, run) -> tuple[float, float]:
    """(seconds, the server's CPU seconds) of ``run()``."""
    before = cpu_seconds(pid)
    seconds = run()
    return seconds, cpu_seconds(pid) - before


def one_run(redis, threads: int, messages: int) -> list[dict]:
    total = threads * messages
    rows = []
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-producer-")
    servers = []
    try:
        hq, hq_port = start_hqueue(workdir)
        servers.append(hq)  # (each stopped in the end, whichever start fails)
        always, always_port = start_redis(workdir, "always")
        servers.append(always)
        everysec, everysec_port = start_redis(workdir, "everysec")
        servers.append(everysec)
        url = f"hqueue://127.0.0.1:{hq_port}"
        with HQueueAdmin(url) as admin:
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                admin.create_queue(f"p_{durability}".lower(), 4, durability=durability)
                admin.create_queue(f"u_{durability}".lower(), 16, durability=durability)
        for durability, rd, rd_port, fsync in (
            (Durability.SYNC_WAL, always, always_port, "always"),
            (Durability.ASYNC_WAL, everysec, everysec_port, "everysec"),
        ):
            rd_s, rd_cpu = measured(rd.pid, lambda p=rd_port: redis_xadd(redis, p, threads, messages))
            name = f"p_{durability}".lower()
            hq_s, hq_cpu = measured(hq.pid, lambda n=name: hqueue_producer(url, n, threads, messages))
            rows.append({"case": f"producer send().result() vs XADD, {durability} vs {fsync}",
                         "hqueue_msgs_s": total / hq_s, "redis_msgs_s": total / rd_s, "ratio": rd_s / hq_s,
                         "hqueue_cpu_us": hq_cpu / total * 1e6, "redis_cpu_us": rd_cpu / total * 1e6})  # fmt: skip
            name = f"u_{durability}".lower()
            hq_s, hq_cpu = measured(hq.pid, lambda n=name: hqueue_puts(url, n, threads, messages, 16))
            rows.append({"case": f"put() per message vs XADD, {durability} vs {fsync}",
                         "hqueue_msgs_s": total / hq_s, "redis_msgs_s": total / rd_s, "ratio": rd_s / hq_s,
                         "hqueue_cpu_us": hq_cpu / total * 1e6, "redis_cpu_us": rd_cpu / total * 1e6})  # fmt: skip
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def group_commit(threads: int, writes: int) -> list[dict]:
    """The store alone: 1 and ``threads`` threads writing one-cell SYNC_WAL batches."""
    import rocksdict

    from hqueue.config import QueueInfo
    from hqueue.message import MessageID, encode_rowkey
    from hqueue.storage.embedded import EmbeddedStorage

    rows = []
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-commit-")
    try:
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        raw = rocksdict.Rdict(os.path.join(workdir, "raw"), options)
        sync = rocksdict.WriteOptions()
        sync.sync = True
        store = EmbeddedStorage(os.path.join(workdir, "store"))
        store.create_queue(QueueInfo("q", threads))

        def raw_work(t: int) -> None:
            for n in range(writes):
                batch = rocksdict.WriteBatch(raw_mode=True)
                batch.put(b"%d-%d" % (t, n), PAYLOAD)
                raw.write(batch, sync)

        def store_work(t: int) -> None:
            for n in range(writes):
                key = encode_rowkey(t, MessageID(1_700_000_000_000 + n, 0)) + b"t"
                store.write("q", [(key, PAYLOAD)], Durability.SYNC_WAL)

        for n in (1, threads):
            raw_s = in_threads(n, raw_work)
            groups, carried = store._commit.groups, store._commit.writes
            store_s = in_threads(n, store_work)
            per_group = (store._commit.writes - carried) / max(1, store._commit.groups - groups)
            rows.append({"case": f"SYNC_WAL one-cell writes, {n} thread(s)", "store_writes_s": n * writes / store_s,
                         "raw_writes_s": n * writes / raw_s, "ratio": raw_s / store_s,
                         "writes_per_fsync": per_group})  # fmt: skip
        store.close()
        raw.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument(
        "--messages",
        type=int,
        default=2000,
        help="per thread (400 ran under a second a case: too short to tell the sides apart)",
    )
    parser.add_argument("--group-commit", action="store_true", help="the store alone (no servers)")
    args = parser.parse_args()
    loads = [load()]
    if args.group_commit:
        runs = [group_commit(args.threads, args.messages) for _ in range(args.runs)]
        columns = ["case", "store_writes_s", "raw_writes_s", "ratio", "writes_per_fsync"]
        title = "group commit: SYNC_WAL writes of one 100-byte cell, the embedded store vs raw rocksdict"
    else:
        redis = redis_client_module()
        runs = []
        for _ in range(args.runs):
            runs.append(one_run(redis, args.threads, args.messages))
            loads.append(load())
        columns = ["case", "hqueue_msgs_s", "redis_msgs_s", "ratio", "hqueue_cpu_us", "redis_cpu_us", "ratios"]
        title = (f"{args.threads} threads, one 100-byte message at a time, each waiting for its ack "
                 "(ratio > 1: hqueue better; median run shown, ratios min / median / max)")  # fmt: skip
    rows = []
    for i, _row in enumerate(runs[0]):
        ratios = [run[i]["ratio"] for run in runs]
        median = sorted(runs, key=lambda run, i=i: run[i]["ratio"])[len(runs) // 2][i]
        rows.append({**median, "ratios": spread(ratios), "ratio": statistics.median(ratios)})
    columns = columns if "ratios" in columns else [*columns, "ratios"]
    report(f"{title}; load {' -> '.join(loads)}", rows, columns, args.json)


if __name__ == "__main__":
    main()
