"""Partition ownership (hqueue/coordination/) on a real ZooKeeper, coordinators in this process.

A partition a server keeps across a rebalance is never given back (its group
leases, timers and writer stay); a session that expires gives up everything
and its server takes its share again with a new session; a suspended
connection refuses puts at once and keeps its partitions.
"""

import threading

import pytest
from kazoo.client import KazooClient, KazooState

from hqueue.coordination.locks import MARK, PartitionLocks
from hqueue.coordination.zookeeper import ZooKeeperCoordinator, item

from ..processes import wait_for

PARTITIONS = 8
EVERY = {("orders", pid) for pid in range(PARTITIONS)}


class Member:
    """A coordinator over one queue of 8 partitions, with every ownership change it reported."""

    def __init__(self, zk_hosts: str, name: str, session_timeout: float = 2.0) -> None:
        self.coordinator = ZooKeeperCoordinator(zk_hosts, f"127.0.0.1:{name}", session_timeout=session_timeout)
        self.gained: list[tuple[str, int]] = []
        self.lost: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self.coordinator.add_listener(self._changed)
        self.coordinator.start(lambda: [("orders", PARTITIONS)])

    def _changed(self, gained: set, lost: set) -> None:
        with self._lock:
            self.gained += sorted(gained)
            self.lost += sorted(lost)

    def owned(self) -> set[tuple[str, int]]:
        return {("orders", pid) for pid in self.coordinator.owned("orders", PARTITIONS)}

    def forget_history(self) -> None:
        with self._lock:
            self.gained, self.lost = [], []


@pytest.fixture
def members(zk_hosts):
    made: list[Member] = []

    def make(name: str) -> Member:
        made.append(Member(zk_hosts, name))
        return made[-1]

    yield make
    for member in made:
        member.coordinator.stop()


def split(a: Member, b: Member) -> bool:
    return len(a.owned()) == len(b.owned()) == PARTITIONS // 2 and a.owned() | b.owned() == EVERY


def test_the_survivor_of_a_failover_keeps_its_partitions_and_only_gains(members):
    # Given two servers holding half the partitions each
    a, b = members("1"), members("2")
    wait_for(lambda: split(a, b), 30, "an even split")
    kept, moving = b.owned(), a.owned()
    b.forget_history()
    # When a's session ends (its party node and locks vanish, as when it dies)
    a.coordinator.client.stop()
    # Then b takes a's partitions and never gives back its own (kazoo's SetPartitioner gave back all 8)
    wait_for(lambda: b.owned() == EVERY, 30, "b to own every partition")
    assert b.lost == []
    assert sorted(b.gained) == sorted(moving)
    assert kept <= b.owned()


def test_a_joining_server_takes_its_share_and_the_others_keep_the_rest(members):
    a = members("1")
    wait_for(lambda: a.owned() == EVERY, 30, "a to own every partition")
    a.forget_history()
    # When a second server joins
    b = members("2")
    wait_for(lambda: split(a, b), 30, "an even split")
    # Then a gave b its share and nothing else: the four it keeps never moved
    assert a.gained == []
    assert sorted(a.lost) == sorted(b.owned())


def test_an_expired_session_gives_up_every_partition_then_takes_its_share_again(members, zookeeper):
    a, b = members("1"), members("2")
    wait_for(lambda: split(a, b), 30, "an even split")
    mine, theirs = a.owned(), b.owned()
    tokens = {pid: a.coordinator.token("orders", pid) for _, pid in mine}
    a.forget_history()
    b.forget_history()
    # When ZooKeeper expires a's session (another client closes it: the way kazoo's tests expire one)
    session_id, password = a.coordinator.client.client_id
    thief = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
    thief.start(timeout=30)
    thief.stop()
    thief.close()
    # Then a refuses at once, gives up all it had, and b takes them over
    wait_for(lambda: a.lost, 30, "a to give its partitions up")
    assert sorted(a.lost) == sorted(mine)
    # And once a is back in the party with a new session, the split is even again
    wait_for(lambda: split(a, b) and a.owned() == mine, 30, "a to take its share again")
    assert theirs <= b.owned() and not any(p in theirs for p in b.lost)  # b never gave up its own
    for _, pid in mine:  # a took each again under a newer lock: a higher fencing token
        assert a.coordinator.token("orders", pid).number > tokens[pid].number


def test_a_suspended_connection_refuses_at_once_and_keeps_its_partitions(members):
    a = members("1")
    wait_for(lambda: a.owned() == EVERY, 30, "a to own every partition")
    a.forget_history()
    coordinator = a.coordinator
    # When kazoo reports the connection suspended (the session may live on)
    coordinator._on_state(KazooState.SUSPENDED)
    # Then no partition is owned for puts, but none is given up
    assert a.owned() == set()
    assert coordinator.owner("orders", 0) is None  # dealt to it, not owned now: a client waits and asks again
    # And when the connection is back in the same session, it owns them again: nothing moved
    coordinator._on_state(KazooState.CONNECTED)
    assert a.owned() == EVERY
    assert a.lost == [] and a.gained == []
    assert coordinator.token("orders", 3) is not None
    assert item("orders", 3) in coordinator._locks.held


@pytest.fixture
def clients(zk_hosts):
    made: list[KazooClient] = []

    def make() -> KazooClient:
        client = KazooClient(hosts=zk_hosts)
        client.start(timeout=30)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()
        client.close()


def test_a_lock_node_whose_creation_answer_was_lost_is_adopted_or_removed_never_left_blocking(clients):
    one, two = PartitionLocks(clients(), "/locks"), PartitionLocks(clients(), "/locks")
    # Given a node of one's made for partition 1 whose answer never came back (the connection broke)
    one.client.create(f"/locks/q#00001/{one._prefix}{MARK}", ephemeral=True, sequence=True, makepath=True)
    # Then one's next take finds it: it holds the lock, with that node and nothing more
    assert two.take("q#00001") is False
    assert one.take("q#00001") is True
    assert one.client.get_children("/locks/q#00001") == [one.held["q#00001"][0].rsplit("/", 1)[1]]
    # Given two holding partition 2, and a lost node of one's queued behind it
    assert two.take("q#00002") is True
    one.client.create(f"/locks/q#00002/{one._prefix}{MARK}", ephemeral=True, sequence=True, makepath=True)
    # Then one's take gives way and deletes it, so two's give-back lets anyone in
    assert one.take("q#00002") is False
    assert len(one.client.get_children("/locks/q#00002")) == 1
    token = two.held["q#00002"][1]
    two.give_back("q#00002")
    assert one.take("q#00002") is True
    assert one.held["q#00002"][1] > token  # the next owner's fencing token is higher


def test_nodes_planted_in_the_party_and_the_locks_leave_every_partition_owned(zk_hosts, members):
    """A persistent node with a child in the party, or among a partition's lock nodes, could
    not be deleted (NotEmpty): it stopped the party's read, or the taking of every partition
    after it, for good (the server owned nothing)."""
    hand = KazooClient(hosts=zk_hosts)
    hand.start(timeout=30)
    hand.create(f"/ownership/party/{'3' * 32}-ghost@127.0.0.1:1/child", makepath=True)
    hand.create(f"/ownership/locks/{item('orders', 0)}/{'f' * 32}{MARK}0000000000/child", makepath=True)
    a = members("9001")
    wait_for(lambda: a.owned() == EVERY, 30, "every partition owned")
    assert hand.get_children("/ownership/party") == [
        c for c in hand.get_children("/ownership/party") if "ghost" not in c
    ]
    hand.stop()


def test_a_failed_read_of_the_party_is_read_again(members, monkeypatch):
    """One ZooKeeper error while the loop read the party's nodes lost the watch's list: a
    server that never saw itself in the party never took a partition."""
    from kazoo.exceptions import ConnectionLoss

    from hqueue.coordination.znodes import SessionNodes

    real, calls = SessionNodes.check, []

    def once_lost(self, path):
        calls.append(path)
        if len(calls) == 1:
            raise ConnectionLoss()
        return real(self, path)

    monkeypatch.setattr(SessionNodes, "check", once_lost)
    a = members("9001")
    wait_for(lambda: a.owned() == EVERY, 30, "every partition owned")
    assert len(calls) >= 2


def test_a_server_without_the_credential_gives_up_its_partitions_once_the_tree_is_closed(zk_hosts):
    """The first server started with --zk-auth deletes the nodes made without it (a server
    still running without it among them): that server, locked out, holds nothing more (it
    went on owning partitions whose locks another server then took)."""
    open_one = ZooKeeperCoordinator(zk_hosts, "127.0.0.1:9001", session_timeout=2.0)
    open_one.start(lambda: [("orders", PARTITIONS)])
    closed_one = None
    try:
        wait_for(lambda: len(open_one.owned("orders", PARTITIONS)) == PARTITIONS, 30, "every partition owned")
        closed_one = ZooKeeperCoordinator(
            zk_hosts, "127.0.0.1:9002", session_timeout=2.0, auth="hqueue:zk-secret-0123456789"
        )
        closed_one.start(lambda: [("orders", PARTITIONS)])
        wait_for(lambda: open_one.owned("orders", PARTITIONS) == [], 30, "the locked-out server to hold nothing")
        wait_for(lambda: len(closed_one.owned("orders", PARTITIONS)) == PARTITIONS, 30, "the other to own all")
    finally:
        open_one.stop()
        if closed_one is not None:
            closed_one.stop()


def test_the_lease_is_a_third_of_the_session_zookeeper_granted(zk_hosts, caplog):
    """ZooKeeper bounds a session's timeout to 2-20 of its ticks (4 s at most for the tests'
    200 ms tick), silently: a --session-timeout of 30 gave a 10 s lease over a 4 s session
    (an attacker's pass). The lease follows what was granted, and the server says so."""
    member = Member(zk_hosts, "9100", session_timeout=30.0)
    try:
        assert member.coordinator.lease_seconds == pytest.approx(4.0 / 3, abs=0.05)
        assert "ZooKeeper granted a session of 4.0s where 30.0s was asked" in caplog.text
        wait_for(lambda: member.owned() == EVERY, 20, "it to own every partition")
    finally:
        member.coordinator.stop()
    asked = Member(zk_hosts, "9101", session_timeout=2.0)  # within the bounds: as asked, nothing said
    try:
        assert asked.coordinator.lease_seconds == pytest.approx(2.0 / 3, abs=0.05)
    finally:
        asked.coordinator.stop()


def test_a_first_start_under_a_new_chroot_warns_of_nothing(zk_hosts, recwarn):
    """kazoo warned "No chroot path exists" at every deployment's first start: hqueue makes it."""
    member = Member(zk_hosts + "/not_made_yet", "9102")
    try:
        wait_for(lambda: member.owned() == EVERY, 20, "it to own every partition")
    finally:
        member.coordinator.stop()
    assert not [w for w in recwarn if "chroot" in str(w.message)], [str(w.message) for w in recwarn]
