"""What a hostile consumer-group member costs an hqueue server (issue 18.5, 18.6).

Usage:
    python bench/group_abuse.py [--json out.json] [--before DIR]

Each figure comes from an ``hqueue server`` subprocess on loopback (embedded
store, a 1-partition queue, default limits):

* made-up acks: one ``groupAck`` of 200,000 receipts of messages that were
  never written: the call's time, the server's RSS growth, and the acked IDs
  the group then keeps ahead of its cursor (``describeGroup``);
* a hoarding member: member A asks three times for 10,000 messages for an
  hour and never acks; then 5,000 new messages are put, and member B
  receives (acking each batch) for up to 20 s: what A holds, what B got of
  the new ones, and how long B took.
* a flood of groups: a consumer opens 5,000 groups on a 16-partition queue
  (as a consumer token may): how many were made, the server's RSS growth,
  and the size of a /metrics scrape after.
* a crowd waiting: 100 members each hold 10 messages of a drained queue (a
  server with ``--max-member-in-flight 20``: none at its cap, the group over
  it); 50 of them wait in a receive while the other 50 ack theirs one at a
  time: the server's CPU per ack, and how many receives the acks woke
  (none may get anything: no member was at its cap).

``--before DIR``: also run the servers from another source tree (e.g.
``git archive main | tar -x -C DIR``), as a second column.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import cpu_seconds, report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402

from hqueue import HQueue, HQueueAdmin, HQueueError, Message, MessageID  # noqa: E402
from hqueue.api import groups_of  # noqa: E402
from hqueue.message import encode_rowkey  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def start_server(tree: str, workdir: str, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{workdir}", "--port", str(port),
         "--log-level", "ERROR", *extra],
        env=dict(os.environ, PYTHONPATH=tree), cwd=tree, stderr=open(f"{workdir}.log", "w"),
    )  # fmt: skip
    wait_port(port, proc=proc)
    return proc, port


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmRSS:"))) / 1024


def made_up_acks(proc: subprocess.Popen, url: str) -> dict[str, float]:
    with HQueue("made-up", url) as queue, queue.consumer("g") as consumer:
        queue.put([Message("t", b"x")], 0)
        consumer.ack(consumer.receive(1, wait=2))
        receipts = [encode_rowkey(0, MessageID(4_000_000_000_000 + i // 32_000, i % 32_000)) for i in range(200_000)]
        groups = groups_of(queue.engine)
        before = rss_mb(proc.pid)
        start = time.perf_counter()
        groups.ack("made-up", "g", receipts)
        took = (time.perf_counter() - start) * 1000
        return {
            "ack ms": took,
            "rss MB": rss_mb(proc.pid) - before,
            "kept": groups.describe("made-up", "g")["partitions"][0]["acked_ahead"],
        }


def hoarding(url: str) -> dict[str, float]:
    with HQueue("hoard", url) as queue:
        for start in range(0, 10_000, 2_000):
            queue.put([Message("old", b"%d" % i) for i in range(start, start + 2_000)], 0)
        with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
            b.nack(b.receive(1, wait=1), delay=0)  # b is a member
            held = sum(len(a.receive(10_000, wait=0, lease=3600)) for _ in range(3))
            queue.put([Message("new", b"%d" % i) for i in range(5_000)], 0)
            new, start = 0, time.perf_counter()
            while new < 5_000 and time.perf_counter() - start < 20:
                got = b.receive(1_000, wait=0.5)
                b.ack(got)
                new += sum(1 for d in got if d.topic == b"new")
            return {"held": held, "new": new, "seconds": time.perf_counter() - start}


def group_flood(proc: subprocess.Popen, url: str, metrics_port: int) -> dict[str, float]:
    made, before = 0, rss_mb(proc.pid)
    with HQueue("flood", url) as queue:
        for made in range(5_000):
            try:
                queue.consumer(f"g{made}").close()
            except HQueueError:
                break
        else:
            made = 5_000
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=600).read()
    return {"groups": made, "groups rss MB": rss_mb(proc.pid) - before, "scrape KiB": len(scrape) / 1024}


def waiting_crowd(tree: str, work: str, members: int = 100) -> dict[str, float]:
    proc, port = start_server(tree, f"{work}-crowd", "--max-member-in-flight", "20")
    url = f"hqueue://127.0.0.1:{port}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("crowd", 1)
        with HQueue("crowd", url) as queue:
            queue.put([Message("t", b"%d" % i) for i in range(members * 10)], 0)
            consumers = [queue.consumer("g", member=f"m{i}") for i in range(members)]
            held = [c.receive(10, wait=5, lease=600) for c in consumers]
            waiters, ackers = consumers[: members // 2], list(zip(consumers, held, strict=True))[members // 2 :]
            got: list = []
            threads = [threading.Thread(target=lambda c=c: got.extend(c.receive(10, wait=30))) for c in waiters]
            for thread in threads:
                thread.start()
            time.sleep(2)  # (all waiting)
            before, acks = cpu_seconds(proc.pid), 0
            for consumer, deliveries in ackers:
                for delivery in deliveries:
                    consumer.ack([delivery])
                    acks += 1
            spent, woken = cpu_seconds(proc.pid) - before, len(got)
            for consumer in consumers:  # (those waiting leave: their receives end)
                consumer.close()
            for thread in threads:
                thread.join(60)
        return {"crowd ack us": spent / acks * 1e6, "crowd got": woken}
    finally:
        proc.terminate()
        proc.wait()


def measure(tree: str, work: str) -> dict[str, float]:
    metrics_port = free_port()
    proc, port = start_server(tree, work, "--metrics-port", str(metrics_port))
    url = f"hqueue://127.0.0.1:{port}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("made-up", 1)
            admin.create_queue("hoard", 1)
            admin.create_queue("flood", 16)
        found = {**made_up_acks(proc, url), **hoarding(url), **group_flood(proc, url, metrics_port)}
    finally:
        proc.terminate()
        proc.wait()
    return {**found, **waiting_crowd(tree, work)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--before", help="another source tree to run the server from")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hqueue-bench-groups-") as work:
        now = measure(HERE, f"{work}/now")
        before = measure(os.path.abspath(args.before), f"{work}/before") if args.before else {}
    labels = {
        "ack ms": "one ack of 200,000 made-up receipts: ms",
        "rss MB": "server RSS growth after it, MB",
        "kept": "acked IDs kept ahead of the cursor",
        "held": "A: held after 3 x receive(10,000, lease 1 h)",
        "new": "B: of 5,000 new messages, got (20 s at most)",
        "seconds": "B: seconds to get them",
        "groups": "groups a consumer made of 5,000 asked (16 partitions)",
        "groups rss MB": "server RSS growth after them, MB",
        "scrape KiB": "a /metrics scrape after them, KiB",
        "crowd ack us": "50 members waiting: server CPU per ack of another, µs",
        "crowd got": "messages those waiting got (none to get)",
    }
    rows = [{"measure": text, "hqueue": now[key], "before": before.get(key)} for key, text in labels.items()]
    report("a hostile consumer-group member: hqueue server", rows, ["measure", "hqueue", "before"], args.json)


if __name__ == "__main__":
    main()
