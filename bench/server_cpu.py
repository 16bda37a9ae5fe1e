"""What one call costs the server: hqueue's server CPU per message, and Redis's, in one run.

Usage:
    python bench/server_cpu.py [--tree NAME=DIR ...] [--no-poll NAME ...] [--repeat 3] [--scale 1.0] [--json out.json]

Needs Debian's redis-server and the redis package with hiredis (pip install '.[bench]').

Servers run as local subprocesses on loopback: ``hqueue server`` (embedded
store) from each ``--tree`` (default: this checkout; name another source
tree to compare two versions in one run, e.g. ``--tree main=/tmp/main``;
``--tree poll=. --tree nopoll=. --no-poll nopoll`` compares polling before
sleeping, docs/server.md, on and off on both sides with the same code),
and Redis 7 twice (``appendfsync everysec``, like ASYNC_WAL; ``appendfsync
always``, like SYNC_WAL). One client in this process drives each in turn,
``--repeat`` times, systems interleaved so a busy machine weighs on all alike.
The server's CPU is its process's user + system time (``/proc/PID/stat``)
over the case, divided by the messages.

Cases (100-byte messages):

* ``put 1 async``: unbatched puts, one at a time, ASYNC_WAL vs XADD (everysec).
* ``put 1 sync``: the same at equal durability, SYNC_WAL vs XADD (always); with p50 and p99.
* ``put 1000 sync``: batched puts of 1000 vs 1000 pipelined XADDs (always).
* ``group``: one member, receive 100 + ack, ASYNC_WAL vs XREADGROUP + XACK (everysec).
* ``groupsync``: the same at equal durability, SYNC_WAL vs (always).
* ``read``: the whole queue through GetPacked 1000 vs XRANGE COUNT 1000.
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

from common import percentile, redis_client_module, report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message  # noqa: E402

PAYLOAD = b"x" * 93  # + the 7-byte topic = 100 bytes
HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system seconds of process ``pid`` (every thread, living or gone)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Server:
    def __init__(self, name: str, proc: subprocess.Popen, port: int) -> None:
        self.name, self.proc, self.port = name, proc, port

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def start_hqueue(name: str, tree: str, workdir: str, extra: tuple[str, ...] = ()) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{workdir}/{name}", "--port", str(port),
         "--log-level", "WARNING", *extra],
        env=dict(os.environ, PYTHONPATH=tree), cwd=tree,
    )  # fmt: skip
    wait_port(port, proc=proc)
    return Server(name, proc, port)


def start_redis(name: str, fsync: str, workdir: str) -> Server:
    if not shutil.which("redis-server"):
        sys.exit("redis-server is not installed: apt-get install redis-server")
    port = free_port()
    data = f"{workdir}/{name.replace(' ', '-')}"
    os.makedirs(data)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data, "--save", "",
         "--appendonly", "yes", "--appendfsync", fsync],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port, proc=proc)
    return Server(name, proc, port)


def measured(server: Server, work) -> tuple[float, float, object]:
    """(seconds, server CPU seconds, what ``work()`` returned)."""
    cpu, started = cpu_seconds(server.proc.pid), time.perf_counter()
    out = work()
    return time.perf_counter() - started, cpu_seconds(server.proc.pid) - cpu, out


class HQueueCases:
    def __init__(self, server: Server, options: str = "") -> None:
        self.server, self.url = server, f"hqueue://127.0.0.1:{server.port}{options}"
        self.round = 0

    def _queue(self, prefix: str, durability: Durability, partitions: int = 1) -> str:
        self.round += 1
        name = f"{prefix}_{self.round}_{os.getpid()}"
        with HQueueAdmin(self.url) as admin:
            admin.create_queue(name, partitions, durability=durability)
        return name

    def put1(self, n: int, durability: Durability) -> tuple[float, float, list[float]]:
        name, message = self._queue("put1", durability), Message("crawler", PAYLOAD)
        with HQueue(name, self.url) as queue:
            queue.put(message, partition_id=0)  # connect

            def work() -> list[float]:
                samples = []
                for _ in range(n):
                    started = time.perf_counter()
                    queue.put(message, partition_id=0)
                    samples.append(time.perf_counter() - started)
                return samples

            seconds, cpu, samples = measured(self.server, work)
        return seconds, cpu, samples  # type: ignore[return-value]

    def put_batch(self, n: int, batch: int) -> tuple[float, float]:
        name, chunk = self._queue("putn", Durability.SYNC_WAL), [Message("crawler", PAYLOAD)] * batch
        with HQueue(name, self.url) as queue:
            queue.put(chunk, partition_id=0)
            seconds, cpu, _ = measured(
                self.server, lambda: [queue.put(chunk, partition_id=0) for _ in range(n // batch)]
            )
        return seconds, cpu

    def fill(self, n: int, durability: str = Durability.ASYNC_WAL) -> str:
        name, chunk = self._queue("fill", durability), [Message("crawler", PAYLOAD)] * 1000
        with HQueue(name, self.url) as queue:
            for _ in range(n // 1000):
                queue.put(chunk, partition_id=0)
        return name

    def group(self, name: str, batch: int) -> tuple[float, float, int]:
        with HQueue(name, self.url) as queue, queue.consumer("g") as consumer:
            queue.engine.queue_info(name)

            def work() -> int:
                count = 0
                while True:
                    deliveries = consumer.receive(batch, wait=0)
                    if not deliveries:
                        return count
                    consumer.ack(deliveries)
                    count += len(deliveries)

            seconds, cpu, count = measured(self.server, work)
        return seconds, cpu, count  # type: ignore[return-value]

    def read(self, name: str) -> tuple[float, float, int]:
        with HQueue(name, self.url) as queue:

            def work() -> int:
                with queue.get_partition_scanner(0, caching=1000) as scanner:
                    return sum(1 for _ in scanner)

            work()  # warm
            seconds, cpu, count = measured(self.server, work)
        return seconds, cpu, count  # type: ignore[return-value]


class RedisCases:
    def __init__(self, server: Server) -> None:
        import redis

        self.server, self.client = server, redis.Redis(port=server.port)
        self.round = 0

    def _stream(self, prefix: str) -> str:
        self.round += 1
        return f"{prefix}_{self.round}"

    def put1(self, n: int) -> tuple[float, float, list[float]]:
        stream, client, fields = self._stream("put1"), self.client, {"crawler": PAYLOAD}
        client.xadd(stream, fields)

        def work() -> list[float]:
            samples = []
            for _ in range(n):
                started = time.perf_counter()
                client.xadd(stream, fields)
                samples.append(time.perf_counter() - started)
            return samples

        return measured(self.server, work)  # type: ignore[return-value]

    def put_batch(self, n: int, batch: int) -> tuple[float, float]:
        stream, fields = self._stream("putn"), {"crawler": PAYLOAD}

        def work() -> None:
            for _ in range(n // batch):
                pipe = self.client.pipeline(transaction=False)
                for _ in range(batch):
                    pipe.xadd(stream, fields)
                pipe.execute()

        seconds, cpu, _ = measured(self.server, work)
        return seconds, cpu

    def fill(self, n: int) -> str:
        stream = self._stream("fill")
        for _ in range(n // 1000):
            pipe = self.client.pipeline(transaction=False)
            for _ in range(1000):
                pipe.xadd(stream, {"crawler": PAYLOAD})
            pipe.execute()
        return stream

    def group(self, stream: str, batch: int) -> tuple[float, float, int]:
        client = self.client
        client.xgroup_create(stream, "g", id="0")

        def work() -> int:
            count = 0
            while True:
                reply = client.xreadgroup("g", "c", {stream: ">"}, count=batch)
                if not reply or not reply[0][1]:
                    return count
                ids = [entry_id for entry_id, _ in reply[0][1]]
                client.xack(stream, "g", *ids)
                count += len(ids)

        return measured(self.server, work)  # type: ignore[return-value]

    def read(self, stream: str) -> tuple[float, float, int]:
        def work() -> int:
            count, start = 0, "-"
            while True:
                entries = self.client.xrange(stream, min=start, max="+", count=1000)
                count += len(entries)
                if len(entries) < 1000:
                    return count
                start = "(" + entries[-1][0].decode()

        work()
        return measured(self.server, work)  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR: an hqueue source tree to serve from")
    parser.add_argument(
        "--no-poll", action="append", default=[], metavar="NAME",
        help="serve tree NAME with --idle-poll-us 0 and call it with poll_us=0 (polling off on both sides)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every message count")
    parser.add_argument("--cases", default="put1async,put1sync,put1000,group,groupsync,read")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    redis_client_module()  # refuses to run without hiredis or redis-server
    trees = [t.split("=", 1) for t in args.tree] or [["hqueue", HERE]]
    cases = set(args.cases.split(","))
    n = {k: max(1000, int(v * args.scale)) for k, v in
         {"put1": 10_000, "put1sync": 2_000, "put1000": 100_000, "group": 50_000, "read": 200_000}.items()}  # fmt: skip
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-cpu-")
    servers: list[Server] = []
    samples: dict[tuple[str, str], list[dict]] = {}

    def add(case: str, system: str, count: int, seconds: float, cpu: float, **extra: float) -> None:
        row = {"msgs_s": count / seconds, "cpu_us": cpu / count * 1e6, **extra}
        samples.setdefault((case, system), []).append(row)

    try:
        hq = [
            HQueueCases(start_hqueue(name, tree, workdir, ("--idle-poll-us", "0")), "?poll_us=0")
            if name in args.no_poll
            else HQueueCases(start_hqueue(name, tree, workdir))
            for name, tree in trees
        ]
        servers += [c.server for c in hq]
        everysec = RedisCases(start_redis("redis everysec", "everysec", workdir))
        always = RedisCases(start_redis("redis always", "always", workdir))
        servers += [everysec.server, always.server]
        for _ in range(args.repeat):
            if "put1async" in cases:
                for c in hq:
                    s, cpu, lat = c.put1(n["put1"], Durability.ASYNC_WAL)
                    add("put 1 async", c.server.name, n["put1"], s, cpu, p50_ms=percentile(lat, 0.5) * 1e3)
                s, cpu, lat = everysec.put1(n["put1"])
                add("put 1 async", "redis everysec", n["put1"], s, cpu, p50_ms=percentile(lat, 0.5) * 1e3)
            if "put1sync" in cases:
                for c in hq:
                    s, cpu, lat = c.put1(n["put1sync"], Durability.SYNC_WAL)
                    add("put 1 sync", c.server.name, n["put1sync"], s, cpu,
                        p50_ms=percentile(lat, 0.5) * 1e3, p99_ms=percentile(lat, 0.99) * 1e3)  # fmt: skip
                s, cpu, lat = always.put1(n["put1sync"])
                add("put 1 sync", "redis always", n["put1sync"], s, cpu,
                    p50_ms=percentile(lat, 0.5) * 1e3, p99_ms=percentile(lat, 0.99) * 1e3)  # fmt: skip
            if "put1000" in cases:
                for c in hq:
                    add("put 1000 sync", c.server.name, n["put1000"], *c.put_batch(n["put1000"], 1000))
                add("put 1000 sync", "redis always", n["put1000"], *always.put_batch(n["put1000"], 1000))
            if "group" in cases or "read" in cases:
                size = max(n["group"], n["read"])
                filled = [(c, c.fill(size)) for c in hq] + [(everysec, everysec.fill(size))]
                if "read" in cases:
                    for c, name in filled:
                        s, cpu, count = c.read(name)
                        add("read", c.server.name, count, s, cpu)
                if "group" in cases:
                    for c, name in filled:
                        s, cpu, count = c.group(name, 100)
                        add("group 1 member", c.server.name, count, s, cpu)
            if "groupsync" in cases:  # acks kept at SYNC_WAL, against appendfsync always
                filled = [(c, c.fill(n["group"], Durability.SYNC_WAL)) for c in hq] + [
                    (always, always.fill(n["group"]))
                ]
                for c, name in filled:
                    s, cpu, count = c.group(name, 100)
                    add("group 1 member sync", c.server.name, count, s, cpu)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for (case, system), runs in samples.items():
        row: dict = {"case": case, "system": system, "runs": len(runs)}
        for key in runs[0]:
            values = sorted(r[key] for r in runs)
            row[key] = f"{values[0]:.3g} / {statistics.median(values):.3g} / {values[-1]:.3g}"
        rows.append(row)
    report(
        "server CPU per message, hqueue vs Redis 7 (min / median / max of the runs)",
        rows,
        ["case", "system", "runs", "msgs_s", "cpu_us", "p50_ms", "p99_ms"],
        args.json,
    )


if __name__ == "__main__":
    main()
