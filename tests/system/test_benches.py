"""The benches start what they measure: the servers that the comparisons with Redis start
(``remote.start_hqueue``, which groups, aio_groups, producer and others share, and
``server_cpu.start_hqueue``) answer. Benches run by hand, not in CI: a server command line
the CLI had begun to refuse went unseen, each of those benches waiting 30 s for a port and
failing. Speed itself is never asserted here."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from hqueue import HQueueAdmin

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


@pytest.fixture
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    yield lambda name: importlib.import_module(name)
    for name in ("remote", "server_cpu", "common"):
        sys.modules.pop(name, None)


def _answers(port: int) -> None:
    with HQueueAdmin(f"hqueue://127.0.0.1:{port}") as admin:
        admin.create_queue("bench-smoke", partitions=1)
        assert [q.name for q in admin.list_queues()] == ["bench-smoke"]


def test_the_remote_benches_server_answers(bench_modules, tmp_path):
    proc, port = bench_modules("remote").start_hqueue(str(tmp_path))
    try:
        _answers(port)
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_server_cpu_benches_server_answers(bench_modules, tmp_path):
    server = bench_modules("server_cpu").start_hqueue("smoke", os.path.join(BENCH, ".."), str(tmp_path))
    try:
        _answers(server.port)
    finally:
        server.stop()
