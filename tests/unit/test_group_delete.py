"""Deleting a group at every partition owner (rpc/operations.py DELETE_GROUP): the
first owner removes the group's key, so the later ones may not find it, which is no
error; only when no owner had it is the group not found. Both clients, one declaration.
The servers' side runs in tests/integration/test_cluster.py."""

from __future__ import annotations

import asyncio

import pytest

from hqueue import GroupNotFound
from hqueue.aio.client.engine import AsyncRemoteEngine
from hqueue.client.engine import RemoteEngine

OWNERS = ["127.0.0.1:1", "127.0.0.1:2"]


def owners_answering(found: set[str], calls: list[str]):
    """A server call at each owner: those in ``found`` delete, the others have no such group."""

    def call_at(owner, method, *args, queue=None, pid=-1, **_):  # (share, at_share, late)
        calls.append(owner)
        if owner not in found:
            raise GroupNotFound(queue, args[1])

    return call_at


@pytest.mark.parametrize(("found", "deleted"), [({OWNERS[0]}, True), (set(OWNERS), True), (set(), False)])
def test_the_blocking_client_deletes_at_every_owner(monkeypatch, found, deleted):
    engine = RemoteEngine("hqueue://127.0.0.1:1")
    calls: list[str] = []
    monkeypatch.setattr(engine, "_call_at", owners_answering(found, calls))
    monkeypatch.setattr(engine.groups, "_owners", lambda queue, fresh=False: OWNERS)
    if deleted:
        engine.groups.delete("q", "g")
    else:
        with pytest.raises(GroupNotFound):
            engine.groups.delete("q", "g")
    assert calls == OWNERS  # every owner was asked, whatever the first said
    engine.release()


@pytest.mark.parametrize(("found", "deleted"), [({OWNERS[1]}, True), (set(), False)])
def test_the_asyncio_client_deletes_at_every_owner(monkeypatch, found, deleted):
    async def run() -> list[str]:
        engine = AsyncRemoteEngine("hqueue://127.0.0.1:1")
        calls: list[str] = []
        sync_call = owners_answering(found, calls)

        async def call_at(*args, **kwargs):
            return sync_call(*args, **kwargs)

        async def owners(queue, fresh=False):
            return OWNERS

        monkeypatch.setattr(engine, "_call_at", call_at)
        monkeypatch.setattr(engine.groups, "_owners", owners)
        try:
            await engine.groups.delete("q", "g")
        finally:
            await engine.release()
        return calls

    if deleted:
        assert asyncio.run(run()) == OWNERS
    else:
        with pytest.raises(GroupNotFound):
            asyncio.run(run())
