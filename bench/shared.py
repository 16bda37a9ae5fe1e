"""A put from a second process on a shared embedded store vs the same put through ``hqueue server``.

Usage:
    python bench/shared.py [--rounds 5] [--batch 1000] [--durability SYNC_WAL] [--json out.json]

Two stores, each in a fresh directory, each held by another process: one
shared (a process that opened ``local://`` serves it on its Unix socket,
hqueue/sharing.py), one behind ``hqueue server`` on loopback TCP. With
``--one-server``, one store: ``hqueue server``'s, through its store's socket
and through its TCP port (the same process and disk: the transport alone). This
process puts the same batches (100-byte messages, one partition) to each,
alternately (each first in every other round), ``--rounds`` times; each row
is the median msgs/s of each, and the median of the rounds' ratios
shared/server (above 1: the shared store is faster).
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

from common import report, timed  # noqa: E402
from remote import hqueue_put, start_hqueue  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin  # noqa: E402
from hqueue.sharing import SOCKET_NAME, StoreClient  # noqa: E402

MESSAGES = {1: 3_000, 100: 100_000, 1000: 200_000}
HOLD = "import sys, time\nfrom hqueue import HQueueAdmin\nwith HQueueAdmin(data_dir=sys.argv[1]):\n time.sleep(3600)"


def start_holder(path: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, path], env=env)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(path, SOCKET_NAME)):
        if time.monotonic() > deadline:
            raise RuntimeError("the holder never served the store")
        time.sleep(0.05)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, action="append", choices=sorted(MESSAGES), help="only these batch sizes")
    parser.add_argument("--durability", action="append", choices=["SYNC_WAL", "ASYNC_WAL"], help="only these")
    parser.add_argument(
        "--one-server",
        action="store_true",
        help="both sides through the one hqueue server: its store's socket against its TCP port (the transport alone)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        server, port = start_hqueue(workdir)
        shared_path = os.path.join(workdir, "hqueue" if args.one_server else "shared")
        holder = None if args.one_server else start_holder(shared_path)
        try:
            urls = {"shared": f"local://{shared_path}", "server": f"hqueue://127.0.0.1:{port}"}
            durabilities = [d for d in (Durability.SYNC_WAL, Durability.ASYNC_WAL) if d in (args.durability or [d])]
            for durability in durabilities:
                for batch, total in MESSAGES.items():
                    if args.batch and batch not in args.batch:
                        continue
                    rates: dict[str, list[float]] = {"shared": [], "server": []}
                    for round_number in range(args.rounds):
                        order = list(urls.items())
                        for kind, url in order if round_number % 2 else order[::-1]:  # neither always first
                            name = f"q_{kind}_{durability.lower()}_{batch}_{round_number}"
                            with HQueueAdmin(url) as admin:
                                admin.create_queue(name, 1, durability=durability)
                            with HQueue(name, url) as queue:
                                assert kind != "shared" or isinstance(queue.engine, StoreClient)
                                seconds = timed(hqueue_put, queue, total, batch)
                            rates[kind].append(total / seconds)
                    shared, served = statistics.median(rates["shared"]), statistics.median(rates["server"])
                    # Each round's two runs side by side: what the disk and the machine's other work
                    # do to both at once cancels out (the medians' ratio keeps it).
                    paired = statistics.median(a / b for a, b in zip(rates["shared"], rates["server"], strict=True))
                    rows.append({"op": f"put, batch {batch} (msgs/s)", "durability": durability,
                                 "shared": shared, "server": served, "shared/server": paired})  # fmt: skip
        finally:
            for proc in (holder, server):
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
    title = "A second process's puts: shared embedded store (Unix socket) vs hqueue server (loopback TCP)"
    report(title, rows, ["op", "durability", "shared", "server", "shared/server"], args.json)


if __name__ == "__main__":
    main()
