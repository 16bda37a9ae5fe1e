"""Clients that pipeline SYNC_WAL puts without end: another client's latency, and the server's memory.

Usage:
    python bench/pipeline_abuse.py [--attackers 1,10] [--seconds 10] [--samples 300] [--io loop,threads]

For each ``--io`` and each number of attackers: ``hqueue server`` (embedded
store) starts; a separate process opens that many connections, each sending
1,000 pipelined one-message SYNC_WAL puts at a time, again and again for
``--seconds``, while a thread per connection reads the answers as fast as
they come; meanwhile a victim sends ``--samples`` ``listQueues`` calls one at
a time. Reported: the victim's latency p50 / p99 / max, and the server's RSS
at the end (/proc). Raw Thrift frames, as a hostile client sends them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import percentile, report, rss_mb  # noqa: E402
from remote import start_hqueue  # noqa: E402

from hqueue import HQueueAdmin  # noqa: E402
from hqueue.rpc.wire import T, call_frame  # noqa: E402

ATTACKER = """
import socket, sys, threading, time
port, connections, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
blob = open(sys.argv[4], "rb").read()

def one():
    sock = socket.create_connection(("127.0.0.1", port))
    def drain():
        try:
            while sock.recv(1 << 20):
                pass
        except OSError:
            pass
    threading.Thread(target=drain, daemon=True).start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(blob)

threads = [threading.Thread(target=one) for _ in range(connections)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def read_frame(sock: socket.socket) -> None:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    exactly(struct.unpack(">I", exactly(4))[0])


def one_case(io: str, attackers: int, seconds: float, samples: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-pipeline-")
    server, port = start_hqueue(workdir, "--io", io)
    attack = None
    try:
        with HQueueAdmin(f"hqueue://127.0.0.1:{port}") as admin:
            admin.create_queue("durable", 4, durability="SYNC_WAL")
        message = T.TMessage(topic=b"t", value=b"x")
        blob = b"".join(
            call_frame("putMessageWithPid", i, queue="durable", partitionID=i % 4, message=message) for i in range(1000)
        )
        with open(f"{workdir}/blob", "wb") as f:
            f.write(blob)
        if attackers:
            attack = subprocess.Popen(
                [sys.executable, "-c", ATTACKER, str(port), str(attackers), str(seconds), f"{workdir}/blob"]
            )
            time.sleep(1.0)
        latencies = []
        with socket.create_connection(("127.0.0.1", port), timeout=30) as victim:
            for i in range(samples):
                started = time.perf_counter()
                victim.sendall(call_frame("listQueues", i))
                read_frame(victim)
                latencies.append((time.perf_counter() - started) * 1000)
        rss = rss_mb(server.pid)
    finally:
        if attack is not None:
            attack.kill()
            attack.wait()
        server.kill()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "io": io,
        "attackers": attackers,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "server_rss_mb": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attackers", default="1,10")
    parser.add_argument("--io", default="loop,threads")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [
        one_case(io, int(n), args.seconds, args.samples)
        for n in [0, *args.attackers.split(",")]
        for io in args.io.split(",")
    ]
    report(
        "a victim's listQueues beside connections pipelining SYNC_WAL puts without end",
        rows, ["io", "attackers", "p50_ms", "p99_ms", "max_ms", "server_rss_mb"], args.json,
    )  # fmt: skip


if __name__ == "__main__":
    main()
