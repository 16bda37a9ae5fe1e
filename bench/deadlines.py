"""How long a client call takes when its servers stop answering (SIGSTOP).

Usage:
    python bench/deadlines.py [--timeout 2] [--runs 3] [--json out.json]

A real ``hqueue server`` subprocess is stopped with SIGSTOP (its socket
still accepts connections and takes requests; nothing answers), and a
listening socket that never accepts stands for a second silent server.
Each row is one call with ``hqueue://…?timeout=T`` (the default
``owner_timeout`` of 30 s): the worst elapsed time over the runs, that
time over the timeout, and the error it raised. The rule is that a call
ends by its timeout (+10 %) across every retry and every server tried.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402

from hqueue import HQueue, HQueueAdmin, HQueueError, Message  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))


def start_server(data: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{data}", "--port", str(port)]
    proc = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc=proc)
    return proc, f"127.0.0.1:{port}"


def measure(call) -> tuple[float, str]:
    started = time.monotonic()
    try:
        call()
        error = "none (answered)"
    except HQueueError as e:
        error = type(e).__name__
    return time.monotonic() - started, error


def calls(address: str, hole: str, timeout: float):
    url = f"hqueue://{address}?timeout={timeout}"
    both = f"hqueue://{address},{hole}?timeout={timeout}"
    warm = HQueue("q", url)
    warm.put(Message("t", b"warm"), partition_id=0)  # knows the queue and its owners
    list(warm.scan())

    def cold_put() -> None:
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"x"), partition_id=0)

    def admin(fn):
        def call() -> None:
            with HQueueAdmin(both) as a:
                fn(a)

        return call

    return warm, [
        ("put, sent (client knows the owner)", lambda: warm.put(Message("t", b"x"), partition_id=0)),
        ("put, new client (definition, owners, put)", cold_put),
        ("scan", lambda: list(warm.scan())),
        ("list_queues over 2 silent servers", admin(lambda a: a.list_queues())),
        ("describe_queue over 2 silent servers", admin(lambda a: a.describe_queue("q"))),
        ("create_queue over 2 silent servers", admin(lambda a: a.create_queue("other", 1))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    data = tempfile.mkdtemp(prefix="hqueue-deadlines-")
    proc, address = start_server(data)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    try:
        with HQueueAdmin(f"hqueue://{address}") as admin:
            admin.create_queue("q", 2)
        rows: dict[str, dict] = {}
        for _ in range(args.runs):
            warm, named = calls(address, f"127.0.0.1:{hole.getsockname()[1]}", args.timeout)
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                for name, call in named:
                    elapsed, error = measure(call)
                    row = rows.setdefault(name, {"call": name, "worst s": 0.0, "error": error})
                    row["worst s"] = max(row["worst s"], elapsed)
                    row["x timeout"] = row["worst s"] / args.timeout
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            warm.close()
        report(
            f"client deadlines: calls to a SIGSTOPped server, timeout={args.timeout:g}s, worst of {args.runs}",
            list(rows.values()),
            ["call", "worst s", "x timeout", "error"],
            args.json,
        )
    finally:
        proc.terminate()
        proc.wait()
        hole.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
