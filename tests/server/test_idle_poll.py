"""Polling before sleeping (rpc/spin.py, ``--idle-poll-us``, ``poll_us=``): a server and a
client poll only while calls and answers come that soon; idle, they sleep. What it buys
is in bench/ (server_cpu.py); these tests check behaviour and CPU left alone."""

from __future__ import annotations

import os
import threading
import time

import pytest
from click.testing import CliRunner

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.cli.main import main
from hqueue.errors import InvalidArgument
from hqueue.rpc.connections import ServerLimits
from hqueue.rpc.spin import DEFAULT_CLIENT_POLL_US, DEFAULT_SERVER_POLL_US
from hqueue.server import HQueueServer

from ..processes import ServerProcess, server_certificate

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def test_a_server_that_polled_between_quick_calls_sleeps_once_they_stop(tmp_path):
    server = ServerProcess(f"local://{tmp_path}/data", tmp_path)  # the default --idle-poll-us
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            for i in range(2000):  # one call after another: the loop polls between them
                queue.put(Message("t", b"%d" % i), 0)
            before = cpu_seconds(server.proc.pid)
            time.sleep(3)  # connections open, nothing called
            idle = cpu_seconds(server.proc.pid) - before
            sparse_from = cpu_seconds(server.proc.pid)
            for i in range(30):  # a call every 100 ms: each wait too long for a poll to catch
                queue.put(Message("t", b"late %d" % i), 0)
                time.sleep(0.1)
            sparse = cpu_seconds(server.proc.pid) - sparse_from
            assert sum(1 for _ in queue.scan()) == 2030
        assert idle < 0.3, f"an idle server used {idle:.2f} s of CPU in 3 s"
        assert sparse < 0.6, f"30 calls 100 ms apart cost the server {sparse:.2f} s of CPU"
    finally:
        server.terminate()


def test_a_client_waiting_for_a_late_answer_sleeps(tmp_path):
    server = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue, queue.consumer("g") as member:
            for i in range(300):  # answers that come at once: the connection polls for them
                queue.put(Message("t", b"%d" % i), 0)
            member.ack(member.receive(300, wait=0))
            spent: list[float] = []

            def wait_long() -> None:  # (this thread's CPU only)
                started = time.thread_time()
                assert member.receive(10, wait=1.5) == []  # nothing to hand out: the server answers late
                spent.append(time.thread_time() - started)

            worker = threading.Thread(target=wait_long)
            worker.start()
            worker.join()
        assert spent and spent[0] < 0.3, f"a receive waiting 1.5 s used {spent} s of its thread's CPU"
    finally:
        server.terminate()


def test_without_polling_calls_are_served_as_before(tmp_path):
    server = ServerProcess(f"local://{tmp_path}/data", tmp_path, extra_args=("--idle-poll-us", "0"))
    try:
        url = f"hqueue://{server.address}?poll_us=0"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            queue.put([Message("t", b"%d" % i) for i in range(50)], 0)
            queue.put(Message("t", b"one"), 0)
            assert [m.value for m in queue.scan()][-2:] == [b"49", b"one"]
    finally:
        server.terminate()


def test_poll_times_out_of_range_are_refused_with_their_names(tmp_path):
    result = CliRunner().invoke(main, ["server", "--idle-poll-us", "20000", "--storage", "memory://"])
    assert result.exit_code == 2 and "--idle-poll-us" in result.output
    result = CliRunner().invoke(main, ["server", "--idle-poll-us", "-1", "--storage", "memory://"])
    assert result.exit_code == 2 and "--idle-poll-us" in result.output
    with pytest.raises(ValueError, match="idle_poll_us"):
        ServerLimits(idle_poll_us=-5)
    for bad in ("-1", "x", "10001", "1.5"):
        with pytest.raises(InvalidArgument, match="poll_us"):
            HQueue("q", f"hqueue://127.0.0.1:1?poll_us={bad}")  # refused before any connection
    assert ServerLimits().idle_poll_us == DEFAULT_SERVER_POLL_US > 0
    assert DEFAULT_CLIENT_POLL_US > 0


def spin_of_a_connection(server: HQueueServer, options: str):
    """The poll (rpc/spin.py) of a client connection to ``server`` made with URL ``options``."""
    server.start()
    try:
        with HQueueAdmin(f"hqueue://127.0.0.1:{server.port}?{options}") as admin:
            admin.create_queue("q", 1)
            pool = next(iter(admin.engine._pools.values()))
            connection = pool.take()
            pool.give_back(connection)
            return connection.socket.spin
    finally:
        server.stop()


def test_a_tls_connection_does_not_poll_and_a_plain_one_does(tmp_path):
    cert, context = server_certificate(tmp_path)  # (the server's own context: its certificate)
    tls = HQueueServer(f"local://{tmp_path}/tls", "127.0.0.1", 0, ssl_context=context, local_socket=False)
    assert spin_of_a_connection(tls, f"tls=1&ca={cert}") is None
    plain = HQueueServer(f"local://{tmp_path}/plain", "127.0.0.1", 0, local_socket=False)
    spin = spin_of_a_connection(plain, "poll_us=250")
    assert spin is not None and spin.limit == 250e-6
