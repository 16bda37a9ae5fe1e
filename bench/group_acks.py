"""SYNC_WAL consumer-group acks from many members of one process: do they share fsyncs?

Usage:
    python bench/group_acks.py [--members 4,16] [--messages 100000] [--rounds 2] [--json out.json]

One embedded store, a 16-partition SYNC_WAL queue holding ``--messages``
100-byte messages, then N member threads in this process looping "receive
up to 100, ack them" until it is drained. Reports msgs/s and the store's
group commits (``storage/commits.py``): how many fsynced writes carried the
acks. An ack holds its group's lock until the store has given its write a
place among its partition's writes, then lets it go while it waits for the
disk (``groups/acks.py``), so acks of several members can share one fsync.
No server and no sockets: the store and the group's locking alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message  # noqa: E402

PARTITIONS = 16
PAYLOAD = b"x" * 93  # topic "t" ... 100 bytes with the topic


def run(members: int, messages: int) -> dict:
    work = tempfile.mkdtemp(prefix="hqueue-bench-acks-")
    url = f"local://{work}/data"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", partitions=PARTITIONS, durability="SYNC_WAL")
        with HQueue("q", url) as queue:
            per_partition = messages // PARTITIONS
            for pid in range(PARTITIONS):
                for start in range(0, per_partition, 1000):
                    queue.put([Message("t", PAYLOAD)] * min(1000, per_partition - start), pid)
            total = per_partition * PARTITIONS
            commit = queue.engine.storage._commit
            groups, writes = commit.groups, commit.writes
            done, lock = [0], threading.Lock()

            def member(n: int) -> None:
                with queue.consumer("g", member=f"m{n}") as consumer:
                    while done[0] < total:
                        got = consumer.receive(100, wait=0.05)
                        if got:
                            consumer.ack(got)
                            with lock:
                                done[0] += len(got)

            threads = [threading.Thread(target=member, args=(n,)) for n in range(members)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.perf_counter() - start
            groups, writes = commit.groups - groups, commit.writes - writes
        return {
            "members": members,
            "msgs_per_s": round(total / seconds),
            "acks": writes,
            "fsyncs": groups,
            "acks_per_fsync": round(writes / max(groups, 1), 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", default="4,16")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [run(int(m), args.messages) for _ in range(args.rounds) for m in args.members.split(",")]
    report(
        "SYNC_WAL group acks of member threads in one process (embedded store)",
        rows,
        ["members", "msgs_per_s", "acks", "fsyncs", "acks_per_fsync"],
        args.json,
    )


if __name__ == "__main__":
    main()
