"""What someone wrote into ZooKeeper is not trusted (issue 18.2): a real ZooKeeper,
servers in subprocesses, and an anonymous kazoo client planting nodes.

Before a deployment's first server with ``--zk-auth`` closes the tree (a chroot
made ahead of it, or an open ZooKeeper turned closed), anyone could write there.
A "server" planted in the party was dealt partitions it never took (puts to them
timed out) and was sent clients' tokens; a lock node planted persistent held its
partition for ever; a subscriber planted with its presence was pushed the queue.
In an open ZooKeeper (``--zk-open``, or no tokens at all) a party node named
otherwise broke every put of a queue, a party node deleted by hand was never made
again, and one registration nested too deep stopped every subscriber's pushes.
"""

import json
import time

import pytest
from kazoo.client import KazooClient

from hqueue import HQueue, HQueueAdmin, Message, Subscription
from hqueue.errors import NoPartitionOwner

from ..conftest import hbase_url
from ..processes import ServerProcess, wait_for
from .test_zookeeper_acls import ADMIN, AUTH_FILE, ZK_AUTH, Collect, Trap, anonymous

pytestmark = [pytest.mark.slow, pytest.mark.hbase]  # servers over the HBase stand-in

PUSH_KEY = {"key": "00" * 32, "certificate": None}


def registration(approved: list[str]) -> bytes:
    return json.dumps(
        {"topics": None, "partitions": None, "checkpoints": {}, "epoch": 0, "dead_letter_after": None,
         "approved": approved}
    ).encode()  # fmt: skip


def credentialed(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, auth_data=[("digest", ZK_AUTH)])
    client.start(timeout=30)
    return client


def puts_land_in_every_partition(url: str, partitions: int) -> None:
    with HQueue("orders", url, timeout=5) as queue:

        def every_partition_takes_a_put() -> bool:
            try:
                for pid in range(partitions):
                    queue.put([Message("t", b"x")], partition_id=pid)
            except Exception:
                return False
            return True

        wait_for(every_partition_takes_a_put, 60, "a put to every partition")


def test_what_was_planted_before_the_servers_closed_zookeeper_is_not_trusted(tmp_path, zk_hosts, hbase_standin):
    trap = Trap()
    planter = anonymous(zk_hosts)  # its session lives on: its ephemeral nodes too
    party = "/ownership/party/"
    planter.create(party + "0" * 32 + f"-evil@{trap.address}", ephemeral=True, makepath=True)
    planter.create(party + "1" * 32 + "-ghost@127.0.0.1:1", makepath=True)  # persistent
    planter.create("/ownership/locks/orders#00001/" + "f" * 32 + "__lock__0000000000", makepath=True)
    subscribers = "/subscriptions/orders/subscribers"
    planter.create(f"{subscribers}/spy", registration([trap.address]), makepath=True)
    for child, data in (  # as an older subscriber announced itself
        ("topics", b"null"),
        ("push", json.dumps(PUSH_KEY).encode()),
        ("address", trap.address.encode()),
    ):
        planter.create(f"{subscribers}/spy/{child}", data, ephemeral=True)
    planter.create(f"{subscribers}/spy2", registration([trap.address]))
    presence = {"address": trap.address, "topics": None, "push": PUSH_KEY, "at": time.time()}
    planter.create(f"{subscribers}/spy2/presence", json.dumps(presence).encode())  # persistent

    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    server = ServerProcess(
        hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts, extra_args=("--zk-auth", ZK_AUTH, "--auth-file", str(auth))
    )
    try:
        url = f"hqueue://{ADMIN}@{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("orders", 2)
        puts_land_in_every_partition(url, 2)  # (the planted "servers" were dealt half, for ever)
        with HQueue("orders", url) as queue:
            queue.put([Message("t", b"%d" % i) for i in range(100)])
        time.sleep(3)  # (subscribers are reconciled every second)
        assert trap.connections == 0  # no client sent its token there, no push went there
        servers = credentialed(zk_hosts)
        assert [c.split("-", 1)[1] for c in servers.get_children("/ownership/party")] == [f"s@{server.address}"]
        [lock] = servers.get_children("/ownership/locks/orders#00001")
        assert not lock.startswith("f" * 32) and servers.exists(f"/ownership/locks/orders#00001/{lock}").ephemeralOwner
        assert servers.get_children(f"{subscribers}/spy") == [] and servers.get_children(f"{subscribers}/spy2") == []
        servers.stop()
        log = server.log_path.read_text()
        assert "made without the servers' credentials: deleted" in log
        assert "persistent where only sessions make nodes: deleted" in log
    finally:
        server.kill()
        planter.stop()
        trap.sock.close()


def test_an_open_zookeeper_written_by_hand_leaves_the_servers_working(tmp_path, zk_hosts, hbase_standin):
    server = ServerProcess(hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts)
    hand = anonymous(zk_hosts)
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("orders", 4)
            admin.add_subscriber("orders", "poisoned")
        puts_land_in_every_partition(url, 4)
        party = "/ownership/party"
        hand.create(f"{party}/garbage")  # no member's name: every put of the queue failed (an IndexError)
        hand.create(f"{party}/rubbish", ephemeral=True)  # a session's, no member's name: ignored
        hand.create(f"{party}/{'2' * 32}-ghost@127.0.0.1:1")  # persistent: dealt half the partitions, for ever
        wait_for(lambda: not hand.exists(f"{party}/{'2' * 32}-ghost@127.0.0.1:1"), 30, "the ghost member deleted")
        wait_for(lambda: not hand.exists(f"{party}/garbage"), 30, "the persistent misnamed node deleted")
        puts_land_in_every_partition(url, 4)
        [mine] = [c for c in hand.get_children(party) if c.endswith(f"-s@{server.address}")]
        hand.delete(f"{party}/{mine}")  # the server's own: it was never made again
        wait_for(lambda: any(c.endswith(f"-s@{server.address}") for c in hand.get_children(party)), 30, "re-made")
        puts_land_in_every_partition(url, 4)
        assert "not a server's name: ignored" in server.log_path.read_text()

        # a partition whose lock someone else holds: it has no owner (it was DeadlineExceeded, the
        # last try's, which the deadline kept from going)
        hand.create("/ownership/locks/later#00000/" + "e" * 32 + "__lock__0000000000", ephemeral=True, makepath=True)
        with HQueueAdmin(url) as admin:
            admin.create_queue("later", 1)
        with HQueue("later", url, timeout=3) as queue, pytest.raises(NoPartitionOwner):
            queue.put([Message("t", b"x")])

        # one registration nested too deep: every subscriber's pushes stopped
        hand.set("/subscriptions/orders/subscribers/poisoned", b"[" * 100_000)
        with HQueue("orders", url) as queue:
            listener = Collect()
            with queue.create_subscriber(Subscription("audit"), [listener]):
                queue.put([Message("t", b"%d" % i) for i in range(20)])
                wait_for(lambda: len(listener.messages) >= 20, 30, "pushes to the subscriber beside the poisoned one")
    finally:
        server.kill()
        hand.stop()
