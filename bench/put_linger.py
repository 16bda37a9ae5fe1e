"""How long a line piped into ``hqueue put`` waits before it is stored (issue 20, item 5).

Usage:
    python bench/put_linger.py [--lines 20] [--json out.json]

An ``hqueue put q t`` process reads a pipe that stays open; one line at a
time is written to it, and a client polls an hqueue server (embedded store,
loopback) until the line is there. Each row: the linger asked, and the ms
from the write to the line being readable (median and worst of ``--lines``),
which is the linger plus a put and the poll's own step (5 ms). The worst
includes the first line, which waits for the put process to start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import start_hqueue  # noqa: E402

from hqueue import HQueue, HQueueAdmin  # noqa: E402


def measure(url: str, linger: str, lines: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
    put = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", url, "put", "q", "t", "--linger", linger],
        stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    assert put.stdin is not None
    waits = []
    with HQueue("q", url) as queue:
        before = sum(1 for _ in queue.scan())
        for i in range(lines):
            started = time.perf_counter()
            put.stdin.write(b"line %d\n" % i)
            put.stdin.flush()
            while sum(1 for _ in queue.scan()) < before + i + 1:
                time.sleep(0.005)
            waits.append((time.perf_counter() - started) * 1000)
    put.stdin.close()
    put.wait(timeout=30)
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server, port = start_hqueue(workdir)
        try:
            url = f"hqueue://127.0.0.1:{port}"
            with HQueueAdmin(url) as admin:
                admin.create_queue("q", 1)
            rows = []
            for linger in ("0", "0.1", "0.5"):
                waits = measure(url, linger, args.lines)
                rows.append({"linger (s)": linger, "lines": args.lines, "median ms": round(statistics.median(waits), 1),
                             "worst ms": round(max(waits), 1)})  # fmt: skip
        finally:
            server.kill()
            server.wait()
    report("hqueue put from an open pipe: write to stored", rows,
           ["linger (s)", "lines", "median ms", "worst ms"], args.json)  # fmt: skip


if __name__ == "__main__":
    main()
