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

import pytest
from hypothesis import settings
from kazoo.client import KazooClient

from hqueue import HQueue, HQueueAdmin
from hqueue.server import HQueueServer
from hqueue.storage.memory import forget

from .processes import ROOT, ZooKeeperServer, in_ci, python_env

# No per-example deadline: a loaded machine (CI, the suite's workers) is not a failure; timing
# claims belong in bench/.
settings.register_profile("hqueue", deadline=None)
settings.load_profile("hqueue")

_counter = itertools.count()

#: embedded: RocksDB in a temp dir. hbase-standin: the HBase backend against
#: the Thrift1 stand-in server in tests/hbase_standin.py (NOT HBase).
#: hbase: a real HBase Thrift server, when HQUEUE_TEST_HBASE=host:port is set.
#: hbase-standin-thrift2: the same, with the stand-in's Thrift2 admin port
#: (pre-split tables, truncate keeping splits), as with HBase 2.x.
#: memory: the in-process memory:// store (for unit tests; held to the same contract).
#: remote: (api_url only) an hqueue server on loopback, over hqueue://.
ALL_BACKENDS = ["embedded", "memory", "hbase-standin", "hbase-standin-thrift2"] + (
    ["hbase"] if os.environ.get("HQUEUE_TEST_HBASE") else []
)
#: The marker of each backend: ``-m hbase`` runs the HBase backend's tests alone, ``-m "not remote"``…
MARKERS = {"embedded": "embedded", "memory": "memory", "remote": "remote"}


def marker_of(backend: str) -> str:
    return MARKERS.get(backend, "hbase")


def selected(backends: list[str]) -> list[str]:
    """The backends ``HQUEUE_TEST_BACKENDS`` names (``embedded,memory,remote,hbase``;
    ``hbase`` is every HBase backend): every one when it is not set."""
    wanted = {name.strip() for name in os.environ.get("HQUEUE_TEST_BACKENDS", "").split(",") if name.strip()}
    if not wanted:
        return backends
    unknown = wanted - {"embedded", "memory", "remote", "hbase"}
    if unknown:
        raise pytest.UsageError(f"HQUEUE_TEST_BACKENDS: unknown {sorted(unknown)}; use embedded,memory,remote,hbase")
    return [b for b in backends if marker_of(b) in wanted]


def backend_params(backends: list[str]) -> list:
    return [pytest.param(b, marks=getattr(pytest.mark, marker_of(b))) for b in selected(backends)]


BACKENDS = selected(ALL_BACKENDS)

__all__ = ["ROOT", "in_ci", "python_env"]


def start_hbase_standin(*args: str) -> tuple[subprocess.Popen, int, int]:
    """Start tests/hbase_standin.py; return it with its Thrift1 and Thrift2 ports."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.hbase_standin", *args],
        cwd=ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("LISTENING "):
        proc.kill()
        pytest.fail(f"the HBase stand-in did not start: {line!r}")
    _, thrift1, thrift2 = line.split()
    return proc, int(thrift1), int(thrift2)


@pytest.fixture(scope="session")
def hbase_standin():
    """``(thrift1 host:port, thrift2 host:port)`` of one stand-in for the session."""
    proc, thrift1, thrift2 = start_hbase_standin()
    yield f"127.0.0.1:{thrift1}", f"127.0.0.1:{thrift2}"
    proc.kill()
    proc.wait()


def hbase_url(address: str, admin: str | None = None) -> str:
    """A URL with a unique table prefix: each test its own namespace."""
    url = f"hbase://{address}?prefix=t{os.getpid()}_{next(_counter)}_"
    return url + (f"&admin={admin}" if admin else "")


@pytest.fixture(params=backend_params(ALL_BACKENDS))
def store_url(request, tmp_path) -> str:
    """A fresh, empty store of each storage backend."""
    return _store_url(request, request.param, tmp_path)


@pytest.fixture(params=backend_params([*ALL_BACKENDS, "remote"]))
def api_url(request, tmp_path) -> str:
    """A URL for HQueue/HQueueAdmin: each storage backend in process, and
    "remote": an hqueue server on loopback (embedded store) via hqueue://."""
    if request.param == "remote":
        server = HQueueServer("local://" + str(tmp_path / "server-data"), port=0).start()
        request.addfinalizer(server.stop)
        return f"hqueue://{server.address}"
    return _store_url(request, request.param, tmp_path)


def _store_url(request, backend: str, tmp_path) -> str:
    if backend == "embedded":
        return "local://" + str(tmp_path / "data")
    if backend == "memory":
        name = f"test-{os.getpid()}-{next(_counter)}"
        request.addfinalizer(lambda: forget(name))
        return "memory://" + name
    if backend == "hbase-standin":
        return hbase_url(request.getfixturevalue("hbase_standin")[0])
    if backend == "hbase-standin-thrift2":
        return hbase_url(*request.getfixturevalue("hbase_standin"))
    return hbase_url(os.environ["HQUEUE_TEST_HBASE"])


@pytest.fixture
def admin(api_url):
    with HQueueAdmin(api_url) as admin:
        yield admin


@pytest.fixture
def queue_name() -> str:
    return f"q{os.getpid()}_{next(_counter)}"


@pytest.fixture
def make_queue(admin, api_url, queue_name):
    """make_queue(partitions=4, ttl=0, **kw) -> an open HQueue on a new queue."""
    opened: list[HQueue] = []

    def make(partitions: int = 4, ttl: int = 0, name: str | None = None, **kwargs) -> HQueue:
        name = name or f"{queue_name}_{len(opened)}"
        admin.create_queue(name, partitions, ttl, **kwargs)
        queue = HQueue(name, api_url)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A real ZooKeeper server for the session (Debian's package)."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    yield server
    server.stop()


@pytest.fixture
def zk_hosts(zookeeper) -> str:
    """ZooKeeper hosts with a chroot of this test's own."""
    chroot = f"/test_{os.getpid()}_{next(_counter)}"
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=30)
    client.ensure_path(chroot)
    client.stop()
    client.close()
    return zookeeper.hosts + chroot
