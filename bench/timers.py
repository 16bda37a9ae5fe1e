"""Timers at scale (SPEC X1): hqueue against the Redis ZSET design.

Usage (the figures in docs/benchmarks.md, "Timers at scale"):
    python bench/timers.py --pending 1000000 --rate 10000 --seconds 30 --memory 10000000 --json timers.json

Needs Debian's redis-server and the redis package with hiredis (pip install '.[bench]').

Four tables:

* **firing**: a broker with ``--pending`` timers due in a day (the backlog,
  put in batches of 1,000), then a feeder scheduling ``--rate`` timers a second
  for ``--seconds`` s, one batch of rate/10 every 100 ms, each timer due 2 s
  after its batch at an even pace (rate/1000 a millisecond). Lateness = the
  fired message's write time minus its due time, in ms: the message's ID
  (hqueue) or its stream entry's ID (Redis), both stamped by the broker.
  hqueue: ``hqueue server`` on an embedded store, which fires them; a put is
  one ``put(batch, deliver_at=[due per message])`` call. Redis, the seed
  design: a pipeline of ``ZADD``s per batch, and a poller process calling one
  Lua script (``ZRANGEBYSCORE … LIMIT 1000``, ``ZREM``, ``XADD``) again at
  once while it finds due members, else after ``--poll`` ms. ASYNC_WAL runs
  against ``appendfsync everysec``, SYNC_WAL against ``always``.
* **cost**: broker CPU (from /proc: the server's, or Redis's plus its
  poller's) per timer put, from the backlog's load, and per fire: the run's
  CPU less its puts at that cost, over the timers fired.
* **memory**: RSS (from /proc) of one process holding an embedded store as
  timers pile up to ``--memory`` (each due within a day), and of Redis
  holding as many in its ZSET.
* **restart**: that store closed with its timers pending and a few already
  due; the time from starting ``hqueue server`` on it to the first due timer
  fired (what "ready to fire" costs), and from starting redis-server on its
  AOF to its first answer other than LOADING.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import redis_client_module, report, rss_mb  # noqa: E402
from remote import free_port, start_redis, wait_port  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402
from hqueue.ids import wall_clock_ms  # noqa: E402

PARTITIONS = 8
DAY_MS = 86_400_000
LEAD_MS = 2000  # how far ahead of its batch a fed timer is due
BATCH = 1000
_FIRE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, 1000)
for i = 1, #due, 2 do
  redis.call('ZREM', KEYS[1], due[i])
  redis.call('XADD', KEYS[2], '*', 'm', due[i])
end
return #due / 2
"""


def cpu_seconds(*pids: int) -> float:
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def percentiles(lateness: list[int]) -> dict:
    ordered = sorted(lateness) or [0]
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": ordered[-1], "early": sum(x < 0 for x in ordered)}


def payload(due: int, i: int) -> bytes:
    """50 bytes that say when the timer is due (and make each Redis member unique)."""
    return b"%013d-%012d-" % (due, i) + b"x" * 23


def start_server(storage: str) -> subprocess.Popen:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", storage, "--port", str(port),
         "--log-level", "WARNING"],
        env=dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..")),
    )  # fmt: skip
    proc.port = port  # type: ignore[attr-defined]
    wait_port(port, proc=proc)
    return proc


def feed(rate: int, seconds: float, put) -> int:
    """``put(dues)`` for a batch of rate/10 timers every 100 ms, for ``seconds``; return how many."""
    per_batch, start, count = rate // 10, wall_clock_ms(), 0
    for tick in range(int(seconds * 10)):
        pause = (start + tick * 100 - wall_clock_ms()) / 1000
        if pause > 0:
            time.sleep(pause)
        base = start + tick * 100 + LEAD_MS
        put([base + j * 100 // per_batch for j in range(per_batch)], count)
        count += per_batch
    return count


def run_row(system: str, fed: int, lateness: list[int], put_cpu_us: float, cpu: float, memory: float) -> dict:
    fire_cpu = cpu - fed * put_cpu_us / 1e6
    return {
        "system": system,
        "fed": fed,
        "fired": len(lateness),
        **percentiles(lateness),
        "put_cpu_us": put_cpu_us,
        "fire_cpu_us": fire_cpu / max(1, len(lateness)) * 1e6,
        "run_cpu_s": cpu,
        "rss_mb": memory,
    }


# -- hqueue ------------------------------------------------------------------------------


def hqueue_backlog(queue: HQueue, pending: int, due: int) -> None:
    for i in range(0, pending, BATCH):
        n = min(BATCH, pending - i)
        dues = [due + (i + j) * DAY_MS // max(1, pending) for j in range(n)]
        queue.put([Message("backlog", payload(d, i)) for d in dues], (i // BATCH) % PARTITIONS, deliver_at=dues)


def hqueue_run(workdir: str, durability: str, pending: int, rate: int, seconds: float) -> dict:
    proc = start_server(f"{workdir}/hqueue")
    try:
        url = f"hqueue://127.0.0.1:{proc.port}"  # type: ignore[attr-defined]
        with HQueueAdmin(url) as admin:
            admin.create_queue("timers", PARTITIONS, durability=durability)
        with HQueue("timers", url) as queue:
            before = cpu_seconds(proc.pid)
            hqueue_backlog(queue, pending, wall_clock_ms() + DAY_MS)
            put_cpu_us = (cpu_seconds(proc.pid) - before) / max(1, pending) * 1e6
            start_id, before = wall_clock_ms(), cpu_seconds(proc.pid)

            def put(dues: list[int], first: int) -> None:
                for p in range(PARTITIONS):  # one put per partition: each fires on its own
                    part = dues[p::PARTITIONS]
                    queue.put([Message("t", payload(d, first)) for d in part], p, deliver_at=part)

            fed = feed(rate, seconds, put)
            time.sleep(LEAD_MS / 1000 + 1)
            cpu, memory = cpu_seconds(proc.pid) - before, rss_mb(proc.pid)
            lateness = [m.id.timestamp - int(m.value[:13]) for m in queue.scan(start_id, topics=["t"])]
        return run_row(f"hqueue {durability}", fed, lateness, put_cpu_us, cpu, memory)
    finally:
        proc.terminate()
        proc.wait()


# -- Redis -------------------------------------------------------------------------------


def redis_poller(port: int, poll_ms: float) -> None:
    """The seed design's firing loop (run as a subprocess)."""
    import redis

    fire = redis.Redis(port=port).register_script(_FIRE)
    while True:
        if not fire(keys=["timers", "fired"], args=[int(time.time() * 1000)]):
            time.sleep(poll_ms / 1000)


def redis_backlog(client, pending: int, due: int) -> None:
    for i in range(0, pending, BATCH):
        pipe = client.pipeline(transaction=False)
        for j in range(i, min(pending, i + BATCH)):
            d = due + j * DAY_MS // max(1, pending)
            pipe.zadd("timers", {payload(d, j): d})
        pipe.execute()


def redis_run(workdir: str, appendfsync: str, pending: int, rate: int, seconds: float, poll_ms: float) -> dict:
    import redis

    proc, port = start_redis(workdir, appendfsync)
    poller = subprocess.Popen([sys.executable, __file__, "--poller", str(port), "--poll", str(poll_ms)])
    try:
        client = redis.Redis(port=port)
        before = cpu_seconds(proc.pid)
        redis_backlog(client, pending, wall_clock_ms() + DAY_MS)
        put_cpu_us = (cpu_seconds(proc.pid) - before) / max(1, pending) * 1e6
        before = cpu_seconds(proc.pid, poller.pid)

        def put(dues: list[int], first: int) -> None:
            pipe = client.pipeline(transaction=False)
            for j, d in enumerate(dues):
                pipe.zadd("timers", {payload(d, first + j): d})
            pipe.execute()

        fed = feed(rate, seconds, put)
        time.sleep(LEAD_MS / 1000 + 1)
        cpu, memory = cpu_seconds(proc.pid, poller.pid) - before, rss_mb(proc.pid)
        lateness, start = [], "-"
        while entries := client.xrange("fired", min=start, max="+", count=10_000):
            lateness += [int(i.split(b"-")[0]) - int(f[b"m"][:13]) for i, f in entries]
            start = "(" + entries[-1][0].decode()
        return run_row(f"redis zset, poll {poll_ms:g} ms, {appendfsync}", fed, lateness, put_cpu_us, cpu, memory)
    finally:
        poller.kill()
        proc.terminate()
        proc.wait()


# -- memory and restart -------------------------------------------------------------------


def memory_child(path: str, pending: int, step: int) -> None:
    """Pile up timers in an embedded store, printing the RSS at each step; leave a few due."""
    with HQueueAdmin(f"local://{path}") as admin:
        admin.create_queue("timers", PARTITIONS, durability=Durability.ASYNC_WAL)
    with HQueue("timers", f"local://{path}") as queue:
        print(f"0 {rss_mb(os.getpid())} 0", flush=True)
        started, due = time.perf_counter(), wall_clock_ms() + DAY_MS
        for i in range(0, pending, step):
            hqueue_backlog_part(queue, i, min(step, pending - i), pending, due)
            print(f"{i + step} {rss_mb(os.getpid())} {time.perf_counter() - started}", flush=True)
        markers = [wall_clock_ms() + 2000] * PARTITIONS  # due while the store is closed
        for p in range(PARTITIONS):
            queue.put(Message("marker", payload(markers[p], p)), p, deliver_at=markers[p])


def hqueue_backlog_part(queue: HQueue, offset: int, count: int, pending: int, due: int) -> None:
    for i in range(offset, offset + count, 10 * BATCH):
        n = min(10 * BATCH, offset + count - i)
        dues = [due + (i + j) * DAY_MS // pending for j in range(n)]
        partition = (i // (10 * BATCH)) % PARTITIONS
        queue.put([Message("backlog", payload(d, i)) for d in dues], partition, deliver_at=dues)


def memory_and_restart(workdir: str, pending: int, step: int) -> tuple[list[dict], dict]:
    path = f"{workdir}/store"
    child = [sys.executable, __file__, "--memory-child", path, "--pending", str(pending), "--step", str(step)]
    out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
    steps = [
        dict(zip(("pending", "rss_mb", "load_s"), (int(a), float(b), float(c)), strict=True))
        for a, b, c in (line.split() for line in out.splitlines())
    ]
    time.sleep(2.5)  # the markers are due now
    started = time.time()
    proc = start_server(f"local://{path}")
    try:
        listening = time.time() - started
        with HQueue("timers", f"hqueue://127.0.0.1:{proc.port}") as queue:  # type: ignore[attr-defined]
            while not (fired := list(queue.scan(topics=["marker"]))):
                time.sleep(0.01)
        first = min(m.id.timestamp for m in fired) / 1000 - started
        restart = {"system": f"hqueue, {pending:,} pending", "listening_s": listening, "first_fire_s": first,
                   "rss_mb": rss_mb(proc.pid)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    return steps, restart


def redis_memory_and_restart(workdir: str, pending: int, step: int) -> tuple[list[dict], dict]:
    import redis

    proc, port = start_redis(workdir, "everysec")
    steps = []
    try:
        client = redis.Redis(port=port)
        steps.append({"pending": 0, "rss_mb": rss_mb(proc.pid)})
        started, due = time.perf_counter(), wall_clock_ms() + DAY_MS
        for i in range(0, pending, step):
            redis_backlog(client, min(step, pending - i), due + i)
            steps.append({"pending": i + step, "rss_mb": rss_mb(proc.pid), "load_s": time.perf_counter() - started})
        client.bgrewriteaof()  # the AOF Redis would restart from: rewritten, as it is in production
        while client.info("persistence")["aof_rewrite_in_progress"]:
            time.sleep(0.2)
        directory = client.config_get("dir")["dir"]
    finally:
        proc.terminate()
        proc.wait()
    started = time.time()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
         "--appendonly", "yes"], stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port, timeout=600)
        client = redis.Redis(port=port)
        while True:
            try:
                client.zcard("timers")
                break
            except redis.exceptions.BusyLoadingError:
                time.sleep(0.01)
        restart = {"system": f"redis, {pending:,} pending", "listening_s": None, "first_fire_s": time.time() - started,
                   "rss_mb": rss_mb(proc.pid)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    return steps, restart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--pending", type=int, default=1_000_000, help="Timers pending during the firing runs")
    parser.add_argument("--rate", type=int, default=10_000, help="Timers fed (and fired) a second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--poll", type=float, default=10.0, help="Redis poller's sleep when nothing is due, ms")
    parser.add_argument("--systems", default="hqueue,redis", help="Which to run: hqueue, redis or both")
    parser.add_argument("--durability", default="ASYNC_WAL,SYNC_WAL", help="hqueue's runs (and Redis's to match)")
    parser.add_argument("--memory", type=int, default=0, help="Also: memory and restart with up to N pending")
    parser.add_argument("--step", type=int, default=1_000_000, help="RSS printed every STEP timers")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--poller", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poller:
        return redis_poller(args.poller, args.poll)
    if args.memory_child:
        return memory_child(args.memory_child, args.pending, args.step)
    systems, durabilities = args.systems.split(","), args.durability.split(",")
    if "redis" in systems:
        redis_client_module()  # refuses to run without hiredis or redis-server, before hqueue's runs
    fsync = {Durability.ASYNC_WAL: "everysec", Durability.SYNC_WAL: "always"}
    rows = []
    for durability in durabilities if "hqueue" in systems and args.seconds else ():
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(hqueue_run(workdir, durability, args.pending, args.rate, args.seconds))
    for durability in durabilities if "redis" in systems and args.seconds else ():
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(redis_run(workdir, fsync[durability], args.pending, args.rate, args.seconds, args.poll))
    stem = args.json[: -len(".json")] if args.json and args.json.endswith(".json") else args.json
    json_name = lambda part: stem and f"{stem}-{part}.json"  # noqa: E731  (each report a file of its own)
    if rows:
        title = f"timers: {args.pending:,} pending, {args.rate:,}/s fed and fired for {args.seconds:g} s"
        columns = ["system", "fed", "fired", "p50_ms", "p99_ms", "max_ms", "early", "put_cpu_us", "fire_cpu_us",
                   "run_cpu_s", "rss_mb"]  # fmt: skip
        report(title, rows, columns, args.json)
    if args.memory:
        memory, restarts = [], []
        for system, measure in (("hqueue", memory_and_restart), ("redis", redis_memory_and_restart)):
            if system in systems:
                with tempfile.TemporaryDirectory() as workdir:
                    steps, restart = measure(workdir, args.memory, args.step)
                memory += [{"system": system, **s} for s in steps]
                restarts.append(restart)
        report("memory: timers pending (hqueue: one process holding an embedded store)", memory,
               ["system", "pending", "rss_mb", "load_s"], json_name("memory"))  # fmt: skip
        report("restart: from starting the broker to its first due timer fired (Redis: to its first answer)",
               restarts, ["system", "listening_s", "first_fire_s", "rss_mb"], json_name("restart"))  # fmt: skip
    return None


if __name__ == "__main__":
    main()
