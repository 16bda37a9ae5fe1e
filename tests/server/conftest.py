"""Fixtures of the server tests."""

from __future__ import annotations

import pytest

from hqueue import HQueue, HQueueAdmin
from hqueue.server import HQueueServer


@pytest.fixture
def server(tmp_path):
    """An hqueue server in this process on a loopback port, on a fresh embedded store, with
    queue "q" of 2 partitions (a test module may define its own ``server``)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server
    server.stop()


@pytest.fixture
def queue(server):
    """Queue "q" of ``server``, through it (a test module may define its own ``queue``)."""
    with HQueue("q", f"hqueue://{server.address}") as queue:
        yield queue


@pytest.fixture
def server_process(tmp_path):
    """An ``hqueue server`` process the test may kill and start again (on its port), on a
    fresh embedded store at ``tmp_path / "data"``, with queue "q" of 2 partitions."""
    from ..processes import ServerProcess

    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    try:
        with HQueueAdmin(f"hqueue://{proc.address}") as admin:
            admin.create_queue("q", 2)
        yield proc
    finally:
        proc.kill()
