"""A subscriber's presence in ZooKeeper (real ZooKeeper, a chroot per test): the
ephemeral nodes another session holds are never taken over, since they would go
when that session ends and leave this instance half announced."""

import json

import pytest
from kazoo.client import KazooClient

from hqueue.auth import PushCredentials
from hqueue.errors import SubscriberActive
from hqueue.subscriptions.registry import Registration
from hqueue.subscriptions.zk_registry import ZooKeeperPresence, ZooKeeperRegistry, presence_path, registration_path

from ..processes import wait_for


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


# -- presence written by the servers (the subscriber heartbeats one of them) ---------------------


@pytest.fixture
def two_servers(zk_hosts):
    """Two servers' registries, each with its own ZooKeeper session, and one registration."""
    clients = [KazooClient(hosts=zk_hosts) for _ in range(2)]
    for client in clients:
        client.start(timeout=30)
    registries = [ZooKeeperRegistry(client, zk_hosts, presence_timeout=1.0) for client in clients]
    registries[0].create(Registration("q", "s", None, None))
    yield registries
    for client in clients:
        client.stop()
        client.close()


def test_a_presence_written_by_one_server_is_seen_and_kept_up_by_any(two_servers):
    a, b = two_servers
    push = PushCredentials.new()
    a.heartbeat("q", "s", "127.0.0.1:9", None, push)
    # every server sees it, once its watch of the registration does (a registration its watch
    # shows away is not read when reconciling: the watch's news makes the server reconcile)
    wait_for(lambda: [r.address for r in b.attached()] == ["127.0.0.1:9"], 5, "b to see the presence")
    assert b.load("q", "s").approved == ("127.0.0.1:9",)  # the address a server checked
    _, first = a.client.get(presence_path("q", "s"))
    assert first.ephemeralOwner == a.client.client_id[0]
    b.heartbeat("q", "s", "127.0.0.1:9", None, push)  # its heartbeats reach b now: b keeps it up
    _, stat = b.client.get(presence_path("q", "s"))
    assert stat.ephemeralOwner == first.ephemeralOwner and stat.mzxid > first.mzxid  # no delete, no create
    # Another instance (another address, another key) is refused while this one is live
    with pytest.raises(SubscriberActive, match="attached at 127.0.0.1:9"):
        a.heartbeat("q", "s", "127.0.0.1:10", None, PushCredentials.new())
    assert b.load("q", "s").approved == ("127.0.0.1:9",)  # a refused heartbeat wrote nothing
    # When the heartbeats stop, each server sees the node unchanged for presence_timeout by its
    # own clock (no wall clocks compared): gone for every server, and deleted
    wait_for(lambda: a.attached() == [] and b.attached() == [], 5, "the presence to lapse")
    wait_for(lambda: not b.client.exists(presence_path("q", "s")), 5, "the lapsed presence to be deleted")
    a.heartbeat("q", "s", "127.0.0.1:10", None, PushCredentials.new())  # a new instance is let in
    wait_for(lambda: [r.address for r in b.attached()] == ["127.0.0.1:10"], 5, "b to see the new instance")
    a.leave("q", "s")
    assert b.attached() == []


def test_a_presence_goes_with_its_server_s_session(two_servers, zk_hosts):
    a, b = two_servers
    a.heartbeat("q", "s", "127.0.0.1:9", None, PushCredentials.new())
    a.client.stop()  # the server that held it is gone
    assert b.attached() == []


def test_a_malformed_presence_is_never_pushed_to_and_is_deleted(two_servers):
    a, b = two_servers
    for data in (b"{", b"[]", b'{"address": 1}', json.dumps({"address": "127.0.0.1:9", "push": None}).encode()):
        a.client.create(presence_path("q", "s"), data, ephemeral=True)

        def deleted_and_never_attached() -> bool:
            # (b reads the node once its watch of the registration sees it: until then it is
            # away for b, and b's reconcile passes deletes it then)
            assert b.attached() == []
            return not a.client.exists(presence_path("q", "s"))

        wait_for(deleted_and_never_attached, 5, "the malformed presence to be deleted")


def test_a_subscription_s_topics_are_bounded_before_they_reach_zookeeper(two_servers):
    from hqueue.errors import InvalidArgument
    from hqueue.subscriptions.service import MAX_TOPICS_BYTES, check_topics

    check_topics(frozenset({b"t"}))
    with pytest.raises(InvalidArgument, match="at most"):  # ZooKeeper cut a server's session at 1 MB
        check_topics(frozenset(b"%05d" % i + b"x" * 500 for i in range(2_500)))
    with pytest.raises(InvalidArgument, match="at most"):
        check_topics(frozenset({b"x" * (MAX_TOPICS_BYTES + 1)}))


def test_a_presence_made_and_ended_in_a_loop_is_slowed_to_one_change_a_second(two_servers):
    a, _ = two_servers
    a.heartbeat("q", "s", "127.0.0.1:9", None, PushCredentials.new())
    a.leave("q", "s")
    with pytest.raises(SubscriberActive, match="changed less than"):  # every server would reconcile on each
        a.heartbeat("q", "s", "127.0.0.1:10", None, PushCredentials.new())
    wait_for(lambda: _let_in(a), 5, "the next presence to be let in")


def _let_in(registry: ZooKeeperRegistry, push: PushCredentials | None = None) -> bool:
    try:
        registry.heartbeat("q", "s", "127.0.0.1:10", None, push or PushCredentials.new())
        return True
    except SubscriberActive:
        return False


def test_an_instance_replaced_since_does_not_end_the_new_one_s_presence(two_servers):
    a, b = two_servers
    old, new = PushCredentials.new(), PushCredentials.new()
    a.heartbeat("q", "s", "127.0.0.1:9", None, old)
    a.leave("q", "s", old)  # it stopped (gone at once)
    assert b.attached() == []
    wait_for(lambda: _let_in(a, new), 5, "the new instance to be let in")
    a.leave("q", "s", old)  # the old one says goodbye again, late
    wait_for(lambda: [r.push for r in b.attached()] == [new], 5, "b to see the new one stay")
    a.leave("q", "s", new)
    assert b.attached() == []


def test_an_instance_is_its_push_key_its_address_may_change(two_servers):
    """A rolling upgrade: an older server wrote the presence under the subscriber's host name,
    an upgraded one checks the same heartbeat and keeps the host's IP. The upgraded servers
    refused the subscriber as a second instance until the old presence lapsed (and, while an
    old server still took some heartbeats, for good). Its key is the instance."""
    a, b = two_servers
    push = PushCredentials.new()
    a.heartbeat("q", "s", "localhost:9", None, push)  # as an older server wrote it
    b.heartbeat("q", "s", "127.0.0.1:9", None, push)  # the same instance, through an upgraded server
    wait_for(lambda: [r.address for r in a.attached()] == ["127.0.0.1:9"], 5, "a to see b's write")
    assert "127.0.0.1:9" in b.load("q", "s").approved
    with pytest.raises(SubscriberActive, match="changed less than"):  # a move a second, at most
        b.heartbeat("q", "s", "127.0.0.1:11", None, push)
    with pytest.raises(SubscriberActive, match="attached at 127.0.0.1:9"):  # another key: another instance
        b.heartbeat("q", "s", "127.0.0.1:9", None, PushCredentials.new())


def test_in_one_process_too_an_instance_is_its_push_key(tmp_path, monkeypatch):
    from hqueue.storage import open_storage
    from hqueue.subscriptions import registry, store_registry

    monkeypatch.setattr(registry, "PRESENCE_CHANGE_INTERVAL", 0.2)
    storage = open_storage(f"local://{tmp_path}/data")
    try:
        registry = store_registry.StoreRegistry(storage)
        registry.create(Registration("q", "s", None, None))
        push = PushCredentials.new()
        registry.heartbeat("q", "s", "localhost:9", None, push)
        with pytest.raises(SubscriberActive, match="changed less than"):  # a change at most every 0.2 s here
            registry.heartbeat("q", "s", "127.0.0.1:9", None, push)
        wait_for(lambda: _moved(registry, push), 5, "the move to be let in")
        assert [r.address for r in registry.attached()] == ["127.0.0.1:9"]
        with pytest.raises(SubscriberActive, match="attached at 127.0.0.1:9"):
            registry.heartbeat("q", "s", "127.0.0.1:9", None, PushCredentials.new())
    finally:
        storage.close()


def _moved(registry, push: PushCredentials) -> bool:
    try:
        registry.heartbeat("q", "s", "127.0.0.1:9", None, push)
        return True
    except SubscriberActive:
        return False


def test_a_registration_deleted_and_made_again_between_two_reads_is_still_watched(zk, zk_hosts):
    """The registry skips, when reconciling, a registration its watch shows without a
    presence; a watch ends unseen when it meets its node deleted, and one made again before
    its parent's read kept the old children: the subscriber was never pushed to again."""
    from kazoo.exceptions import NoNodeError

    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=30)
    registry = ZooKeeperRegistry(client, zk_hosts)
    path = registration_path("q", "s")
    wait_for(lambda: ("q", "s") in registry._children, 10, "the registration watched")
    real = client.get_children

    def made_again_meanwhile(watched, *args, **kwargs):
        try:
            return real(watched, *args, **kwargs)
        except NoNodeError:
            if watched == path:  # the registration's own watch reads first: made again before its parent's
                zk.create(path, Registration("q", "s").to_json())
            raise

    client.get_children = made_again_meanwhile
    zk.delete(path)
    wait_for(lambda: zk.exists(path), 10, "the registration made again")
    client.get_children = real
    push = PushCredentials.new()
    registry.heartbeat("q", "s", "127.0.0.1:9", None, push)
    wait_for(lambda: [r.name for r in registry.attached()] == ["s"], 10, "the subscriber attached")
    client.stop()
    client.close()
