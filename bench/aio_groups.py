"""Async consumer groups: receive + ack on one event loop, hqueue.aio vs redis.asyncio (hiredis).

Usage:
    python bench/aio_groups.py [--json out.json] [--messages 200000] [--members 1,4,16] [--batch 100] [--runs 3]
                               [--modes ahead,plain]

Needs Debian's redis-server, the redis package and hiredis (pip install '.[bench]' hiredis).

Each side: a broker process, ``--messages`` 100-byte messages put first, then
one client process running N member tasks on one asyncio loop, each looping
"receive up to ``--batch``, ack them" until the queue is drained.

* hqueue: ``hqueue server`` on an embedded store, a 16-partition ASYNC_WAL
  (then SYNC_WAL) queue; ``AsyncHQueue(...).consumer("g")``: ``await receive(batch)`` then
  ``await ack``: the async Thrift client, no thread per call.
* Redis: ``redis-server`` (``appendonly yes``, ``appendfsync everysec``
  against ASYNC_WAL, ``always`` against SYNC_WAL: equal durability), one
  stream, one group; ``redis.asyncio`` with hiredis: ``XREADGROUP COUNT
  batch`` then ``XACK``.

Two modes, as bench/groups.py's: ``ahead`` (hqueue's member with ``prefetch=True``; Redis's
``XACK`` and next ``XREADGROUP`` in one pipeline) and ``plain`` (one call at a time).

Throughput = messages / (the last member's last ack - the start). The client's
CPU seconds (user + system) while its members run are reported too: the loop's cost per message.
Each member count runs ``--runs`` times side by side; a row is the median run's,
with the ratios' min / median / max.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from groups import fill_work, group_arguments, group_rows  # noqa: E402
from remote import start_hqueue, start_redis  # noqa: E402

PAYLOAD = b"x" * 93  # topic "crawler" + 93 bytes = 100


async def hqueue_members(port: int, members: int, batch: int, ahead: bool) -> tuple[int, float, float]:
    from hqueue.aio import AsyncHQueue

    async with AsyncHQueue("work", f"hqueue://127.0.0.1:{port}") as queue:

        async def member(name: str) -> tuple[int, float]:
            count, last = 0, time.monotonic()
            async with queue.consumer("g", member=name, prefetch=ahead) as consumer:
                while True:
                    deliveries = await consumer.receive(batch, wait=0.5)
                    if not deliveries:
                        return count, last
                    await consumer.ack(deliveries)
                    count, last = count + len(deliveries), time.monotonic()

        return await timed_members(member, members)


async def redis_members(port: int, members: int, batch: int, ahead: bool) -> tuple[int, float, float]:
    import redis.asyncio

    client = redis.asyncio.Redis(port=port, max_connections=members + 1)
    await client.ping()

    async def member(name: str) -> tuple[int, float]:
        count, last, reply = 0, time.monotonic(), None
        while True:
            if not reply:  # (none read ahead: wait for one)
                reply = await client.xreadgroup("g", name, {"work": ">"}, count=batch, block=500)
                if not reply:
                    return count, last
            ids = [entry_id for entry_id, _ in reply[0][1]]
            if ahead:  # the ack and the next read (not waiting) in one round trip
                async with client.pipeline(transaction=False) as pipe:
                    pipe.xack("work", "g", *ids)
                    pipe.xreadgroup("g", name, {"work": ">"}, count=batch)
                    reply = (await pipe.execute())[1]
            else:
                await client.xack("work", "g", *ids)
                reply = None
            count, last = count + len(ids), time.monotonic()

    try:
        return await timed_members(member, members)
    finally:
        await client.aclose()


async def timed_members(member, members: int) -> tuple[int, float, float]:
    """(messages, seconds to the last ack, CPU seconds of this process meanwhile)."""
    start, cpu = time.monotonic(), time.process_time()
    results = await asyncio.gather(*(member(f"c{i}") for i in range(members)))
    return sum(r[0] for r in results), max(r[1] for r in results) - start, time.process_time() - cpu


def client(system: str, port: int, members: int, batch: int, ahead: bool) -> dict:
    """Run in a process of its own: one loop, N member tasks. The CPU is the members'
    (before 2026-11-24 it was the whole process's, imports included: hqueue's were
    about 1 µs a message of the figure)."""
    run = hqueue_members if system == "hqueue" else redis_members
    count, seconds, cpu = asyncio.run(run(port, members, batch, ahead))
    return {"count": count, "seconds": seconds, "cpu": cpu}


def run_client(system: str, port: int, members: int, batch: int, ahead: bool) -> dict:
    mode = "ahead" if ahead else "plain"
    out = subprocess.run(
        [sys.executable, __file__, "--client", system, str(port), str(members), str(batch), mode],
        stdout=subprocess.PIPE, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def hqueue_run(workdir: str, messages: int, members: int, batch: int, durability: str, ahead: bool) -> dict:
    proc, port = start_hqueue(workdir)
    try:
        fill_work(f"hqueue://127.0.0.1:{port}", messages, durability)
        result = run_client("hqueue", port, members, batch, ahead)
    finally:
        proc.terminate()
        proc.wait()
    return row(f"hqueue.aio {durability}" + (" prefetch" if ahead else ""), members, result)


def redis_run(workdir: str, messages: int, members: int, batch: int, fsync: str, ahead: bool) -> dict:
    import redis

    proc, port = start_redis(workdir, fsync)
    try:
        sync = redis.Redis(port=port)
        for _ in range(0, messages, 1000):
            pipe = sync.pipeline(transaction=False)
            for _ in range(1000):
                pipe.xadd("work", {"crawler": PAYLOAD})
            pipe.execute()
        sync.xgroup_create("work", "g", id="0")
        result = run_client("redis", port, members, batch, ahead)
    finally:
        proc.terminate()
        proc.wait()
    return row(f"redis.asyncio+hiredis {fsync}" + (" pipelined" if ahead else ""), members, result)


def row(system: str, members: int, result: dict) -> dict:
    return {
        "system": system, "members": members, "received": result["count"],
        "msgs_per_s": result["count"] / result["seconds"],
        "client_cpu_us_per_msg": 1e6 * result["cpu"] / result["count"],
    }  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        system, port, members, batch, mode = sys.argv[2:7]
        print(json.dumps(client(system, int(port), int(members), int(batch), mode == "ahead")))
        return
    args = group_arguments(__doc__)
    rows, loads = group_rows(args, hqueue_run, redis_run, "hqueue-bench-aio-groups-")
    columns = ["system", "members", "received", "msgs_per_s", "client_cpu_us_per_msg", "vs_redis", "ratios"]
    title = (
        f"async receive + ack: hqueue.aio vs redis.asyncio; the median run of {args.runs}, "
        f"ratios min / median / max; load {' -> '.join(loads)}"
    )
    report(title, rows, columns, args.json)


if __name__ == "__main__":
    main()
