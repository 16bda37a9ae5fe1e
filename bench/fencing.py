"""What the partition fence (SPEC C10, hqueue/storage/fence.py) costs on the put path.

Usage:
    python bench/fencing.py [--hbase HOST:PORT] [--rounds 5] [--json out.json] [--quick]

One engine, one queue, 100-byte messages put in batches of 1000, 100 and 1.
Each round times the same puts twice: as shipped (every write carries the
partition's fence) and with the fence switched off (the writers' store step
calls ``Storage.write`` without one, which is what every put did before the
fence). Rounds alternate the two, so both see the same machine noise; the
table gives the median rate of each and their ratio (fenced / unfenced).

Backends: the embedded store (SYNC_WAL and ASYNC_WAL), and the HBase backend
against the Thrift1 TEST STAND-IN of tests/hbase_standin.py (started here
unless --hbase names a server): a Python server, so its absolute rates say
nothing about HBase; on HBase a fenced write costs one more round trip (the
epoch read back), plus one ``checkAndPut`` per partition every RESERVE_MS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402

from hqueue import Durability, Message  # noqa: E402
from hqueue.config import QueueInfo  # noqa: E402
from hqueue.engine import Engine  # noqa: E402
from hqueue.storage import open_storage  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
PAYLOAD = b"x" * 93  # + 7-byte topic = 100 bytes a message


def unfenced(engine: Engine) -> None:
    """Make ``engine`` write without its fence, as puts did before it."""

    def store(info, pid, writer, cells, deletes=(), high=b"", answer=None):
        engine.storage.write(info.name, cells, info.durability, deletes)

    engine.writers.store = store  # type: ignore[method-assign]


def fenced(engine: Engine) -> None:
    engine.writers.__dict__.pop("store", None)


def rate(engine: Engine, queue: str, batch: int, total: int) -> float:
    messages = [Message("crawler", PAYLOAD)] * batch
    started = time.perf_counter()
    for _ in range(total // batch):
        engine.put(queue, messages, 0)
    return total / (time.perf_counter() - started)


def compare(url: str, label: str, durability: str, batch: int, total: int, rounds: int) -> dict:
    engine = Engine(open_storage(url))
    queue = f"bench_{durability.lower()}_{batch}_{int(time.time() * 1000) % 10**8}"
    engine.create_queue(QueueInfo(queue, 1, durability=durability))
    rate(engine, queue, batch, min(total, 10 * batch))  # warm up, and take the partition
    rates: dict[str, list[float]] = {"fenced": [], "unfenced": []}
    for n in range(rounds):
        for mode in ("fenced", "unfenced") if n % 2 == 0 else ("unfenced", "fenced"):
            (fenced if mode == "fenced" else unfenced)(engine)
            rates[mode].append(rate(engine, queue, batch, total))
    fenced(engine)
    engine.close()
    on, off = statistics.median(rates["fenced"]), statistics.median(rates["unfenced"])
    low, high = min(rates["fenced"]) / max(rates["unfenced"]), max(rates["fenced"]) / min(rates["unfenced"])
    return {
        "store": label,
        "durability": durability,
        "batch": batch,
        "fenced msgs/s": on,
        "unfenced msgs/s": off,
        "ratio": on / off,
        "ratio min..max": f"{low:.2f}..{high:.2f}",
    }


def start_standin() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.hbase_standin"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        raise SystemExit(f"the HBase stand-in did not start: {line!r}")
    return proc, f"127.0.0.1:{line.split()[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hbase", help="HOST:PORT of an HBase Thrift1 server (default: start the stand-in)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    rows = []
    data = tempfile.mkdtemp(prefix="hqueue-bench-fencing-")
    standin = None
    try:
        local = f"local://{data}"
        for durability in (Durability.SYNC_WAL, Durability.ASYNC_WAL):
            for batch, total in ((1000, 200_000), (100, 50_000), (1, 3_000)):
                rows.append(compare(local, "embedded", durability, batch, total // scale, args.rounds))
        address = args.hbase
        if address is None:
            standin, address = start_standin()
        hbase = f"hbase://{address}?prefix=benchfence{os.getpid()}_"
        for batch, total in ((1000, 20_000), (100, 5_000), (1, 500)):
            label = "hbase" if args.hbase else "hbase stand-in"
            rows.append(compare(hbase, label, Durability.SYNC_WAL, batch, total // scale, args.rounds))
    finally:
        if standin is not None:
            standin.kill()
            standin.wait()
        shutil.rmtree(data, ignore_errors=True)
    columns = ["store", "durability", "batch", "fenced msgs/s", "unfenced msgs/s", "ratio", "ratio min..max"]
    report("Puts with and without the partition fence (median of alternating rounds)", rows, columns, args.json)


if __name__ == "__main__":
    main()
