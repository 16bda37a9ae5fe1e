"""A subscriber's presence in ZooKeeper (real ZooKeeper, a chroot per test): the
ephemeral nodes another session holds are never taken over, since they would go
when that session ends and leave this instance half announced."""

import json

import pytest
from kazoo.client import KazooClient

from hqueue.auth import PushCredentials
from hqueue.errors import SubscriberActive
from hqueue.subscriptions.zk_registry import ZooKeeperPresence, registration_path


@pytest.fixture
def zk(zk_hosts):
    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=30)
    client.create(registration_path("q", "s"), b"{}", makepath=True)
    yield client
    client.stop()
    client.close()


def test_a_presence_half_held_by_an_ending_session_is_waited_for_not_taken(zk, zk_hosts):
    """An instance killed while announcing (its session not yet expired) held the topics and
    push nodes, not the address: the next instance overwrote them and lost them a moment
    later, when that session expired."""
    path = registration_path("q", "s")
    dying = KazooClient(hosts=zk_hosts)
    dying.start(timeout=30)
    dying.create(f"{path}/topics", b"null", ephemeral=True)
    dying.create(f"{path}/push", b"{}", ephemeral=True)
    presence = ZooKeeperPresence(zk_hosts, "q", "s", "127.0.0.1:9", None, PushCredentials.new())
    try:
        with pytest.raises(SubscriberActive, match="no longer announced"):
            presence.start()
        assert not zk.exists(f"{path}/address")
        dying.stop()  # its session ends: its nodes go
        dying.close()
        presence._announce()
        mine = presence.client.client_id[0]
        for child in ("topics", "push", "address"):
            data, stat = zk.get(f"{path}/{child}")
            assert stat.ephemeralOwner == mine, child
        assert json.loads(zk.get(f"{path}/push")[0])["key"] == presence.push.key.hex()
        presence._announce()  # announcing again (after a retry) keeps its own nodes
        assert zk.get(f"{path}/address")[0] == b"127.0.0.1:9"
    finally:
        presence.stop()


def test_a_live_instance_s_address_is_named_in_the_refusal(zk, zk_hosts):
    path = registration_path("q", "s")
    live = KazooClient(hosts=zk_hosts)
    live.start(timeout=30)
    live.create(f"{path}/address", b"10.0.0.7:4000", ephemeral=True)
    presence = ZooKeeperPresence(zk_hosts, "q", "s", "127.0.0.1:9", None, PushCredentials.new())
    try:
        with pytest.raises(SubscriberActive, match="attached at 10.0.0.7:4000"):
            presence.start()
    finally:
        presence.stop()
        live.stop()
        live.close()
