"""Timer messages (SPEC X1): lateness with a million pending, hqueue vs Redis ZSET polling.

Usage:
    python bench/timers.py [--json out.json] [--pending 1000000] [--rate 1000] [--seconds 10]

Needs Debian's redis-server and the redis package (pip install '.[bench]').

Both sides run as a broker process plus this client:

* hqueue: ``hqueue server`` on an embedded store; timers are put with
  ``put(..., deliver_at=…)`` and the server fires them.
* Redis (the seed design): ``ZADD timers <due> <payload>``, and a poller
  process that moves due members to a stream with one Lua call
  (``ZRANGEBYSCORE … LIMIT 100``, ``ZREM``, ``XADD``) and sleeps
  ``--poll`` ms when nothing is due. Redis runs with ``appendonly yes,
  appendfsync everysec``; the hqueue queue is ASYNC_WAL to match, and
  SYNC_WAL is shown too.

``--memory N`` adds a table: the RSS of one process holding an embedded
store, at every million timers pending up to N.

Steps: put ``--pending`` timers due in an hour (the backlog), then schedule
``--rate`` timers a second for ``--seconds`` s, each due 0.5-2 s later, one
put each. Lateness of a timer = the fired message's ID time (hqueue) or the
stream entry's ID time (Redis) minus its due time, in ms: both are stamped
by the broker when it writes the message. "early" counts negative
lateness. Memory: the broker's RSS (from /proc, on both sides) with
10,000 and with ``--pending`` timers pending.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import start_hqueue, start_redis  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402
from hqueue.ids import wall_clock_ms  # noqa: E402

BACKLOG_DELAY_MS = 3_600_000
_FIRE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, 100)
for i = 1, #due, 2 do
  redis.call('ZREM', KEYS[1], due[i])
  redis.call('XADD', KEYS[2], '*', 'm', due[i], 'due', due[i + 1])
end
return #due / 2
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(lateness: list[int]) -> dict:
    ordered = sorted(lateness)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": ordered[-1], "early": sum(x < 0 for x in ordered)}


def row(system: str, scheduled: int, lateness: list[int], put_rate: float, memory: tuple, cpu: float) -> dict:
    """One line of the table; ``memory``: MB with 10,000 and with every timer pending."""
    return {
        "system": system,
        "fired": len(lateness),
        "scheduled": scheduled,
        **percentiles(lateness),
        "backlog_put_per_s": put_rate,
        "mem_10k_mb": memory[0],
        "mem_pending_mb": memory[1],
        "broker_cpu_s": cpu,
    }


def paced(rate: int, seconds: float, put) -> int:
    """Call ``put(i)`` ``rate`` times a second for ``seconds``; return how many."""
    count, start = int(rate * seconds), time.monotonic()
    for i in range(count):
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        put(i)
    return count


def hqueue_run(workdir: str, durability: str, pending: int, rate: int, seconds: float) -> dict:
    proc, port = start_hqueue(workdir)
    try:
        url = f"hqueue://127.0.0.1:{port}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("timers", 8, durability=durability)
        with HQueue("timers", url) as queue:
            backlog_due = wall_clock_ms() + BACKLOG_DELAY_MS
            started, memory_small = time.perf_counter(), None
            for i in range(0, pending, 1000):
                queue.put(
                    [Message("backlog", b"x" * 50)] * 1000, partition_id=(i // 1000) % 8, deliver_at=backlog_due + i
                )
                if memory_small is None and i + 1000 >= 10_000:
                    memory_small = rss_mb(proc.pid)
            put_rate = pending / (time.perf_counter() - started)
            memory_large = rss_mb(proc.pid)
            start_id = wall_clock_ms()
            cpu_before = cpu_seconds(proc.pid)
            dues: dict[bytes, int] = {}

            def put(i: int) -> None:
                due = wall_clock_ms() + random.randint(500, 2000)
                value = b"%d" % i
                dues[value] = due
                queue.put(Message("t", value), partition_id=i % 8, deliver_at=due)

            count = paced(rate, seconds, put)
            time.sleep(2.5)
            fired = [m for m in queue.scan(start_id, topics=["t"])]
            cpu = cpu_seconds(proc.pid) - cpu_before
        lateness = [m.id.timestamp - dues[m.value] for m in fired]
        return row(f"hqueue {durability}", count, lateness, put_rate, (memory_small, memory_large), cpu)
    finally:
        proc.terminate()
        proc.wait()


def memory_steps(workdir: str, pending: int, step: int) -> list[dict]:
    """RSS of a process holding an embedded store, per ``step`` timers pending (run in a subprocess)."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", workdir, "--pending", str(pending), "--step", str(step)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def memory_child(workdir: str, pending: int, step: int) -> None:
    with HQueueAdmin(data_dir=workdir) as admin:
        admin.create_queue("timers", 8)
    with HQueue("timers", data_dir=workdir) as queue:
        due = wall_clock_ms() + BACKLOG_DELAY_MS
        for i in range(0, pending, 1000):
            queue.put([Message("backlog", b"x" * 50)] * 1000, partition_id=(i // 1000) % 8, deliver_at=due + i)
            if (i + 1000) % step == 0:
                print(json.dumps({"pending": i + 1000, "rss_mb": rss_mb(os.getpid())}), flush=True)


def redis_poller(port: int, poll_ms: float) -> None:
    """The seed design's firing loop (run as a subprocess)."""
    import redis

    client = redis.Redis(port=port)
    fire = client.register_script(_FIRE)
    while True:
        if not fire(keys=["timers", "fired"], args=[int(time.time() * 1000)]):
            time.sleep(poll_ms / 1000)


def redis_run(
    workdir: str, pending: int, rate: int, seconds: float, poll_ms: float, appendfsync: str = "everysec"
) -> dict:
    import redis

    proc, port = start_redis(workdir, appendfsync)
    poller = subprocess.Popen([sys.executable, __file__, "--poller", str(port), "--poll", str(poll_ms)])
    try:
        client = redis.Redis(port=port)
        backlog_due = wall_clock_ms() + BACKLOG_DELAY_MS
        started, memory_small = time.perf_counter(), None
        for i in range(0, pending, 1000):
            pipe = client.pipeline(transaction=False)
            for j in range(i, i + 1000):
                pipe.zadd("timers", {b"backlog-%d-" % j + b"x" * 40: backlog_due + i})
            pipe.execute()
            if memory_small is None and i + 1000 >= 10_000:
                memory_small = rss_mb(proc.pid)
        put_rate = pending / (time.perf_counter() - started)
        memory_large = rss_mb(proc.pid)
        cpu_before = cpu_seconds(proc.pid) + cpu_seconds(poller.pid)
        count = paced(
            rate, seconds, lambda i: client.zadd("timers", {b"%d" % i: wall_clock_ms() + random.randint(500, 2000)})
        )
        time.sleep(2.5)
        cpu = cpu_seconds(proc.pid) + cpu_seconds(poller.pid) - cpu_before
        lateness = [
            int(entry_id.split(b"-")[0]) - int(float(fields[b"due"]))
            for entry_id, fields in client.xrange("fired")
            if not fields[b"m"].startswith(b"backlog")
        ]
        return row(
            f"redis zset, poll {poll_ms:g} ms, {appendfsync}",
            count,
            lateness,
            put_rate,
            (memory_small, memory_large),
            cpu,
        )
    finally:
        poller.kill()
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--poll", type=float, default=10.0, help="Redis poller's sleep when nothing is due, ms")
    parser.add_argument("--systems", default="hqueue,redis", help="Which to run: hqueue, redis or both")
    parser.add_argument("--memory", type=int, default=0, help="Also: RSS of an embedded store with up to N pending")
    parser.add_argument("--step", type=int, default=1_000_000, help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--poller", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poller:
        redis_poller(args.poller, args.poll)
        return
    if args.memory_child:
        memory_child(args.memory_child, args.pending, args.step)
        return
    rows = []
    systems = args.systems.split(",")
    for durability in (Durability.ASYNC_WAL, Durability.SYNC_WAL) if "hqueue" in systems else ():
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(hqueue_run(workdir, durability, args.pending, args.rate, args.seconds))
    # everysec is ASYNC_WAL's durability; always (fsync before the reply) is SYNC_WAL's
    runs = [(poll, "everysec") for poll in sorted({args.poll, 1.0}, reverse=True)] + [(args.poll, "always")]
    for poll, appendfsync in runs if "redis" in systems else ():
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(redis_run(workdir, args.pending, args.rate, args.seconds, poll, appendfsync))
    columns = ["system", "scheduled", "fired", "p50_ms", "p99_ms", "max_ms", "early", "backlog_put_per_s",
               "mem_10k_mb", "mem_pending_mb", "broker_cpu_s"]  # fmt: skip
    title = f"timers: {args.pending:,} pending, {args.rate}/s fired for {args.seconds:g}s (lateness = write time - due)"
    if rows:
        report(title, rows, columns, args.json)
    if args.memory:
        with tempfile.TemporaryDirectory() as workdir:
            steps = memory_steps(workdir, args.memory, args.step)
        report(
            "memory: one process holding an embedded store, as timers pile up (RocksDB defaults)",
            steps,
            ["pending", "rss_mb"],
            args.json and args.json.replace(".json", "-memory.json"),
        )


if __name__ == "__main__":
    main()
