"""Push subscriptions under failure: real ZooKeeper, two servers, subprocesses.

Storage is the HBase backend on tests/hbase_standin.py (a TEST STAND-IN,
not HBase), shared by both servers. Registrations and checkpoints live in
ZooKeeper; subscribers announce themselves there with their own sessions.
"""

import subprocess
import sys
import time

import pytest

from hqueue import HQueueAdmin, MessageID
from hqueue.subscriptions.manager import DEFAULT_CHECKPOINT_MESSAGES

from ..processes import ROOT, python_env, wait_for
from .test_cluster import PARTITIONS, Writer, owners

pytestmark = [pytest.mark.slow, pytest.mark.hbase]  # servers over the HBase stand-in


class SubscriberProcess:
    def __init__(self, url: str, path) -> None:
        self.url, self.path = url, path
        self.killed_ms = 0
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.subscriber_process", self.url, "orders", "audit", str(self.path)],
            cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        assert line.startswith("SUBSCRIBED"), line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def received(self) -> list[tuple[int, MessageID, int]]:
        lines = self.path.read_text().split("\n")[:-1]  # a cut last line was not acknowledged
        return [(int(p), MessageID(int(t), int(s)), int(r)) for p, t, s, r in (line.split() for line in lines)]


def setup(cluster, tmp_path, options: tuple[str, ...] = ()):
    a, b = cluster("a", *options), cluster("b", *options)
    url = f"hqueue://{a.address},{b.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", PARTITIONS)
        wait_for(lambda: set(owners(url)) == {a.address, b.address}, 30, "both servers to own partitions")
        admin.add_subscriber("orders", "audit")
    return a, b, url, SubscriberProcess(url, tmp_path / "received.txt")


def check_delivery(subscriber: SubscriberProcess, writer: Writer, most: int) -> tuple[int, int, int]:
    """Every acked message received at least once, in order per partition; at most
    ``most`` duplicates per partition (the documented bound: the messages delivered
    since the last checkpoint, which a server saves at least every --checkpoint-messages).
    Returns (received, duplicates, how long before the last kill the oldest duplicate
    was first delivered, in ms: a figure, not checked)."""
    received = subscriber.received()
    acked = set(writer.acked)
    seen: dict[tuple[int, MessageID], int] = {}
    duplicates = [0] * PARTITIONS
    oldest = 0
    for pid, message_id, at in received:
        if (pid, message_id) in seen:
            duplicates[pid] += 1
            oldest = max(oldest, subscriber.killed_ms - seen[(pid, message_id)])
        else:
            seen[(pid, message_id)] = at
    assert max(duplicates) <= most, f"duplicates per partition {duplicates}: over the bound of {most}"
    missing = acked - set(seen)
    assert not missing, f"{len(missing)} acknowledged messages never delivered"
    for pid in range(PARTITIONS):
        firsts = [m for p, m, _ in received if p == pid]
        # in order, except for a replayed tail after the kill
        assert sorted(set(firsts)) == sorted(m for (p, m) in seen if p == pid)
    return len(received), sum(duplicates), oldest


def deliver_through(cluster, tmp_path, disrupt, what: str, options: tuple[str, ...] = (), most: int = 0) -> None:
    """Write continuously, ``disrupt(a, b, subscriber)`` mid-stream, then check delivery
    (at most ``most`` duplicates per partition: the servers' --checkpoint-messages)."""
    a, b, url, subscriber = setup(cluster, tmp_path, options)
    writer = Writer(url)
    writer.start()
    wait_for(lambda: len(subscriber.received()) > 500, 30, "deliveries")
    subscriber.killed_ms = int(time.time() * 1000)
    disrupt(a, b, subscriber)
    time.sleep(2.0)
    writer.finish()
    wait_for(lambda: {(p, m) for p, m, _ in subscriber.received()} >= set(writer.acked), 30, "every acked message")
    total, duplicates, oldest = check_delivery(subscriber, writer, most or DEFAULT_CHECKPOINT_MESSAGES)
    subscriber.kill()
    print(
        f"\n{what}: {len(writer.acked)} acked, {total} received, {duplicates} duplicates "
        f"(the oldest first delivered {oldest} ms before the kill), 0 missed"
    )


def test_a_subscriber_killed_and_restarted_under_load_misses_nothing(cluster, tmp_path):
    def kill_the_subscriber(a, b, subscriber):
        subscriber.kill()
        time.sleep(0.5)
        subscriber.start()

    deliver_through(cluster, tmp_path, kill_the_subscriber, "subscriber kill -9")


def kill_a_server(a, b, subscriber):
    a.kill()
    wait_for(lambda: owners(f"hqueue://{b.address}") == [b.address] * PARTITIONS, 30, "b to own all")


def test_a_killed_servers_partitions_resume_from_the_checkpoints(cluster, tmp_path):
    # b's workers take a's partitions over from the checkpoints in ZooKeeper: nothing skipped
    deliver_through(cluster, tmp_path, kill_a_server, "server kill -9")


def test_a_server_kill_pushes_again_at_most_checkpoint_messages_per_partition(cluster, tmp_path):
    # Given servers that save a push checkpoint every 20 messages, and by time only every hour
    options = ("--checkpoint-messages", "20", "--checkpoint-interval", "3600")
    # When one is killed -9 under load, Then at most 20 messages per partition come again
    deliver_through(cluster, tmp_path, kill_a_server, "server kill -9, checkpoints every 20", options, most=20)


def test_a_second_live_instance_is_refused_in_zookeeper_mode(cluster):
    from hqueue import HQueue, HQueueAdmin, InvalidArgument, SubscriberActive, SubscriberNotFound
    from hqueue.subscriptions.listener import MessageListener, Subscription

    class Nothing(MessageListener):
        def on_messages(self, messages):
            pass

    a = cluster("a")
    url = f"hqueue://{a.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", 2)
    with HQueue("orders", url) as queue:
        with queue.create_subscriber(Subscription("s"), [Nothing()]):
            second = queue.create_subscriber(Subscription("s"), [Nothing()], takeover_timeout=1.0)
            with pytest.raises(SubscriberActive, match="is attached at .* a second instance is refused"):
                second.start()
        with queue.create_subscriber(Subscription("s"), [Nothing()], takeover_timeout=5.0) as again:
            assert again.started
            # And names are checked by every call, not by add alone (ZooKeeper paths are made of
            # them: 's/' deleted 's', 's/presence' wrote over its presence), and an unknown one
            # is SubscriberNotFound (kazoo's recursive delete of a missing node said nothing)
            with HQueueAdmin(url) as admin:
                for bad in ("s/", "s/presence", "a/b", ".."):
                    with pytest.raises(InvalidArgument, match="a subscriber name is"):
                        admin.delete_subscriber("orders", bad)
                    with pytest.raises(InvalidArgument, match="a subscriber name is"):
                        admin.set_checkpoint("orders", bad, 0, MessageID(0))
                    with pytest.raises(InvalidArgument, match="a subscriber name is"):
                        admin.describe_subscriber("orders", bad)
                with pytest.raises(SubscriberNotFound):
                    admin.delete_subscriber("orders", "nosuch")
                assert admin.list_subscribers("orders") == ["s"]
                assert admin.describe_subscriber("orders", "s")["address"] == again.address
