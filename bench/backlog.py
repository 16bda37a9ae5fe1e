"""A big backlog: what it costs each server in memory, and reading it, grouping it, restarting over it.

Usage:
    python bench/backlog.py [--messages 10000000] [--group-messages 1000000] [--durability ASYNC_WAL,SYNC_WAL]
                            [--json out.json]

Needs Debian's redis-server and the redis package with hiredis (pip install '.[bench]').

One system at a time on a quiet machine (hqueue, then Redis), each a server
process on loopback: ``hqueue server`` on an embedded store, one partition;
``redis-server`` with its AOF, one stream; at equal durability, each of
``--durability`` against its Redis (ASYNC_WAL against ``appendfsync everysec``,
SYNC_WAL against ``always``). Phases, each timed, with the server's RSS
(from /proc, the same measure for both) after it:

1. fill: ``--messages`` 100-byte messages in batches of 1000 (``put`` of a
   list; pipelined XADDs);
2. read all: a scanner caching 1000 (``messageScannerGetPacked``) against
   XRANGE COUNT 1000;
3. group: one member receives 100 and acks them, from the first message,
   for ``--group-messages`` (XREADGROUP COUNT 100 + XACK);
4. restart: the server stopped (SIGTERM) and started again over its data,
   timed until it answers a read of the backlog's last message (Redis loads
   its AOF first: it answers LOADING until then).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import cpu_seconds, load, redis_client_module, report, rss_mb, timed  # noqa: E402
from remote import hqueue_read, redis_read, start_hqueue, start_redis  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # + the 7-byte topic "crawler" = 100 bytes
BATCH = 1000
GROUP_BATCH = 100


def _row(phase: str, messages: int, seconds: float, proc, cpu_before: float = 0.0) -> dict:
    """A phase's figures; ``cpu_before``: the server's CPU seconds when it began."""
    cpu = (cpu_seconds(proc.pid) - cpu_before) * 1e6 / messages if messages else None
    return {"phase": phase, "messages": messages, "seconds": seconds, "msgs_per_s": messages / seconds if messages
            else None, "server_cpu_us_per_msg": cpu, "rss_mb": rss_mb(proc.pid)}  # fmt: skip


def _stop(proc) -> None:
    proc.terminate()
    proc.wait()


#: Redis's durability equal to each of hqueue's.
FSYNC = {"ASYNC_WAL": "everysec", "SYNC_WAL": "always"}


def hqueue_phases(workdir: str, messages: int, group_messages: int, durability: str) -> list[dict]:
    proc, port = start_hqueue(workdir)
    url = f"hqueue://127.0.0.1:{port}"
    rows = [_row("started, empty", 0, 0.0, proc)]
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("backlog", 1, durability=durability)
        with HQueue("backlog", url) as queue:
            chunk = [Message("crawler", PAYLOAD)] * BATCH

            ids = []

            def fill() -> None:
                for _ in range(messages // BATCH):
                    ids[:] = queue.put(chunk, partition_id=0)

            cpu = cpu_seconds(proc.pid)
            rows.append(_row("fill, batches of 1000", messages, timed(fill), proc, cpu))
            cpu, started = cpu_seconds(proc.pid), time.perf_counter()
            count = hqueue_read(queue)
            rows.append(_row("read all, caching 1000", count, time.perf_counter() - started, proc, cpu))
            with queue.consumer("g") as consumer:

                def drain() -> None:
                    done = 0
                    while done < group_messages:
                        deliveries = consumer.receive(GROUP_BATCH)
                        consumer.ack(deliveries)
                        done += len(deliveries)

                cpu = cpu_seconds(proc.pid)
                rows.append(_row("group: receive 100 + ack", group_messages, timed(drain), proc, cpu))
            last = ids[-1]
        _stop(proc)
        started = time.perf_counter()
        proc, port = start_hqueue(workdir)
        with HQueue("backlog", f"hqueue://127.0.0.1:{port}") as queue:
            assert next(queue.scan(last, partition_id=0, limit=1)).id == last
        rows.append(_row("restart until it answers", 0, time.perf_counter() - started, proc))
    finally:
        _stop(proc)
    return rows


def redis_phases(redis, workdir: str, messages: int, group_messages: int, durability: str) -> list[dict]:
    directory = os.path.join(workdir, "redis")
    proc, port = start_redis(workdir, FSYNC[durability], directory)
    client = redis.Redis(port=port)
    rows = [_row("started, empty", 0, 0.0, proc)]
    try:

        def fill() -> None:
            for _ in range(messages // BATCH):
                pipe = client.pipeline(transaction=False)
                for _ in range(BATCH):
                    pipe.xadd("backlog", {"crawler": PAYLOAD})
                pipe.execute()

        cpu = cpu_seconds(proc.pid)
        rows.append(_row("fill, batches of 1000", messages, timed(fill), proc, cpu))
        cpu, started = cpu_seconds(proc.pid), time.perf_counter()
        count = redis_read(client, "backlog")
        rows.append(_row("read all, caching 1000", count, time.perf_counter() - started, proc, cpu))
        client.xgroup_create("backlog", "g", id="0")

        def drain() -> None:
            done = 0
            while done < group_messages:
                reply = client.xreadgroup("g", "c", {"backlog": ">"}, count=GROUP_BATCH)
                ids = [entry_id for entry_id, _ in reply[0][1]]
                client.xack("backlog", "g", *ids)
                done += len(ids)

        cpu = cpu_seconds(proc.pid)
        rows.append(_row("group: receive 100 + ack", group_messages, timed(drain), proc, cpu))
        last = client.xrevrange("backlog", count=1)[0][0]
        client.close()
        _stop(proc)
        started = time.perf_counter()
        proc, port = start_redis(workdir, FSYNC[durability], directory)
        client = redis.Redis(port=port)
        while True:
            try:
                assert client.xrevrange("backlog", count=1)[0][0] == last
                break
            except redis.exceptions.BusyLoadingError:
                time.sleep(0.01)
        rows.append(_row("restart until it answers", 0, time.perf_counter() - started, proc))
    finally:
        client.close()
        _stop(proc)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--group-messages", type=int, default=1_000_000)
    parser.add_argument("--systems", default="hqueue,redis", help="which to run (one at a time, in this order)")
    parser.add_argument("--durability", default="ASYNC_WAL,SYNC_WAL", help="hqueue's, each against its Redis")
    parser.add_argument("--json")
    args = parser.parse_args()
    redis = redis_client_module()
    messages = args.messages // BATCH * BATCH
    group_messages = min(args.group_messages // GROUP_BATCH * GROUP_BATCH, messages)
    loads, rows = [load()], []
    systems = {"hqueue": hqueue_phases, "redis": lambda *a: redis_phases(redis, *a)}
    for durability in args.durability.split(","):
        for system in args.systems.split(","):
            phases = systems[system]
            workdir = tempfile.mkdtemp(prefix="hqueue-bench-backlog-")
            try:
                name = f"hqueue {durability}" if system == "hqueue" else f"redis {FSYNC[durability]}"
                rows += [{"system": name, **row} for row in phases(workdir, messages, group_messages, durability)]
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            loads.append(load())
    ours = {(row["system"].split()[1], row["phase"]): row for row in rows if row["system"].startswith("hqueue")}
    for row in rows:
        mine = ours.get((next((d for d, f in FSYNC.items() if row["system"] == f"redis {f}"), ""), row["phase"]))
        if mine is not None:
            row["redis_rss_over_hqueue"] = row["rss_mb"] / mine["rss_mb"]
    report(
        f"a backlog of {messages:,} messages of 100 bytes, at equal durability (ASYNC_WAL against appendfsync "
        f"everysec, SYNC_WAL against always), one partition against one stream; RSS after each phase; "
        f"load {' -> '.join(loads)}",
        rows,
        [
            "system",
            "phase",
            "messages",
            "seconds",
            "msgs_per_s",
            "server_cpu_us_per_msg",
            "rss_mb",
            "redis_rss_over_hqueue",
        ],
        args.json,
    )


if __name__ == "__main__":
    main()
