"""Consumer groups (SPEC X3): receive + ack throughput, hqueue vs Redis XREADGROUP/XACK.

Usage:
    python bench/groups.py [--json out.json] [--messages 200000] [--members 1,4,16] [--batch 100]
                           [--modes ahead,plain]

Needs Debian's redis-server and the redis package (pip install '.[bench]').

Each side: a broker process, ``--messages`` 100-byte messages put first,
then N member processes that start together and loop "receive up to
``--batch``, ack them" until the queue is drained.

* hqueue: ``hqueue server`` on an embedded store, a 16-partition ASYNC_WAL
  (or SYNC_WAL) queue (acks are kept with the queue's durability), ``queue.consumer(g)``:
  ``receive(batch)`` then ``ack``.
* Redis: ``redis-server`` with ``appendonly yes``, ``appendfsync everysec``
  (against ASYNC_WAL) or ``always`` (against SYNC_WAL: equal durability);
  one stream, one group; ``XREADGROUP COUNT batch`` then ``XACK``.

Two modes, each side at the same one:

* ``ahead``: each side hides a round trip the way its client can. hqueue's member is
  ``queue.consumer(g, prefetch=True)`` (it asks for its next batch as it hands one out);
  Redis's sends its ``XACK`` and the next ``XREADGROUP`` in one pipeline.
* ``plain``: one call at a time on both sides: ``receive`` then ``ack``; ``XREADGROUP`` then ``XACK``.

Throughput = messages / (the last member's last ack - the common start).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import load, median_pair, redis_client_module, report, rss_mb  # noqa: E402
from remote import start_hqueue, start_redis  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # topic "crawler" + 93 bytes = 100
#: Redis's durability equal to each of hqueue's: always fsyncs before the reply, everysec once a second.
FSYNC = {"ASYNC_WAL": "everysec", "SYNC_WAL": "always"}


def hqueue_member(port: int, batch: int, start_at: float, ahead: bool) -> dict:
    with HQueue("work", f"hqueue://127.0.0.1:{port}") as queue, queue.consumer("g", prefetch=ahead) as consumer:
        queue.engine.queue_info("work")  # connect before the start
        time.sleep(max(0.0, start_at - time.time()))
        count, last = 0, time.time()
        while True:
            deliveries = consumer.receive(batch, wait=0.5)
            if not deliveries:
                return {"count": count, "last": last}
            consumer.ack(deliveries)
            count, last = count + len(deliveries), time.time()


def redis_member(port: int, batch: int, start_at: float, name: str, ahead: bool) -> dict:
    import redis

    client = redis.Redis(port=port)
    client.ping()
    time.sleep(max(0.0, start_at - time.time()))
    count, last = 0, time.time()
    reply = None
    while True:
        if not reply:  # (none read ahead: wait for one)
            reply = client.xreadgroup("g", name, {"work": ">"}, count=batch, block=500)
            if not reply:
                return {"count": count, "last": last}
        ids = [entry_id for entry_id, _ in reply[0][1]]
        if ahead:  # the ack and the next read (not waiting: as hqueue's asked ahead) in one round trip
            pipe = client.pipeline(transaction=False)
            pipe.xack("work", "g", *ids)
            pipe.xreadgroup("g", name, {"work": ">"}, count=batch)
            reply = pipe.execute()[1]
        else:
            client.xack("work", "g", *ids)
            reply = None
        count, last = count + len(ids), time.time()


def run_members(system: str, port: int, members: int, batch: int, ahead: bool) -> tuple[int, float]:
    start_at = time.time() + 3.0
    mode = "ahead" if ahead else "plain"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--member", system, str(port), str(batch), repr(start_at), f"c{i}", mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(members)
    ]
    results = [json.loads(proc.communicate()[0]) for proc in procs]
    return sum(r["count"] for r in results), max(r["last"] for r in results) - start_at


def fill_work(url: str, messages: int, durability: str) -> None:
    """Make the 16-partition queue "work" at ``url`` and put ``messages`` 100-byte messages in
    it, 1,000 a batch, the batches spread over the partitions in turn."""
    with HQueueAdmin(url) as admin:
        admin.create_queue("work", 16, durability=durability)
    with HQueue("work", url) as queue:
        for i in range(0, messages, 1000):
            queue.put([Message("crawler", PAYLOAD)] * 1000, partition_id=(i // 1000) % 16)


def hqueue_run(workdir: str, messages: int, members: int, batch: int, durability: str, ahead: bool) -> dict:
    proc, port = start_hqueue(workdir)
    try:
        fill_work(f"hqueue://127.0.0.1:{port}", messages, durability)
        count, seconds = run_members("hqueue", port, members, batch, ahead)
        system = f"hqueue {durability}" + (" prefetch" if ahead else "")
        return {"system": system, "members": members, "received": count,
                "msgs_per_s": count / seconds, "rss_mb": rss_mb(proc.pid)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()


def redis_run(workdir: str, messages: int, members: int, batch: int, fsync: str, ahead: bool) -> dict:
    import redis

    proc, port = start_redis(workdir, fsync)
    try:
        client = redis.Redis(port=port)
        for _ in range(0, messages, 1000):
            pipe = client.pipeline(transaction=False)
            for _ in range(1000):
                pipe.xadd("work", {"crawler": PAYLOAD})
            pipe.execute()
        client.xgroup_create("work", "g", id="0")
        count, seconds = run_members("redis", port, members, batch, ahead)
        system = f"redis {fsync}" + (" pipelined" if ahead else "")
        return {"system": system, "members": members, "received": count,
                "msgs_per_s": count / seconds, "rss_mb": rss_mb(proc.pid)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()


def group_arguments(doc: str) -> argparse.Namespace:
    """The arguments of this bench and of aio_groups.py; refuses to go on without hiredis or redis-server."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--members", default="1,4,16")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--durability", default="ASYNC_WAL,SYNC_WAL", help="hqueue's, each against its Redis")
    parser.add_argument("--runs", type=int, default=3, help="side-by-side runs; ratios are min / median / max")
    parser.add_argument("--modes", default="ahead,plain", help="ahead: prefetch vs a pipelined ack + read; plain")
    args = parser.parse_args()
    redis_client_module()
    return args


def group_rows(args: argparse.Namespace, hqueue_run, redis_run, prefix: str) -> tuple[list[dict], list[str]]:
    """Each mode, durability and member count, run side by side (median_pair); and the loads."""
    rows, loads = [], [load()]
    for ahead in [{"ahead": True, "plain": False}[mode] for mode in args.modes.split(",")]:
        for durability in args.durability.split(","):
            for members in map(int, args.members.split(",")):
                run = {"messages": args.messages, "members": members, "batch": args.batch, "ahead": ahead}
                ours = partial(hqueue_run, **run, durability=durability)
                theirs = partial(redis_run, **run, fsync=FSYNC[durability])
                rows += median_pair(args.runs, ours, theirs, loads, prefix)
    return rows, loads


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        system, port, batch, start_at, name, mode = sys.argv[2:8]
        if system == "hqueue":
            result = hqueue_member(int(port), int(batch), float(start_at), mode == "ahead")
        else:
            result = redis_member(int(port), int(batch), float(start_at), name, mode == "ahead")
        print(json.dumps(result))
        return
    args = group_arguments(__doc__)
    rows, loads = group_rows(args, hqueue_run, redis_run, "hqueue-bench-groups-")
    report(
        f"consumer groups: receive {args.batch} + ack, {args.messages:,} messages of 100 bytes; the median run "
        f"of {args.runs}, ratios min / median / max; load {' -> '.join(loads)}",
        rows,
        ["system", "members", "received", "msgs_per_s", "rss_mb", "vs_redis", "ratios"],
        args.json,
    )


if __name__ == "__main__":
    main()
