"""ZooKeeper as an attacker meets it (issue 18.2): a real ZooKeeper, servers in
subprocesses with ``--zk-auth``, and clients with and without the credentials.

hqueue's znodes are under the servers' digest ACL; only roles that need
ZooKeeper learn where it is; and a presence written straight into ZooKeeper
with an address no server approved gets no pushes.
"""

import json
import socket
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from hqueue import HQueue, HQueueAdmin, Message, MessageListener, Subscription
from hqueue.rpc.wire import T

from ..conftest import hbase_url
from ..processes import ServerProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.hbase]  # servers over the HBase stand-in

ZK_AUTH = "hqueue:zk-secret-0123456789"
ADMIN, PRODUCER = "admin-secret-0123456789", "producer-secret-0123456789"
AUTH_FILE = f"""
[tokens.ops]
secret = "{ADMIN}"
admin = ["*"]

[tokens.feeder]
secret = "{PRODUCER}"
producer = ["*"]
"""


class Collect(MessageListener):
    def __init__(self) -> None:
        self.messages: list = []

    def on_messages(self, messages) -> None:
        self.messages.extend(messages)


@pytest.fixture
def secured(tmp_path, zk_hosts, hbase_standin):
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    server = ServerProcess(
        hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts, extra_args=("--zk-auth", ZK_AUTH, "--auth-file", str(auth))
    )
    url = f"hqueue://{ADMIN}@{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", 2)
    yield server, url, zk_hosts
    server.kill()


def anonymous(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    return client


def test_hqueues_znodes_are_closed_to_anyone_without_the_credentials(secured):
    _, url, hosts = secured
    with HQueue("orders", url) as queue, queue.create_subscriber(Subscription("audit"), [Collect()]):
        client = anonymous(hosts)
        try:
            for read in ("/subscriptions", "/ownership", "/ownership/party", "/subscriptions/orders/subscribers/audit"):
                with pytest.raises(NoAuthError):
                    client.get_children(read)
            for path in ("/ensemble", "/subscriptions/orders/subscribers/audit/presence"):
                with pytest.raises(NoAuthError):
                    client.get(path)
            with pytest.raises(NoAuthError):
                client.create("/subscriptions/orders/subscribers/evil", b"{}")
            with pytest.raises(NoAuthError):
                client.set("/subscriptions/orders/subscribers/audit", b"{}")
            with pytest.raises(NoAuthError):
                client.create("/intruder", b"")  # the chroot itself is closed
        finally:
            client.stop()
            client.close()


def test_a_subscriber_needs_no_zookeeper_access_its_server_writes_its_presence(secured, monkeypatch):
    _, url, hosts = secured
    monkeypatch.delenv("HQUEUE_ZK_AUTH", raising=False)
    with HQueue("orders", url) as queue:
        listener = Collect()
        with queue.create_subscriber(Subscription("audit"), [listener]) as subscriber:
            queue.put([Message("t", b"%d" % i) for i in range(10)])
            wait_for(lambda: len(listener.messages) == 10, 30, "10 pushes")
            assert subscriber._presence is None  # no ZooKeeper session of its own: it heartbeats a server
            admin = KazooClient(hosts=hosts, auth_data=[("digest", ZK_AUTH)])
            admin.start(timeout=30)
            try:
                data, stat = admin.get("/subscriptions/orders/subscribers/audit/presence")
                assert json.loads(data)["address"] == subscriber.address and stat.ephemeralOwner  # a server's session
                assert [
                    entry.id.id.split(":")[0]
                    for entry in admin.get_acls("/subscriptions/orders/subscribers/audit/presence")[0]
                ] == ["hqueue"]
            finally:
                admin.stop()
                admin.close()
        wait_for(lambda: not presence_exists(hosts, "audit"), 10, "the presence to go when it stops")


def presence_exists(hosts: str, name: str) -> bool:
    admin = KazooClient(hosts=hosts, auth_data=[("digest", ZK_AUTH)])
    admin.start(timeout=30)
    try:
        return admin.exists(f"/subscriptions/orders/subscribers/{name}/presence") is not None
    finally:
        admin.stop()
        admin.close()


def test_no_client_learns_where_zookeeper_is(secured):
    server, _, hosts = secured
    client = make_client(
        T.HQueueService, "127.0.0.1", server.port,
        proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(), timeout=10_000,
    )  # fmt: skip
    client.authenticate(PRODUCER)
    with pytest.raises(T.TNotAuthorized, match="consumer"):
        client.getCoordination("orders")
    client.close()
    client = make_client(
        T.HQueueService, "127.0.0.1", server.port,
        proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(), timeout=10_000,
    )  # fmt: skip
    client.authenticate(ADMIN)
    assert client.getCoordination("orders") == "server"  # subscribers heartbeat a server
    client.close()


class Trap:
    """A port that counts who connects to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def test_a_presence_written_straight_into_zookeeper_gets_no_pushes(tmp_path, zk_hosts, hbase_standin):
    """An insider who can write ZooKeeper (no ACLs here) copies a registration with
    another address: the servers push only to addresses announced through them."""
    server = ServerProcess(hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts)
    url = f"hqueue://{server.address}"
    trap = Trap()
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("orders", 2)
            admin.add_subscriber("orders", "copy")
            admin.add_subscriber("orders", "forged")
            admin.add_subscriber("orders", "locked")
        client = anonymous(zk_hosts)
        base = "/subscriptions/orders/subscribers"
        key = {"key": "00" * 32, "certificate": None}
        for child, data in (  # as an older subscriber announced itself
            ("topics", b"null"),
            ("push", json.dumps(key).encode()),
            ("address", trap.address.encode()),
        ):
            client.create(f"{base}/copy/{child}", data, ephemeral=True)
        forged = {"address": trap.address, "topics": None, "push": key, "seen": time.time() + 3600}
        client.create(f"{base}/forged/presence", json.dumps(forged).encode(), ephemeral=True)  # as a server writes it
        # a presence the servers may not read: the others go on
        client.create(
            f"{base}/locked/presence", b"{}", acl=[make_digest_acl("intruder", "x", all=True)], ephemeral=True
        )
        with HQueue("orders", url) as queue:
            listener = Collect()
            with queue.create_subscriber(Subscription("audit"), [listener]):
                queue.put([Message("t", b"%d" % i) for i in range(100)])
                wait_for(lambda: len(listener.messages) == 100, 30, "100 pushes to the real subscriber")
        assert trap.connections == 0
        assert "never announced through a server" in server.log_path.read_text()
        client.stop()
        client.close()
    finally:
        server.kill()
        trap.sock.close()


def test_tokens_with_a_zookeeper_anyone_may_write_need_zk_auth_or_zk_open_said(tmp_path, zk_hosts, hbase_standin):
    """An anonymous ZooKeeper client could write a subscription and be pushed any queue, or
    join the servers' party and be sent clients' tokens: with --auth-file, --zk needs
    --zk-auth, unless --zk-open says ZooKeeper's own network keeps everyone else out."""
    from click.testing import CliRunner

    from hqueue.cli import main

    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    storage = hbase_url(hbase_standin[0])
    runner = CliRunner()
    refused = runner.invoke(main, ["server", "--storage", storage, "--zk", zk_hosts, "--auth-file", str(auth)])
    assert refused.exit_code == 2
    assert "--auth-file with --zk needs --zk-auth" in refused.output and "--zk-open" in refused.output
    for args in (["--zk-open"], ["--zk", zk_hosts, "--zk-auth", ZK_AUTH, "--zk-open"]):
        result = runner.invoke(main, ["server", "--storage", storage, "--auth-file", str(auth), *args])
        assert result.exit_code == 2 and "--zk-open goes with --zk and without --zk-auth" in result.output
    server = ServerProcess(storage, tmp_path, zk=zk_hosts, extra_args=("--zk-open", "--auth-file", str(auth)))
    try:
        with HQueueAdmin(f"hqueue://{ADMIN}@{server.address}") as admin:
            admin.create_queue("open", 1)
            assert [q.name for q in admin.list_queues()] == ["open"]
        assert "without --zk-auth" in server.log_path.read_text()
    finally:
        server.kill()


def test_a_zookeeper_password_has_16_characters_or_more():
    """ZooKeeper's digest ACL names the password as an unsalted SHA-1: a short one is refused
    before the store is opened, and one given on the command line (seen in ps) is warned of."""
    from click.testing import CliRunner

    from hqueue.cli import main

    args = ["server", "--storage", "hbase://127.0.0.1:1", "--zk", "127.0.0.1:1"]
    result = CliRunner().invoke(main, [*args, "--zk-auth", "hq:short"])
    assert result.exit_code == 2 and "at least 16 characters, got 5" in result.output
    result = CliRunner().invoke(main, args, env={"HQUEUE_ZK_AUTH": "hq:short"})
    assert result.exit_code == 2 and "at least 16 characters, got 5" in result.output


def test_zookeeper_credentials_need_a_chroot(zk_hosts):
    """Without a chroot hqueue's nodes sat under ZooKeeper's root, whose ACL they cannot
    close: ZooKeeper checks a delete against the parent, and an anonymous client deleted
    /queues-version (every create then failed) and /ensemble (an attacker's pass). A server,
    and a subscriber writing its presence, refuse such an address before anything starts."""
    from click.testing import CliRunner

    from hqueue import InvalidArgument
    from hqueue.cli import main
    from hqueue.coordination.zookeeper import ZooKeeperCoordinator

    root = zk_hosts.split("/", 1)[0]
    args = ["server", "--storage", "hbase://127.0.0.1:1", "--zk", root]
    result = CliRunner().invoke(main, args, env={"HQUEUE_ZK_AUTH": ZK_AUTH})
    assert result.exit_code == 2 and "need a chroot in the ZooKeeper address" in result.output, result.output
    assert f"{root}/hqueue" in result.output
    with pytest.raises(InvalidArgument, match="need a chroot"):
        ZooKeeperCoordinator(root + "/", "127.0.0.1:1", auth=ZK_AUTH)
    ZooKeeperCoordinator(zk_hosts, "127.0.0.1:1", auth=ZK_AUTH).client.close()  # with one: made


def test_a_server_with_another_password_is_told_its_credentials_are_not_the_acls(tmp_path, zk_hosts, hbase_standin):
    """The documented password change, half done, left servers refused with "give the
    credentials with --zk-auth", though they had: it now says the credentials are not those
    of the ACL."""
    first = ServerProcess(hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts, extra_args=("--zk-auth", ZK_AUTH))
    first.kill()
    with pytest.raises(AssertionError) as refused:
        ServerProcess(
            hbase_url(hbase_standin[0]), tmp_path, zk=zk_hosts, name="other",
            extra_args=("--zk-auth", "hqueue:another-secret-012345"),
        )  # fmt: skip
    assert "refused access (NoAuth) with the credentials given" in str(refused.value), str(refused.value)[-800:]


def test_a_deployment_from_before_chroots_were_required_starts_with_zk_root_and_a_warning(
    tmp_path, zookeeper, hbase_standin
):
    """Refusing --zk-auth without a chroot locked out every deployment made before: --zk-root
    keeps its nodes at ZooKeeper's root, warned of, and goes only with --zk-auth."""
    from click.testing import CliRunner

    from hqueue.cli import main

    result = CliRunner().invoke(
        main, ["server", "--storage", "hbase://127.0.0.1:1", "--zk", "127.0.0.1:1", "--zk-root"]
    )
    assert result.exit_code == 2 and "--zk-root goes with --zk-auth" in result.output
    server = ServerProcess(
        hbase_url(hbase_standin[0]), tmp_path, zk=zookeeper.hosts, extra_args=("--zk-auth", ZK_AUTH, "--zk-root")
    )
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("rooted", 1)
            assert [q.name for q in admin.list_queues()] == ["rooted"]
        assert "has no chroot: hqueue's nodes under its root can be deleted" in server.log_path.read_text()
    finally:
        server.kill()
        client = KazooClient(hosts=zookeeper.hosts, auth_data=[("digest", ZK_AUTH)])
        client.start(timeout=30)
        try:
            for path in ("/ownership", "/queues-version", "/ensemble", "/subscriptions"):
                client.delete(path, recursive=True) if client.exists(path) else None
        finally:
            client.stop()
            client.close()
