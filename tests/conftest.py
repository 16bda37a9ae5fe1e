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

import pytest

from hqueue import HQueue, HQueueAdmin

_counter = itertools.count()

BACKENDS = ["embedded"]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path) -> str:
    """A fresh, empty store of each backend."""
    if request.param == "embedded":
        return "local://" + str(tmp_path / "data")
    raise AssertionError(request.param)


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
