"""What hostile or careless clients cost an hqueue server, side by side with
thriftpy2's own threaded server (what hqueue served with before its checks).

Usage:
    python bench/hostile.py [--json out.json] [--before SRC]

Each figure comes from a server subprocess on loopback:

* frame stall: the longest listQueues round trip on one connection while
  another sends a 35-byte frame that declares 2**31-1 VOID elements;
* reply RSS: the server's resident memory after messageScannerGetList asks
  for 2**31-1 messages of a 200,000-message partition (1 KB each);
* put RSS: after a 5 MB putMessages frame of a million empty TMessages;
* threads: with 2,000 idle connections open (the limit is 1,024), then
  after the idle timeout (10 s here; 300 s by default);
* descriptors: with the fd limit at 256 and 400 connections held, the
  "accept failed" log lines and the CPU the server burns in 5 s;
* a /metrics scrape with 300 groups x 4 partitions and 1,000 x 16 (made by
  a consumer token): server CPU ms and wall ms (bench/metrics_scrape.py;
  ``--before SRC`` fills the "before" column from another source tree).
* packed puts (``--packed`` runs these rows alone): the server's RSS rise
  (peak, and what it still holds 2 s later) and the longest listQueues round
  trip of a client in another process, for one 60 MiB putPacked of 6,990,506
  messages with empty topics (refused), four 30 MiB ones at once, a 16 MiB
  blob of 1.8M messages (inside the frame limit, over the count), a valid
  blob at the per-call cap (10,000 messages, 16 MiB), eight of those at once
  (the in-flight budget), a getQueue of a 19 MiB name (any call may be
  as large as the frame limit), and how many messages one
  valid 60 MiB blob writes.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import metrics_scrape  # noqa: E402
from common import report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402

from hqueue import HQueue, HQueueAdmin, Message  # noqa: E402
from hqueue.rpc.wire import T  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))

# A stand-in for the server as it was: thriftpy2's TThreadedServer decoding unchecked frames.
PLAIN_SERVER = """
import sys
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.server import TThreadedServer
from thriftpy2.thrift import TProcessor
from thriftpy2.transport import TFramedTransportFactory, TServerSocket
from hqueue.rpc.wire import T
class Handler:
    def listQueues(self):
        return []
server = TThreadedServer(TProcessor(T.HQueueService, Handler()), TServerSocket("127.0.0.1", int(sys.argv[1])),
                         iprot_factory=TBinaryProtocolFactory(), itrans_factory=TFramedTransportFactory())
server.serve()
"""


def frame(method: bytes, args: bytes) -> bytes:
    body = struct.pack("!Ii", 0x80010001, len(method)) + method + struct.pack("!i", 1) + args
    return struct.pack("!i", len(body)) + body


HOSTILE = frame(b"listQueues", b"\x0f\x00\x63\x01" + struct.pack("!i", 2**31 - 1) + b"\x00")


def start_hqueue(workdir: str, *args: str, max_files: int | None = None) -> tuple[subprocess.Popen, int]:
    port = free_port()

    def limit() -> None:
        if max_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

    proc = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{workdir}", "--port", str(port),
         "--log-level", "WARNING", *args],
        env=ENV, stderr=open(f"{workdir}.log", "w"), preexec_fn=limit,
    )  # fmt: skip
    wait_port(port, proc=proc)
    return proc, port


def status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client(port: int):
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TFramedTransportFactory

    return make_client(
        T.HQueueService, "127.0.0.1", port, proto_factory=TBinaryProtocolFactory(),
        trans_factory=TFramedTransportFactory(), timeout=60_000,
    )  # fmt: skip


def send(port: int, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(payload)
            s.recv(1)
        except OSError:
            pass


def frame_stall(port: int) -> float:
    """The longest listQueues round trip (ms) while a hostile frame arrives."""
    probe, worst, stop = client(port), [0.0], threading.Event()

    def loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            probe.listQueues()
            worst[0] = max(worst[0], time.perf_counter() - started)

    for _ in range(50):
        probe.listQueues()  # warm
    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(0.3)
    threading.Thread(target=send, args=(port, HOSTILE), daemon=True).start()
    time.sleep(6.0)
    stop.set()
    thread.join()
    return worst[0] * 1000


# A client in its own process (so the bench's own work never stalls it): the longest
# listQueues round trip, in ms, from "go" on stdin until stdin closes.
PROBE = """
import sys, threading, time
sys.path.insert(0, sys.argv[2])
from hostile import client
probe, worst, done = client(int(sys.argv[1])), [0.0], threading.Event()
for _ in range(50):
    probe.listQueues()
print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    started = time.perf_counter()
    probe.listQueues()
    worst[0] = max(worst[0], time.perf_counter() - started)
    time.sleep(0.001)
print(worst[0] * 1000, flush=True)
"""


def put_packed_frame(blob: bytes, queue: bytes = b"q") -> bytes:
    queue_field = b"\x0b\x00\x01" + struct.pack("!i", len(queue)) + queue
    return frame(
        b"putPacked",
        queue_field + b"\x06\x00\x02\x00\x00" + b"\x0b\x00\x03" + struct.pack("!i", len(blob)) + blob + b"\x00",
    )


def call_raw(port: int, payload: bytes, method: str = "putPacked") -> str:
    """Send one framed call; what came back: "count=N", the exception's type, or "closed"."""
    from thriftpy2.protocol import TBinaryProtocol
    from thriftpy2.thrift import TApplicationException
    from thriftpy2.transport import TMemoryBuffer

    with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
        try:
            s.sendall(payload)
            reply = b""
            while len(reply) < 4 or len(reply) < 4 + struct.unpack("!I", reply[:4])[0]:
                chunk = s.recv(1 << 20)
                if not chunk:
                    return "closed"
                reply += chunk
        except OSError:
            return "closed"
    protocol = TBinaryProtocol(TMemoryBuffer(reply[4:]))
    _, kind, _ = protocol.read_message_begin()
    if kind == 3:  # EXCEPTION
        error = TApplicationException()
        error.read(protocol)
        return f"TApplicationException: {error}"
    result = getattr(T.HQueueService, method + "_result")()
    result.read(protocol)
    if result.success is not None:
        return f"count={result.success.count}" if method == "putPacked" else "answered"
    error = next(v for k, v in vars(result).items() if k != "success" and v is not None)
    return f"{type(error).__name__}: {error.message[:70]}"


def hostile_puts(proc: subprocess.Popen, port: int, payloads: list[bytes], method: str = "putPacked") -> dict:
    """Send ``payloads`` at once; the server's RSS rise (peak, held 2 s later), another client's worst stall."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(port), os.path.dirname(os.path.abspath(__file__))],
                             env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert probe.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    before = status(proc.pid, "VmRSS")
    with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak
    probe.stdin.write("go\n")
    probe.stdin.flush()
    time.sleep(0.3)
    answers: list[str] = [""] * len(payloads)

    def send_one(i: int) -> None:
        answers[i] = call_raw(port, payloads[i], method)

    threads = [threading.Thread(target=send_one, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.3)
    probe.stdin.close()
    stall = float(probe.stdout.readline())
    probe.wait()
    peak = status(proc.pid, "VmHWM")
    time.sleep(2.0)
    return {"peak": (peak - before) / 1024, "held": (status(proc.pid, "VmRSS") - before) / 1024, "stall": stall,
            "answers": sorted(set(answers))}  # fmt: skip


def packed_rows(work: str) -> list[dict]:
    """Packed puts against the frame and call limits, and the in-flight budget."""
    from hqueue.rpc import packed

    def put(topic: bytes, value: bytes, count: int) -> bytes:
        return put_packed_frame(packed.pack([topic] * count, [value] * count))

    n60 = 60 * 2**20 // 9  # 6,990,506 messages of 9 bytes (two lengths and one byte) in 60 MiB
    at_cap = put(b"t", b"v" * 1676, 10_000)
    cases = [
        ("60 MiB putPacked, 6,990,506 empty topics", [put(b"", b"x", n60)]),
        ("4 x 30 MiB putPacked at once, empty topics", [put(b"", b"x", n60 // 2)] * 4),
        ("16 MiB putPacked, 1,864,135 messages", [put(b"t", b"", 16 * 2**20 // 9)]),
        ("valid putPacked at the cap (10,000, 16 MiB)", [at_cap]),
        ("8 x the cap at once", [at_cap] * 8),
    ]
    junk = b"\xe0\xa0\x80" * (19 * 2**20 // 3)  # 19 MiB of a 3-byte UTF-8 character, as a queue's name
    junk_call = frame(b"getQueue", b"\x0b\x00\x01" + struct.pack("!i", len(junk)) + junk + b"\x00")
    rows = []
    for number, (name, payloads) in enumerate(cases):  # each on a new server: what one case leaves is its own
        proc, port = start_packed_server(f"{work}/p{number}")
        try:
            got = hostile_puts(proc, port, payloads)
        finally:
            proc.terminate()
            proc.wait()
        rows.append({"measure": f"{name}: server RSS rise, peak / held 2 s later, MB",
                     "hqueue": f"{got['peak']:.0f} / {got['held']:.0f}"})  # fmt: skip
        rows.append({"measure": f"{name}: other client's longest call, ms", "hqueue": got["stall"]})
        rows.append({"measure": f"{name}: answer", "hqueue": " | ".join(got["answers"])})
    del cases, at_cap
    proc, port = start_packed_server(f"{work}/p-junk")
    try:
        got = hostile_puts(proc, port, [junk_call], "getQueue")
    finally:
        proc.terminate()
        proc.wait()
    rows.append({"measure": "getQueue of a 19 MiB name: server RSS rise, peak / held 2 s later, MB",
                 "hqueue": f"{got['peak']:.0f} / {got['held']:.0f}"})  # fmt: skip
    rows.append({"measure": "getQueue of a 19 MiB name: other client's longest call, ms", "hqueue": got["stall"]})
    proc, port = start_packed_server(f"{work}/p-valid")
    try:
        rows.append({"measure": "valid 60 MiB putPacked of 6,990,506 messages: answer",
                     "hqueue": call_raw(port, put(b"t", b"", n60))})  # fmt: skip
    finally:
        proc.terminate()
    return rows


def start_packed_server(workdir: str) -> tuple[subprocess.Popen, int]:
    """A server with queue "q" (one partition), warmed by a 1,000-message put."""
    proc, port = start_hqueue(workdir)
    with HQueueAdmin(f"hqueue://127.0.0.1:{port}") as admin:
        admin.create_queue("q", 1)
    with HQueue("q", f"hqueue://127.0.0.1:{port}") as queue:
        queue.put([Message("t", b"x" * 1000)] * 1000, partition_id=0)
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--before", help="source tree of the server the metrics rows compare with")
    parser.add_argument("--packed", action="store_true", help="only the packed-put rows")
    args = parser.parse_args()
    rows = []
    if args.packed:
        with tempfile.TemporaryDirectory(prefix="hqueue-bench-hostile-") as work:
            rows = packed_rows(work)
        report("hostile packed puts: an hqueue server", rows, ["measure", "hqueue"], args.json)
        return
    with tempfile.TemporaryDirectory(prefix="hqueue-bench-hostile-") as work:
        plain_port = free_port()
        plain = subprocess.Popen(
            [sys.executable, "-c", PLAIN_SERVER, str(plain_port)], env=ENV, stderr=subprocess.DEVNULL
        )
        wait_port(plain_port)
        proc, port = start_hqueue(f"{work}/a", "--connection-idle-timeout", "10")
        try:
            rows.append({"measure": "frame stall, ms (35-byte frame)", "hqueue": frame_stall(port),
                         "thriftpy2 as before": frame_stall(plain_port)})  # fmt: skip
            with HQueueAdmin(f"hqueue://127.0.0.1:{port}") as admin:
                admin.create_queue("q", 1)
            with HQueue("q", f"hqueue://127.0.0.1:{port}") as queue:
                for _ in range(200):
                    queue.put([Message("t", b"x" * 1000)] * 1000, partition_id=0)
            rss_before = status(proc.pid, "VmRSS")
            c = client(port)
            scanner = c.messageScannerOpen("q", 0, T.TMessageScan())
            got = len(c.messageScannerGetList(scanner, 2**31 - 1))
            rows.append({"measure": "reply to GetList(2**31-1): messages", "hqueue": got})
            rows.append({"measure": "server RSS after that reply, MB", "hqueue": status(proc.pid, "VmRSS") / 1024,
                         "thriftpy2 as before": None})  # fmt: skip
            empties = b"\x0f\x00\x02\x0c" + struct.pack("!i", 1_000_000) + b"\x00" * 1_000_000
            send(port, frame(b"putMessages", b"\x0b\x00\x01" + struct.pack("!i", 1) + b"q" + empties + b"\x00"))
            rows.append({"measure": "server RSS after 1M empty TMessages, MB",
                         "hqueue": status(proc.pid, "VmRSS") / 1024})  # fmt: skip
            rows.append({"measure": "server RSS before both, MB", "hqueue": rss_before / 1024})
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2000)]
            time.sleep(3.0)
            rows.append({"measure": "threads with 2,000 idle connections", "hqueue": status(proc.pid, "Threads")})
            time.sleep(9.0)
            rows.append({"measure": "threads after the 10 s idle timeout", "hqueue": status(proc.pid, "Threads")})
            for s in held:
                s.close()
        finally:
            proc.terminate()
            plain.terminate()
        proc, port = start_hqueue(f"{work}/b", max_files=256)
        try:
            held = []
            for _ in range(400):
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                except OSError:
                    break
            cpu = cpu_seconds(proc.pid)
            time.sleep(5.0)
            cpu = cpu_seconds(proc.pid) - cpu
            lines = open(f"{work}/b.log").read().count("accept failed")
            rows.append({"measure": "fd limit 256, 400 connections: CPU s in 5 s", "hqueue": cpu})
            rows.append({"measure": "fd limit 256: 'accept failed' log lines", "hqueue": lines})
            for s in held:
                s.close()
        finally:
            proc.terminate()
        rows += packed_rows(work)
    rows += metrics_scrape.rows([(300, 4), (1000, 16)], 1000, args.before)
    report("hostile clients: hqueue server vs thriftpy2's plain threaded server", rows,
           ["measure", "hqueue", "thriftpy2 as before", "before"], args.json)  # fmt: skip


if __name__ == "__main__":
    main()
