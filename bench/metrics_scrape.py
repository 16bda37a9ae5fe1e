"""What one Prometheus scrape costs an hqueue server with many consumer groups.

Usage:
    python bench/metrics_scrape.py [--before SRC] [--groups 1000 --partitions 16] [--messages 1000]
                                   [--json out.json]

A server subprocess on loopback gets a queue of P partitions with 1,000
messages in each (``--messages``), and G consumer groups (made by a consumer, as an attacker
with a consumer token could), each with its state loaded over every
partition (a describe) and one message received. Then /metrics is scraped:
the figures are the server's CPU ms (user + system, from /proc; less what
the server spends over as long without a scrape, RocksDB's background work
on the set-up's writes: both are shown) and the wall ms of one scrape, the
mean (CPU) and median (wall) of 20 after the first (which asks the lag book to
count each reader once: those counts run in the server's background thread,
and the first scrape waits for them up to 2 s, so its CPU includes them; what
is left is waited for here and reported apart as "seeding"). 200 x 16 of 200
messages, 2026-11-23: first scrape 400-440 ms CPU with seeding 0-10 ms after,
where it was 0-10 ms with 270-280 ms of seeding after; later scrapes alike.

``--before SRC`` runs the same against the server of another source tree (a
``git archive main`` unpacked there) for the "before" column.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRAPES = 20


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=600).read()


def measure(groups: int, partitions: int, messages: int, source: str = HERE) -> dict[str, float]:
    """{"cpu_ms", "wall_ms", "first_cpu_ms", "seeding_cpu_ms", "series"} of a server run from ``source``."""
    with tempfile.TemporaryDirectory(prefix="hqueue-bench-metrics-") as work:
        port, metrics_port = free_port(), free_port()
        env = dict(os.environ, PYTHONPATH=source)
        proc = subprocess.Popen(
            [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{work}/data", "--port", str(port),
             "--metrics-port", str(metrics_port), "--log-level", "WARNING"],
            env=env, cwd=work, stderr=open(f"{work}/server.log", "w"),
        )  # fmt: skip
        try:
            wait_port(port, proc=proc)
            url = f"hqueue://127.0.0.1:{port}"
            with HQueueAdmin(url) as admin:
                admin.create_queue("q", partitions)
            with HQueue("q", url) as queue, HQueueAdmin(url) as admin:
                for pid in range(partitions):
                    queue.put([Message("t", b"x" * 100)] * messages, partition_id=pid)
                for g in range(groups):
                    with queue.consumer(f"g{g}", member="m") as consumer:
                        consumer.receive(1, wait=0)
                    admin.describe_group("q", f"g{g}")  # every partition's state held, before as after
            lag_series = groups * partitions
            cpu = cpu_seconds(proc.pid)
            scrape(metrics_port)
            first = cpu_seconds(proc.pid) - cpu
            started = time.monotonic()
            while scrape(metrics_port).count(b"\nhqueue_group_lag_messages{") < lag_series:
                if time.monotonic() - started > 600:
                    raise RuntimeError("the lag series never all showed")
                time.sleep(0.5)
            seeding = cpu_seconds(proc.pid) - cpu - first
            walls = []
            cpu, began = cpu_seconds(proc.pid), time.perf_counter()  # in clock ticks (10 ms): a mean
            for _ in range(SCRAPES):
                wall = time.perf_counter()
                body = scrape(metrics_port)
                walls.append(time.perf_counter() - wall)
            busy, took = cpu_seconds(proc.pid) - cpu, time.perf_counter() - began
            # What the server spends meanwhile without a scrape (RocksDB's flushes and
            # compactions of the set-up's writes, the lag book's rounds), over as long.
            cpu = cpu_seconds(proc.pid)
            time.sleep(took)
            idle = cpu_seconds(proc.pid) - cpu
            return {
                "cpu_ms": (busy - idle) / SCRAPES * 1000,
                "raw_cpu_ms": busy / SCRAPES * 1000,
                "idle_cpu_ms": idle / SCRAPES * 1000,
                "wall_ms": statistics.median(walls) * 1000,
                "first_cpu_ms": first * 1000,
                "seeding_cpu_ms": seeding * 1000,
                "series": body.count(b"\nhqueue_"),
            }
        finally:
            proc.terminate()
            proc.wait(30)


def rows(cases: list[tuple[int, int]], messages: int, before: str | None) -> list[dict]:
    out = []
    for groups, partitions in cases:
        after = measure(groups, partitions, messages)
        old = measure(groups, partitions, messages, before) if before else {}
        name = f"scrape, {groups} groups x {partitions} partitions of {messages} messages"
        for key, what in (("cpu_ms", "server CPU ms"), ("raw_cpu_ms", "server CPU ms, idle not taken off"),
                          ("idle_cpu_ms", "idle server CPU ms over as long"), ("wall_ms", "wall ms"),
                          ("series", "series"),
                          ("first_cpu_ms", "first scrape CPU ms"), ("seeding_cpu_ms", "seeding CPU ms")):  # fmt: skip
            out.append({"measure": f"{name}: {what}", "hqueue": after[key], "before": old.get(key)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="source tree of the server to compare with")
    parser.add_argument("--groups", type=int)
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--messages", type=int, default=1000, help="messages per partition")
    parser.add_argument("--json")
    args = parser.parse_args()
    cases = [(args.groups, args.partitions)] if args.groups else [(300, 4), (1000, 16)]
    table = rows(cases, args.messages, args.before)
    report("one /metrics scrape", table, ["measure", "hqueue", "before"], args.json)


if __name__ == "__main__":
    main()
