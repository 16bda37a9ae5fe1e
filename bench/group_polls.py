"""How the server's poll went for one asyncio group member, and what its calls cost the server.

Usage:
    python bench/group_polls.py [--messages 200000] [--runs 3] [--prefetch] [--durability ASYNC_WAL]
                                [--json out.json]

A diagnostic, not a comparison: it runs the tree it is in. One process
serves an embedded store (``HQueueServer``, as ``hqueue server`` does) and
fills a 16-partition queue with ``--messages`` 100-byte messages as
``bench/groups.py`` does; a second process runs ``bench/aio_groups.py``'s
client with one task (``AsyncHQueue(...).consumer``, with ``prefetch=True``
if asked), which receives 100 and acks them until the queue is drained. Per run it reports
the member's rate, how many of the server's polls (rpc/spin.py) caught
their call, stretched or not, and how many ran out or were preempted, the
blocking waits the loop slept through, and the server's thread CPU of one
receive (or receive + ack) call, at the median.

The server's poll decides the rate here: a call caught by a poll runs on
warm caches, and a call the loop slept for costs it several times the CPU
(``bench/cold_calls.py``), which slows the member's next wait in turn. The
server's ``Spin`` is wrapped to count, so its figures carry a little of that
counting's cost.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from aio_groups import run_client  # noqa: E402
from common import percentile, report  # noqa: E402
from groups import fill_work  # noqa: E402

from hqueue.rpc import loop, spin  # noqa: E402
from hqueue.rpc.frames import call_head  # noqa: E402
from hqueue.server import HQueueServer  # noqa: E402


class Counted:
    """The server loop's Spin and calls, counted (one server in this process)."""

    def __init__(self, base_us: int) -> None:
        self.base = base_us / 1e6
        self.polls: collections.Counter[str] = collections.Counter()
        self.blocked = 0
        self.calls: dict[str, list[float]] = collections.defaultdict(list)
        poll, blocked, call = spin.Spin.poll, spin.Spin.blocked, loop.LoopServer._call
        counted = self

        def counted_poll(self, ready):  # type: ignore[no-untyped-def]
            if self.base != counted.base or not self.on:
                return poll(self, ready)
            stretched, started = self.limit > self.base, time.perf_counter()
            got = poll(self, ready)
            ended = "caught" if got else "ran out" if time.perf_counter() - started >= self.limit else "preempted"
            counted.polls[f"{ended}{' stretched' if stretched else ''}"] += 1
            return got

        def counted_blocked(self, seconds):  # type: ignore[no-untyped-def]
            counted.blocked += self.base == counted.base
            return blocked(self, seconds)

        def counted_call(self, link, frame):  # type: ignore[no-untyped-def]
            started = time.thread_time()
            call(self, link, frame)
            counted.calls[call_head(frame)[0]].append(time.thread_time() - started)

        spin.Spin.poll, spin.Spin.blocked, loop.LoopServer._call = counted_poll, counted_blocked, counted_call

    def clear(self) -> None:
        self.polls.clear()
        self.calls.clear()
        self.blocked = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prefetch", action="store_true")
    parser.add_argument("--durability", default="ASYNC_WAL")
    parser.add_argument("--json")
    args = parser.parse_args()
    counted = Counted(spin.env_poll_us("HQUEUE_IDLE_POLL_US", spin.DEFAULT_SERVER_POLL_US))
    receive = "groupAckReceive" if args.prefetch else "groupReceive"
    rows = []
    for run in range(1, args.runs + 1):
        workdir = tempfile.mkdtemp(prefix="hqueue-bench-polls-")
        server = HQueueServer(f"local://{workdir}/data", "127.0.0.1", 0, local_socket=False).start()
        try:
            fill_work(f"hqueue://{server.address}", args.messages, args.durability)
            counted.clear()
            member = run_client("hqueue", server.port, 1, 100, args.prefetch)  # (aio_groups.py's, in a process)
            calls = counted.calls.get(receive) or [0.0]
            rows.append({
                "run": run, "messages": member["count"], "msgs/s": member["count"] / member["seconds"],
                "caught": counted.polls["caught"], "caught stretched": counted.polls["caught stretched"],
                "in vain": sum(n for how, n in counted.polls.items() if not how.startswith("caught")),
                "slept": counted.blocked, f"{receive} server CPU p50 (µs)": percentile(calls, 0.5) * 1e6,
            })  # fmt: skip
        finally:
            server.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    columns = list(rows[0])
    title = f"one asyncio member{' (prefetch)' if args.prefetch else ''}, {args.durability}: the server's polls"
    report(title, rows, columns, args.json)


if __name__ == "__main__":
    main()
