"""What connection I/O alone costs a Python server per call: a thread per connection
(hqueue's server today) against one selectors (epoll) loop over all connections.

Usage:
    python bench/io_floor.py [--calls 40000] [--clients 1,16] [--json out.json]

No hqueue and no Thrift: each server reads 4-byte-length frames of 150 bytes
(a one-message put's size) and answers each with a 40-byte frame, on loopback
TCP with TCP_NODELAY, as ``hqueue server``'s frame loop does. Clients are
processes of their own, each sending one frame and waiting for its answer,
``--calls`` in all. The server's CPU (user + system, ``/proc/PID/stat``) over
the run, divided by the calls, is the floor a Python server pays per call for
I/O before it does any work: what an event loop could save over threads.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

from common import report  # noqa: E402

HEAD = struct.Struct(">I")
REPLY = b"r" * 40
REQUEST = HEAD.pack(150) + b"q" * 150
TICK = os.sysconf("SC_CLK_TCK")


def answer(sock: socket.socket, buffer: bytes) -> bytes:
    """Answer every whole frame in ``buffer``; what is left of it."""
    while len(buffer) >= 4:
        size = HEAD.unpack_from(buffer)[0]
        if len(buffer) < 4 + size:
            break
        buffer = buffer[4 + size :]
        sock.sendmsg((HEAD.pack(len(REPLY)), REPLY))
    return buffer


def threaded(listener: socket.socket) -> None:
    def connection(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        while chunk := sock.recv(65536):
            buffer = answer(sock, buffer + chunk)

    while True:
        sock, _ = listener.accept()
        threading.Thread(target=connection, args=(sock,), daemon=True).start()


def loop(listener: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                sock, _ = listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buffers[sock] = b""
                selector.register(sock, selectors.EVENT_READ)
                continue
            sock = key.fileobj  # type: ignore[assignment]
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(sock)
                del buffers[sock]
                sock.close()
                continue
            buffers[sock] = answer(sock, buffers[sock] + chunk)


def serve(kind: str, ports: multiprocessing.Queue) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    ports.put(listener.getsockname()[1])
    (threaded if kind == "threaded" else loop)(listener)


def client(port: int, calls: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    need = 4 + len(REPLY)
    for _ in range(calls):
        sock.sendall(REQUEST)
        got = b""
        while len(got) < need:
            got += sock.recv(need - len(got))
    sock.close()


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_clients(port: int, clients: int, calls: int) -> None:
    procs = [multiprocessing.Process(target=client, args=(port, calls)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


def measure(kind: str, clients: int, calls: int) -> dict:
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(kind, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=10)
        run_clients(port, clients, 200)  # warm up
        each = calls // clients
        cpu, start = cpu_seconds(server.pid), time.perf_counter()
        run_clients(port, clients, each)
        seconds, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
    finally:
        server.terminate()
        server.join()
    return {
        "server": kind, "clients": clients, "calls_per_s": each * clients / seconds,
        "server_cpu_us_per_call": 1e6 * cpu / (each * clients),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40_000)
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [
        measure(kind, int(clients), args.calls) for clients in args.clients.split(",") for kind in ("threaded", "loop")
    ]
    report(
        "connection I/O per call: a thread per connection vs one selectors loop (no work per call)",
        rows, ["server", "clients", "calls_per_s", "server_cpu_us_per_call"], args.json,
    )  # fmt: skip


if __name__ == "__main__":
    main()
