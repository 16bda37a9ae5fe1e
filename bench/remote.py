"""hqueue through its server vs Redis Streams, side by side in one run.

Usage:
    python bench/remote.py [--json out.json] [--quick]

Needs Debian's redis-server and the redis package (pip install '.[bench]').

Both servers run as local subprocesses on loopback: hqueue (``hqueue server``,
embedded store) and Redis (``appendonly yes``, ``appendfsync everysec``).
For each batch size (1, 100, 1000; 100-byte messages), it times hqueue puts
(SYNC_WAL: fsync per batch; ASYNC_WAL: like Redis's everysec) and redis-py
pipelined XADDs; then reading everything back, hqueue through
messageScannerGetPacked (caching 1000; puts go as putPacked) and Redis through XRANGE COUNT 1000;
then the round trip of one single put (p50/p99) on both.
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

from common import report, timed  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # + the 7-byte topic = 100 bytes
MESSAGES = {1: 5_000, 100: 100_000, 1000: 200_000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_hqueue(workdir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"{workdir}/hqueue", "--port", str(port),
         "--log-level", "WARNING"],
        env=dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..")),
    )  # fmt: skip
    wait_port(port)
    return proc, port


def start_redis(workdir: str, appendfsync: str = "everysec") -> tuple[subprocess.Popen, int]:
    """redis-server with its AOF: ``appendfsync always`` is SYNC_WAL's durability, everysec ASYNC_WAL's.

    Each gets a directory of its own under ``workdir`` (two may run side by side).
    """
    if not shutil.which("redis-server"):
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    directory = os.path.join(workdir, f"redis-{port}")
    os.makedirs(directory)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
         "--appendonly", "yes", "--appendfsync", appendfsync],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    args = parser.parse_args()
    try:
        import redis
    except ImportError:
        sys.exit("the redis package is not installed: pip install '.[bench]'")
    scale = 10 if args.quick else 1
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-remote-")
    hq_proc, hq_port = start_hqueue(workdir)
    rd_proc, rd_port = start_redis(workdir)
    rows = []
    try:
        url = f"hqueue://127.0.0.1:{hq_port}"
        r = redis.Redis(port=rd_port)
        with HQueueAdmin(url) as admin:
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                for batch in (1, 100, 1000):
                    total = max(MESSAGES[batch] // scale, batch)
                    name = f"put_{durability}_{batch}".lower()
                    admin.create_queue(name, 1, durability=durability)
                    with HQueue(name, url) as queue:
                        hq = total / timed(hqueue_put, queue, total, batch)
                    rd = total / timed(redis_put, r, name, total, batch)
                    rows.append({"op": f"put batch {batch}", "hqueue": durability, "messages": total,
                                 "hqueue_msgs_s": hq, "redis_msgs_s": rd, "ratio": hq / rd})  # fmt: skip
            # reads: the 1000-batch ASYNC_WAL queue and stream hold the same messages
            name = "put_async_wal_1000"
            with HQueue(name, url) as queue:
                hqueue_read(queue)  # warm
                seconds = min(timed(hqueue_read, queue) for _ in range(3))
                count = hqueue_read(queue)
            redis_read(r, name)
            redis_seconds = min(timed(redis_read, r, name) for _ in range(3))
            rows.append({"op": "read all", "hqueue": "GetPacked 1000", "messages": count,
                         "hqueue_msgs_s": count / seconds, "redis_msgs_s": count / redis_seconds,
                         "ratio": redis_seconds / seconds})  # fmt: skip
            for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
                name = f"latency_{durability}".lower()
                admin.create_queue(name, 1, durability=durability)
                with HQueue(name, url) as queue:
                    message = Message("crawler", PAYLOAD)
                    p50, p99 = latencies(lambda q=queue, m=message: q.put(m, partition_id=0), 2000 // scale)
                rp50, rp99 = latencies(lambda: r.xadd("latency", {"crawler": PAYLOAD}), 2000 // scale)
                rows.append({"op": "single put p50 ms", "hqueue": durability, "messages": 2000 // scale,
                             "hqueue_msgs_s": p50, "redis_msgs_s": rp50, "ratio": rp50 / p50})  # fmt: skip
                rows.append({"op": "single put p99 ms", "hqueue": durability, "messages": 2000 // scale,
                             "hqueue_msgs_s": p99, "redis_msgs_s": rp99, "ratio": rp99 / p99})  # fmt: skip
    finally:
        hq_proc.terminate()
        rd_proc.terminate()
        hq_proc.wait()
        rd_proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    report(
        "hqueue server vs Redis Streams, 100-byte messages (ratio > 1: hqueue better; latency rows in ms)",
        rows,
        ["op", "hqueue", "messages", "hqueue_msgs_s", "redis_msgs_s", "ratio"],
        args.json,
    )


if __name__ == "__main__":
    main()
