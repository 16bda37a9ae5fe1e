"""Shared fixtures.

Every test gets its own store (a temp directory, or a unique table prefix on
a shared HBase-compatible server) and its own queue names: no module-global
connections, as in happybase's and kazoo's suites.

``store_url`` is parametrized over the storage backends, so the API tests
run unchanged on each one (dramatiq's pattern for brokers).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hqueue import HQueue, HQueueAdmin

ROOT = Path(__file__).resolve().parents[1]
_counter = itertools.count()

#: embedded: RocksDB in a temp dir. hbase-standin: the HBase backend against
#: the Thrift1 stand-in server in tests/hbase_standin.py (NOT HBase).
#: hbase: a real HBase Thrift server, when HQUEUE_TEST_HBASE=host:port is set.
BACKENDS = ["embedded", "hbase-standin"] + (["hbase"] if os.environ.get("HQUEUE_TEST_HBASE") else [])


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def python_env() -> dict[str, str]:
    """The environment for subprocesses that import hqueue and tests."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.fixture(scope="session")
def hbase_standin():
    """``host:port`` of an HBase Thrift1 stand-in server in a subprocess."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.hbase_standin", "--port", "0"],
        cwd=ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("LISTENING "):
        proc.kill()
        pytest.fail(f"the HBase stand-in did not start: {line!r}")
    yield f"127.0.0.1:{line.split()[1]}"
    proc.kill()
    proc.wait()


def hbase_url(address: str) -> str:
    """A URL with a unique table prefix: each test its own namespace."""
    return f"hbase://{address}?prefix=t{os.getpid()}_{next(_counter)}_"


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path) -> str:
    """A fresh, empty store of each backend."""
    if request.param == "embedded":
        return "local://" + str(tmp_path / "data")
    if request.param == "hbase-standin":
        return hbase_url(request.getfixturevalue("hbase_standin"))
    return hbase_url(os.environ["HQUEUE_TEST_HBASE"])


@pytest.fixture
def admin(store_url):
    with HQueueAdmin(store_url) as admin:
        yield admin


@pytest.fixture
def queue_name() -> str:
    return f"q{os.getpid()}_{next(_counter)}"


@pytest.fixture
def make_queue(admin, store_url, queue_name):
    """make_queue(partitions=4, ttl=0, **kw) -> an open HQueue on a new queue."""
    opened: list[HQueue] = []

    def make(partitions: int = 4, ttl: int = 0, name: str | None = None, **kwargs) -> HQueue:
        name = name or f"{queue_name}_{len(opened)}"
        admin.create_queue(name, partitions, ttl, **kwargs)
        queue = HQueue(name, store_url)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()
