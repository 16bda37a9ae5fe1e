"""What a call costs when the CPU went idle before it: the same work, back to back and with pauses.

Usage:
    python bench/cold_calls.py [--calls 5000] [--pauses 0,0.0002,0.001] [--json out.json]

A server answering one client at a time sleeps between calls (the client's
round trip). On a virtual machine an idle vCPU halts, and the next call
finds its caches cold: the same Python then costs several times the CPU it
costs in a loop. This bench measures that effect without a server: the
thread CPU time (``time.thread_time``) of

* ``put``: an unbatched ASYNC_WAL put of one 100-byte message on the
  embedded store, in this process (the engine's whole write path);
* ``json``: ``json.dumps`` of a small dict (plain Python, no hqueue);
* ``nothing``: an empty call, the floor of the measurement itself,

each run ``--calls`` times with each pause between calls, asleep
(``time.sleep``) and then polling (awake, yielding the CPU, as the server's
loop and the blocking client poll before they sleep: docs/server.md).
The ratio of the paused figure to the back-to-back one is what a
ping-pong client costs a Python server beyond its code on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402


def poll_for(seconds: float) -> None:
    """Busy-wait ``seconds`` as a polling thread does (rpc/spin.py): awake, yielding the CPU."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        os.sched_yield()


def cpu_per_call(call, calls: int, pause: float, wait=time.sleep) -> float:
    """Microseconds of this thread's CPU per ``call()``, ``pause`` seconds of ``wait`` before each."""
    for _ in range(200):  # warm
        call()
    total = 0.0
    for _ in range(calls):
        if pause:
            wait(pause)
        started = time.thread_time()
        call()
        total += time.thread_time() - started
    return total / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--pauses", default="0,0.0002,0.001", help="seconds asleep before each call")
    parser.add_argument("--json")
    args = parser.parse_args()
    pauses = [float(p) for p in args.pauses.split(",")]
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-cold-")
    rows = []
    try:
        url = f"local://{workdir}/store"
        with HQueueAdmin(url) as admin:
            admin.create_queue("cold", 1, durability=Durability.ASYNC_WAL)
        with HQueue("cold", url) as queue:
            message = Message("crawler", b"x" * 93)
            small = {"topic": "crawler", "partition": 3, "value": "x" * 93}
            cases = {
                "put": lambda: queue.put(message, partition_id=0),
                "json": lambda: json.dumps(small),
                "nothing": lambda: None,  # the measurement's own floor (two thread_time calls)
            }
            for name, call in cases.items():
                base = None
                for pause in pauses:
                    for how, wait in (("asleep", time.sleep), ("polling", poll_for)) if pause else (("-", None),):
                        us = cpu_per_call(call, args.calls, pause, wait)
                        base = us if base is None else base
                        rows.append({"case": name, "pause_ms": pause * 1000, "pause": how, "cpu_us_per_call":
                                     round(us, 2), "vs_back_to_back": round(us / base, 2)})  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    columns = ["case", "pause_ms", "pause", "cpu_us_per_call", "vs_back_to_back"]
    report(f"thread CPU per call, back to back and after a pause ({args.calls} calls each)", rows, columns, args.json)


if __name__ == "__main__":
    main()
