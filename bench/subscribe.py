"""End-to-end push latency and delivery throughput: hqueue vs Redis Streams.

Usage:
    python bench/subscribe.py [--json out.json] [--seconds 10] [--rate 2000]

Needs Debian's redis-server and the redis package (pip install '.[bench]').

Three processes on each side: the broker (``hqueue server`` with an embedded
store; ``redis-server`` with ``appendonly yes``: ``appendfsync everysec``
against ASYNC_WAL queues, ``always`` against SYNC_WAL ones, equal
durability), a producer (this process) and a consumer (a subprocess of this
script). The producer stamps the send time into each 100-byte payload; the
consumer measures the latency on arrival.

* latency: ``--rate`` msgs/s for ``--seconds`` s, one put each, at each
  durability; hqueue pushes to a subscriber, Redis is read with
  ``XREADGROUP … BLOCK`` then ``XACK``. Reports p50/p99/max.
* producer: 200,000 messages put in batches of 1000 while nobody reads
  (hqueue ``put``; Redis pipelined ``XADD``): the producer's own rate.
* drain: then a consumer starts from the first of them: delivery rate from
  the first to the last message it receives, the producer out of the way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import redis_client_module, report, rss_mb  # noqa: E402
from remote import start_hqueue, start_redis  # noqa: E402

from hqueue import Durability, HQueue, HQueueAdmin, Message, MessageID, MessageListener, Subscription  # noqa: E402

STAMP = struct.Struct(">q")
PAD = b"x" * (100 - 7 - STAMP.size)  # topic "crawler" + stamp + pad = 100 bytes


def payload() -> bytes:
    return STAMP.pack(time.time_ns()) + PAD


# -- consumers (run as subprocesses) ------------------------------------------------------


class _Recorder:
    """Latencies in ms and arrival times; written as JSON when told to stop, or
    once ``expect`` messages came (``stop`` is set then)."""

    def __init__(self, out: str, expect: int = 0) -> None:
        self.out, self.latencies, self.first, self.last, self.count = out, [], None, None, 0
        self.lock, self.expect, self.stop = threading.Lock(), expect, threading.Event()

    def record(self, stamps: list[bytes]) -> None:
        now = time.time_ns()
        with self.lock:
            self.latencies += [(now - STAMP.unpack_from(s)[0]) / 1e6 for s in stamps]
            self.first = self.first or now
            self.last, self.count = now, self.count + len(stamps)
            if self.expect and self.count >= self.expect:
                self.stop.set()

    def dump(self) -> None:
        with open(self.out, "w") as f:
            json.dump({"latencies": self.latencies, "first": self.first, "last": self.last, "count": self.count}, f)


def consume_hqueue(url: str, queue: str, out: str, earliest: bool, expect: int) -> None:
    recorder = _Recorder(out, expect)

    class Listener(MessageListener):
        def on_messages(self, messages):
            recorder.record([m.value for m in messages])

    stop = recorder.stop
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    subscription = Subscription("bench")
    if earliest:
        subscription.add_partitions({0: MessageID(0)})
    with HQueue(queue, url) as q, q.create_subscriber(subscription, [Listener()]):
        print("READY", flush=True)
        stop.wait()
    recorder.dump()


def consume_redis(port: int, stream: str, out: str, earliest: bool, expect: int) -> None:
    import redis

    recorder = _Recorder(out, expect)
    stop = recorder.stop
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    r = redis.Redis(port=port)
    r.xgroup_create(stream, "bench", id="0" if earliest else "$", mkstream=True)
    print("READY", flush=True)
    while not stop.is_set():
        reply = r.xreadgroup("bench", "c1", {stream: ">"}, count=1000, block=200)
        for _, entries in reply or []:
            recorder.record([fields[b"crawler"] for _, fields in entries])
            r.xack(stream, "bench", *[entry_id for entry_id, _ in entries])
    recorder.dump()


# -- the producer side ---------------------------------------------------------------------


def start_consumer(kind: str, target: str, name: str, out: str, earliest: bool = False, expect: int = 0):
    proc = subprocess.Popen(
        [sys.executable, __file__, "--consume", kind, target, name, out, str(int(earliest)), str(expect)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().startswith("READY")
    time.sleep(1.0)  # let the server start its workers
    return proc


def finish_consumer(proc: subprocess.Popen, out: str, expected: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    time.sleep(0.5)
    try:  # a consumer told how many to expect stops by itself once they came
        proc.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with open(out) as f:
        result = json.load(f)
    if result["count"] < expected:
        print(f"warning: the consumer got {result['count']} of {expected}", file=sys.stderr)
    return result


def paced(put, rate: int, seconds: float) -> int:
    interval, sent, started = 1.0 / rate, 0, time.perf_counter()
    while sent < rate * seconds:
        target = started + sent * interval
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        put()
        sent += 1
    return sent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--throughput-messages", type=int, default=200_000)
    parser.add_argument("--consume", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        kind, target, name, out, earliest, expect = args.consume
        if kind == "hqueue":
            consume_hqueue(target, name, out, earliest == "1", int(expect))
        else:
            consume_redis(int(target), name, out, earliest == "1", int(expect))
        return
    redis = redis_client_module()
    workdir = tempfile.mkdtemp(prefix="hqueue-bench-sub-")
    servers, rows = [], []
    try:
        hq_proc, hq_port = start_hqueue(workdir)
        servers.append(hq_proc)  # (each stopped in the end, whichever start fails)
        rd_proc, rd_port = start_redis(workdir)
        servers.append(rd_proc)
        always_proc, always_port = start_redis(workdir, "always")
        servers.append(always_proc)
        url, r = f"hqueue://127.0.0.1:{hq_port}", redis.Redis(port=rd_port)
        with HQueueAdmin(url) as admin:
            for durability in (Durability.ASYNC_WAL, Durability.SYNC_WAL):
                admin.create_queue(f"latency_{durability}".lower(), 1, durability=durability)
                admin.create_queue(f"throughput_{durability}".lower(), 1, durability=durability)
        sent = int(args.rate * args.seconds)
        # latency, at equal durability: ASYNC_WAL vs everysec, SYNC_WAL vs always
        for durability, fsync, client in (
            ("ASYNC_WAL", "everysec", r),
            ("SYNC_WAL", "always", redis.Redis(port=always_port)),
        ):
            name = f"latency_{durability}".lower()
            out = os.path.join(workdir, f"hq-{name}.json")
            consumer = start_consumer("hqueue", url, name, out, expect=sent)
            with HQueue(name, url) as queue:
                paced(lambda q=queue: q.put(Message("crawler", payload()), partition_id=0), args.rate, args.seconds)
            hq = finish_consumer(consumer, out, sent)
            out = os.path.join(workdir, f"rd-{name}.json")
            port = client.connection_pool.connection_kwargs["port"]
            consumer = start_consumer("redis", str(port), name, out, expect=sent)
            paced(lambda c=client, n=name: c.xadd(n, {"crawler": payload()}), args.rate, args.seconds)
            rd = finish_consumer(consumer, out, sent)
            for q, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
                h, d = percentile(hq["latencies"], q), percentile(rd["latencies"], q)
                rows.append({"measure": f"latency {label} ms at {args.rate}/s, {durability} vs {fsync}", "hqueue": h,
                             "redis": d, "ratio": d / h})  # fmt: skip
        # the producer alone, then the drain of what it put: ASYNC_WAL vs everysec, SYNC_WAL vs always
        total = args.throughput_messages
        for durability, fsync, client, port in (
            ("ASYNC_WAL", "everysec", r, rd_port),
            ("SYNC_WAL", "always", redis.Redis(port=always_port), always_port),
        ):
            name = f"throughput_{durability}".lower()
            with HQueue(name, url) as queue:
                started = time.perf_counter()
                for _ in range(total // 1000):
                    queue.put([Message("crawler", payload()) for _ in range(1000)], partition_id=0)
                h_put = total / (time.perf_counter() - started)
            started = time.perf_counter()
            for _ in range(total // 1000):
                pipe = client.pipeline(transaction=False)
                for _ in range(1000):
                    pipe.xadd(name, {"crawler": payload()})
                pipe.execute()
            d_put = total / (time.perf_counter() - started)
            rows.append({"measure": f"producer msgs/s (batches of 1000), {durability} vs {fsync}", "hqueue": h_put,
                         "redis": d_put, "ratio": h_put / d_put})  # fmt: skip
            out = os.path.join(workdir, f"hq-{name}.json")
            hq = finish_consumer(start_consumer("hqueue", url, name, out, True, total), out, total, 120)
            out = os.path.join(workdir, f"rd-{name}.json")
            rd = finish_consumer(start_consumer("redis", str(port), name, out, True, total), out, total, 120)
            h_rate = hq["count"] / ((hq["last"] - hq["first"]) / 1e9)
            d_rate = rd["count"] / ((rd["last"] - rd["first"]) / 1e9)
            rows.append({"measure": f"drain msgs/s, one consumer, {durability} vs {fsync}", "hqueue": h_rate,
                         "redis": d_rate, "ratio": h_rate / d_rate})  # fmt: skip
            rows.append({"measure": f"messages delivered (drain), {durability}", "hqueue": hq["count"],
                         "redis": rd["count"], "ratio": None})  # fmt: skip
        rows.append({"measure": "broker RSS after, MB (/proc)", "hqueue": rss_mb(hq_proc.pid),
                     "redis": rss_mb(rd_proc.pid), "ratio": rss_mb(rd_proc.pid) / rss_mb(hq_proc.pid)})  # fmt: skip
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    report(
        "push delivery: hqueue subscriber vs Redis XREADGROUP BLOCK + XACK (ratio > 1: hqueue better)",
        rows,
        ["measure", "hqueue", "redis", "ratio"],
        args.json,
    )


if __name__ == "__main__":
    main()
