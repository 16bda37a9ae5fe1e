"""hqueue through its server vs Redis Streams, side by side in one run.

Usage:
    python bench/remote.py [--json out.json] [--quick]

Needs Debian's redis-server and the redis package with hiredis (pip install '.[bench]').

The servers run as local subprocesses on loopback, side by side in each run:
hqueue (``hqueue server``, embedded store) and two Redis with their AOF,
``appendfsync always`` (SYNC_WAL's durability: on disk before the reply) and
``everysec`` (ASYNC_WAL's). For each batch size (1, 100, 1000; 100-byte
messages), it times hqueue puts and redis-py pipelined XADDs at equal
durability; then reading everything back, hqueue through
messageScannerGetPacked (caching 1000; puts go as putPacked) and Redis
through XRANGE COUNT 1000; then the round trip of one single put (p50/p99)
on both; then both servers' RSS (from /proc).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import load, redis_client_module, report, rss_mb, spread, timed  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # + the 7-byte topic = 100 bytes
MESSAGES = {1: 5_000, 100: 100_000, 1000: 200_000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30, proc: subprocess.Popen | None = None) -> None:
    """Until something listens on ``port``; ``proc``, the server meant to, exiting first is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{' '.join(map(str, proc.args))} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_hqueue(workdir: str, *args: str, tree: str | None = None) -> tuple[subprocess.Popen, int]:
    """``hqueue server`` on an embedded store under ``workdir``, with ``args`` and
    ``HQUEUE_BENCH_SERVER_ARGS`` (``--io threads`` measures the thread-per-connection
    server), from the source ``tree`` (default: this checkout)."""
    port, tree = free_port(), tree or os.path.join(os.path.dirname(__file__), "..")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{workdir}/hqueue", "--port", str(port),
         "--log-level", "WARNING", *args, *os.environ.get("HQUEUE_BENCH_SERVER_ARGS", "").split()],
        env=dict(os.environ, PYTHONPATH=tree), cwd=tree, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port, proc=proc)
    return proc, port


def start_redis(
    workdir: str, appendfsync: str = "everysec", directory: str | None = None
) -> tuple[subprocess.Popen, int]:
    """redis-server with its AOF: ``appendfsync always`` is SYNC_WAL's durability, everysec ASYNC_WAL's.

    Each gets a directory of its own under ``workdir`` (two may run side by side), or
    ``directory`` (a restart: the AOF there is loaded).
    """
    if not shutil.which("redis-server"):
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    directory = directory or os.path.join(workdir, f"redis-{port}")
    os.makedirs(directory, exist_ok=True)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
         "--appendonly", "yes", "--appendfsync", appendfsync],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port, proc=proc)
    return proc, port


def hqueue_put(queue: HQueue, total: int, batch: int) -> None:
    chunk = [Message("crawler", PAYLOAD)] * batch
    for _ in range(total // batch):
        queue.put(chunk, partition_id=0)


def redis_put(client, stream: str, total: int, batch: int) -> None:
    fields = {"crawler": PAYLOAD}
    for _ in range(total // batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            pipe.xadd(stream, fields)
        pipe.execute()


def hqueue_read(queue: HQueue) -> int:
    with queue.get_partition_scanner(0, caching=1000) as scanner:
        return sum(1 for _ in scanner)


def redis_read(client, stream: str) -> int:
    count, start = 0, "-"
    while True:
        entries = client.xrange(stream, min=start, max="+", count=1000)
        count += len(entries)
        if len(entries) < 1000:
            return count
        start = "(" + entries[-1][0].decode()


def latencies(call, n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def one_run(redis, scale: int) -> list[dict]:
    """Every row once, hqueue and both Redis servers side by side."""
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-remote-")
    servers, rows = [], []
    try:
        hq_proc, hq_port = start_hqueue(workdir)
        servers.append(hq_proc)
        # everysec is ASYNC_WAL's durability; always (fsync before the reply) is SYNC_WAL's
        redises = {}
        for durability, fsync in ((Durability.SYNC_WAL, "always"), (Durability.ASYNC_WAL, "everysec")):
            proc, port = start_redis(workdir, fsync)
            servers.append(proc)
            redises[durability] = (fsync, redis.Redis(port=port), proc)
        url = f"hqueue://127.0.0.1:{hq_port}"
        with HQueueAdmin(url) as admin:
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                fsync, r, _ = redises[durability]
                for batch in (1, 100, 1000):
                    total = max(MESSAGES[batch] // scale, batch)
                    name = f"put_{durability}_{batch}".lower()
                    admin.create_queue(name, 1, durability=durability)
                    with HQueue(name, url) as queue:
                        hq = total / timed(hqueue_put, queue, total, batch)
                    rd = total / timed(redis_put, r, name, total, batch)
                    rows.append({"op": f"put batch {batch} (msgs/s)", "durability": f"{durability} vs {fsync}",
                                 "messages": total, "hqueue": hq, "redis": rd, "ratio": hq / rd})  # fmt: skip
            # reads: the 1000-batch ASYNC_WAL queue and stream hold the same messages
            name, r = "put_async_wal_1000", redises[Durability.ASYNC_WAL][1]
            with HQueue(name, url) as queue:
                hqueue_read(queue)  # warm
                seconds = min(timed(hqueue_read, queue) for _ in range(3))
                count = hqueue_read(queue)
            redis_read(r, name)
            redis_seconds = min(timed(redis_read, r, name) for _ in range(3))
            rows.append({"op": "read all, GetPacked 1000 vs XRANGE 1000 (msgs/s)", "durability": "-",
                         "messages": count, "hqueue": count / seconds, "redis": count / redis_seconds,
                         "ratio": redis_seconds / seconds})  # fmt: skip
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                fsync, r, _ = redises[durability]
                name = f"latency_{durability}".lower()
                admin.create_queue(name, 1, durability=durability)
                with HQueue(name, url) as queue:
                    message = Message("crawler", PAYLOAD)
                    p50, p99 = latencies(lambda q=queue, m=message: q.put(m, partition_id=0), 2000 // scale)
                rp50, rp99 = latencies(lambda r=r: r.xadd("latency", {"crawler": PAYLOAD}), 2000 // scale)
                for label, ours, theirs in (("p50", p50, rp50), ("p99", p99, rp99)):
                    rows.append({"op": f"single put {label} (ms)", "durability": f"{durability} vs {fsync}",
                                 "messages": 2000 // scale, "hqueue": ours, "redis": theirs,
                                 "ratio": theirs / ours})  # fmt: skip
        rows.append({"op": "server RSS after the run (MB, /proc)", "durability": "vs Redis everysec",
                     "messages": None, "hqueue": rss_mb(hq_proc.pid),
                     "redis": rss_mb(redises[Durability.ASYNC_WAL][2].pid),
                     "ratio": rss_mb(redises[Durability.ASYNC_WAL][2].pid) / rss_mb(hq_proc.pid)})  # fmt: skip
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--runs", type=int, default=3, help="side-by-side runs; ratios are min / median / max")
    args = parser.parse_args()
    redis = redis_client_module()
    loads, runs = [load()], []
    for _ in range(args.runs):
        runs.append(one_run(redis, 10 if args.quick else 1))
        loads.append(load())
    rows = []
    for i in range(len(runs[0])):
        ratios = [run[i]["ratio"] for run in runs]
        median = sorted(runs, key=lambda run, i=i: run[i]["ratio"])[len(runs) // 2][i]
        rows.append({**median, "ratios": spread(ratios)})
    report(
        "hqueue server vs Redis Streams (redis-py with hiredis), 100-byte messages; ratio > 1: hqueue better; "
        f"the median run's figures, ratios min / median / max of {args.runs}; load {' -> '.join(loads)}",
        rows,
        ["op", "durability", "messages", "hqueue", "redis", "ratio", "ratios"],
        args.json,
    )


if __name__ == "__main__":
    main()
