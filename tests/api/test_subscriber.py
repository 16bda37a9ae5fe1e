"""Push subscriptions against one server on loopback (registrations in its store)."""

import socket
import threading
import time

import pytest

from hqueue import (
    HQueue,
    HQueueAdmin,
    InvalidArgument,
    InvalidPartition,
    Message,
    MessageID,
    MessageListener,
    QueueNotFound,
    SubscriberActive,
    SubscriberNotFound,
    Subscription,
)
from hqueue.auth import PushPolicy
from hqueue.errors import NotAuthorized
from hqueue.server import HQueueServer

from ..processes import wait_for


class Collect(MessageListener):
    """Records every batch; fails the first ``fail`` batches it sees."""

    def __init__(self, fail: int = 0) -> None:
        self.messages, self.fail, self.failures, self.lock = [], fail, 0, threading.Lock()

    def on_messages(self, messages):
        with self.lock:
            if self.failures < self.fail:
                self.failures += 1
                raise RuntimeError("listener says no (test)")
            self.messages.extend(messages)

    def values(self):
        return [m.value for m in self.messages]

    def by_partition(self):
        out = {}
        for m in self.messages:
            out.setdefault(m.partition_id, []).append(m)
        return out


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("events", 8)
    yield server
    server.stop()


@pytest.fixture
def url(server):
    return f"hqueue://{server.address}"


def settled(server) -> None:
    """Wait until the server would deliver nothing more (instead of sleeping)."""
    wait_for(server.subscriptions.settled, 10, "delivery to settle")


@pytest.fixture
def queue(url):
    with HQueue("events", url) as queue:
        yield queue


def put_spread(queue, count: int, topic: str = "t", partitions: int = 8) -> list[MessageID]:
    ids = []
    for i in range(count):
        ids += queue.put(Message(topic, b"%d" % i), partition_id=i % partitions)
    return ids


def test_messages_reach_a_subscriber_exactly_once_in_order_per_partition(queue, server):
    listener = Collect()
    with queue.create_subscriber(Subscription("s1"), [listener]):
        ids = put_spread(queue, 800)
        wait_for(lambda: len(listener.messages) >= 800, 30, "800 deliveries")
        settled(server)  # anything extra would have come by now
    assert sorted(m.id for m in listener.messages) == sorted(ids)  # each once
    for pid, messages in listener.by_partition().items():
        assert [m.id for m in messages] == sorted(m.id for m in messages), f"partition {pid} out of order"


def test_listeners_are_called_in_order_with_each_batch(queue):
    calls = []

    class Named(MessageListener):
        def __init__(self, name):
            self.name = name

        def on_messages(self, messages):
            calls.append((self.name, len(messages)))

    with queue.create_subscriber(Subscription("s1"), [Named("first"), Named("second")]):
        queue.put([Message("t", b"x")] * 5, partition_id=3)
        wait_for(lambda: len(calls) >= 2, 10, "both listeners")
    assert calls[:2] == [("first", 5), ("second", 5)]


def test_a_failing_listener_gets_the_same_batches_again_nothing_skipped(queue):
    listener = Collect(fail=3)
    with queue.create_subscriber(Subscription("s1"), [listener]):
        ids = queue.put([Message("t", b"%d" % i) for i in range(50)], partition_id=2)
        ids += queue.put([Message("t", b"%d" % i) for i in range(50, 60)], partition_id=2)
        wait_for(lambda: len(listener.messages) >= 60, 30, "redelivery")
    assert listener.failures == 3
    assert [m.id for m in listener.messages] == ids


def test_topic_filter_and_partition_subset(queue, server):
    listener = Collect()
    subscription = Subscription("s1", topics={"wanted"}).add_partitions({(1, None), (2, None)})
    with queue.create_subscriber(subscription, [listener]):
        for pid in range(4):
            queue.put([Message("wanted", b"w%d" % pid), Message("other", b"o%d" % pid)], partition_id=pid)
        wait_for(lambda: len(listener.messages) >= 2, 10, "2 deliveries")
        settled(server)
    assert sorted(listener.values()) == [b"w1", b"w2"]


def test_explicit_start_ids_replay_history(queue):
    old = queue.put([Message("t", b"old%d" % i) for i in range(5)], partition_id=4)
    listener = Collect()
    with queue.create_subscriber(Subscription("s1").add_partitions({4: old[2]}), [listener]):
        wait_for(lambda: len(listener.messages) >= 3, 10, "replayed messages")
    assert listener.values() == [b"old2", b"old3", b"old4"]


def test_add_subscriber_before_start_misses_nothing_written_after(queue, url, server):
    queue.put(Message("t", b"before"), partition_id=0)
    with HQueueAdmin(url) as admin:
        admin.add_subscriber("events", "late")
        assert admin.list_subscribers("events") == ["late"]
    queue.put(Message("t", b"after add"), partition_id=0)
    listener = Collect()
    with queue.create_subscriber(Subscription("late"), [listener]):
        wait_for(lambda: listener.messages, 10, "the message written after add_subscriber")
        settled(server)
    assert listener.values() == [b"after add"]


def test_a_stopped_subscriber_resumes_from_its_checkpoint(queue, url):
    listener = Collect()
    subscriber = queue.create_subscriber(Subscription("s1"), [listener]).start()
    queue.put(Message("t", b"one"), partition_id=5)
    wait_for(lambda: listener.messages, 10, "first delivery")
    subscriber.stop("test")
    queue.put(Message("t", b"while away"), partition_id=5)
    with HQueueAdmin(url) as admin:
        # the address goes at once; the last checkpoint is saved as the worker stops
        def away_with_one_waiting():
            described = admin.describe_subscriber("events", "s1")
            return described["address"] is None and described["lag_messages"][5] == 1

        wait_for(away_with_one_waiting, 10, "away, with one message waiting")
    with queue.create_subscriber(Subscription("s1"), [listener]):
        wait_for(lambda: len(listener.messages) >= 2, 10, "resume")
    assert listener.values() == [b"one", b"while away"]


def test_set_checkpoint_replays_from_a_time(queue, url):
    listener = Collect()
    with queue.create_subscriber(Subscription("s1"), [listener]):
        first = queue.put([Message("t", b"a"), Message("t", b"b")], partition_id=6)
        wait_for(lambda: len(listener.messages) >= 2, 10, "first pass")
        with HQueueAdmin(url) as admin:
            admin.set_checkpoint("events", "s1", 6, first[0])
            wait_for(lambda: len(listener.messages) >= 4, 10, "replay")
            # saved within the checkpoint interval (1 s)
            wait_for(lambda: admin.describe_subscriber("events", "s1")["checkpoints"][6] > first[1], 10, "a save")
    assert listener.values()[:4] == [b"a", b"b", b"a", b"b"]


def test_bad_subscriber_input_is_rejected_clearly(queue, url, tmp_path):
    for bad in ("", ".", "..", "a/b", "a\x00b", "\udc80", "x" * 201):
        with pytest.raises(ValueError, match="a subscriber name is 1-200 of"):
            Subscription(bad)
    with HQueueAdmin(url) as admin:
        for bad in ("..", "a\x00b", "-s"):  # the same rule on every store (ZooKeeper refused '..' only)
            with pytest.raises(InvalidArgument, match="a subscriber name is 1-200 of"):
                admin.add_subscriber("events", bad)
    with pytest.raises(TypeError, match="'topics'"):
        Subscription("s", topics="one")
    with pytest.raises(TypeError, match="'topics' must be a collection of topics, not int"):
        Subscription("s", topics=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="'dead_letter_after'"):
        Subscription("s", dead_letter_after=True)
    assert Subscription("s").add_partitions([0, 1]).partitions == {0: None, 1: None}  # ids, as add_subscriber takes
    assert Subscription("s").add_partitions({0: 5}).partitions == {0: MessageID(5)}  # ms too, as add_subscriber
    with pytest.raises(TypeError, match="must be a MessageID, datetime or int"):
        Subscription("s").add_partitions({0: "x"})  # type: ignore[dict-item]
    for bad in ({True: None}, [(-1, None)]):
        with pytest.raises(InvalidArgument, match="a partition id must be an int >= 0"):
            Subscription("s").add_partitions(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a partition must be an id or a"):
        Subscription("s").add_partitions(["0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="listeners"):
        queue.create_subscriber(Subscription("s"), [print])
    with HQueueAdmin(url) as admin:
        with pytest.raises(SubscriberNotFound):
            admin.describe_subscriber("events", "ghost")
        with pytest.raises(SubscriberNotFound):
            admin.delete_subscriber("events", "ghost")
        admin.add_subscriber("events", "s2", partitions=[1])
        admin.delete_subscriber("events", "s2")
        assert admin.list_subscribers("events") == []


@pytest.mark.parametrize("where", ["embedded", "server"])
def test_subscriber_admin_arguments_are_checked_alike_on_every_store(url, tmp_path, where):
    """Through a server, set_checkpoint(partition=-1) replayed every partition, partitions={0: 5}
    was a bare AttributeError and partitions=['0'] a StorageError (a decode error)."""
    if where == "embedded":
        url = f"local://{tmp_path}/embedded"
        with HQueueAdmin(url) as admin:
            admin.create_queue("events", 8)
    with HQueueAdmin(url) as admin:
        admin.add_subscriber("events", "s", partitions={0: 5, 1: MessageID(7)})  # ms, as everywhere
        assert admin.describe_subscriber("events", "s")["checkpoints"][0] == MessageID(5)
        with pytest.raises(TypeError, match="must be a MessageID, datetime or int"):
            admin.add_subscriber("events", "s2", partitions={0: "x"})
        with pytest.raises(TypeError, match="a partition id in 'partitions' must be an int, not str"):
            admin.add_subscriber("events", "s2", partitions=["0"])
        with pytest.raises(InvalidPartition):
            admin.add_subscriber("events", "s2", partitions=[40000])
        with pytest.raises(InvalidPartition):
            admin.set_checkpoint("events", "s", -1, MessageID(0))
        with pytest.raises(InvalidArgument, match="does not take partition 3"):  # (it was stored, never read)
            admin.set_checkpoint("events", "s", 3, MessageID(0))
        assert 3 not in admin.describe_subscriber("events", "s")["checkpoints"]
        assert "s2" not in admin.list_subscribers("events")
        with pytest.raises(QueueNotFound):  # (it said SubscriberNotFound)
            admin.describe_subscriber("nowhere", "s")


def test_closing_the_queue_stops_its_subscribers(tmp_path):
    """A subscriber left started when its queue handle closed heartbeat through the closed store:
    a traceback a second, 'started' for ever."""
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        admin.create_queue("events", 1)
    queue = HQueue("events", f"local://{tmp_path}/data")
    subscriber = queue.create_subscriber(Subscription("s"), [Collect()]).start()
    queue.close()
    assert not subscriber.started
    assert not [t for t in threading.enumerate() if "_heartbeat" in t.name or t.name == "hqueue-subscriber-s"]


def test_a_vanished_subscriber_is_paused_and_nothing_is_lost(queue):
    # Given a subscriber whose process dies without saying goodbye
    listener = Collect()
    subscriber = queue.create_subscriber(Subscription("s1"), [listener]).start()
    subscriber._stop_heartbeat.set()  # as if killed: no more heartbeats, no leave
    subscriber._server.close()  # and its port is gone
    # When messages keep coming
    ids = put_spread(queue, 40)
    time.sleep(4)  # past the 3 s presence timeout
    # Then a new instance gets every one of them
    with queue.create_subscriber(Subscription("s1"), [listener]):
        wait_for(lambda: {m.id for m in listener.messages} >= set(ids), 20, "all messages")


@pytest.mark.slow
def test_a_hundred_subscribers_on_one_queue_each_get_everything(url):
    """Scale: 100 subscribers x 2 partitions = 200 workers on one server."""
    with HQueueAdmin(url) as admin:
        admin.create_queue("fanout", 2)
    with HQueue("fanout", url) as queue:
        listeners = [Collect() for _ in range(100)]
        subscribers = [
            queue.create_subscriber(Subscription(f"s{i:03d}"), [listener]).start()
            for i, listener in enumerate(listeners)
        ]
        try:
            ids = [
                i for pid in (0, 1) for i in queue.put([Message("t", b"%d" % n) for n in range(50)], partition_id=pid)
            ]
            wait_for(lambda: all(len(listener.messages) >= 100 for listener in listeners), 120, "100 x 100 deliveries")
            for listener in listeners:
                assert sorted(m.id for m in listener.messages) == sorted(ids)
        finally:
            for subscriber in subscribers:
                subscriber.stop("test done")


def test_a_subscriber_on_a_thousand_partitions_costs_no_thread_of_its_own(url):
    import threading

    before = {t.name for t in threading.enumerate() if t.name.startswith("hqueue-push")}
    with HQueueAdmin(url) as admin:
        admin.create_queue("wide", 1000)
    with HQueue("wide", url) as queue:
        listener = Collect()
        with queue.create_subscriber(Subscription("s"), [listener]):
            ids = [i for pid in range(0, 1000, 50) for i in queue.put(Message("t", b"%d" % pid), partition_id=pid)]
            wait_for(lambda: len(listener.messages) >= len(ids), 60, "delivery from 20 partitions")
            assert sorted(m.id for m in listener.messages) == sorted(ids)
            push = {t.name for t in threading.enumerate() if t.name.startswith("hqueue-push")}
            assert push == before  # the server's push pool, started with it


def test_a_second_live_instance_of_a_subscriber_is_refused(queue):
    with queue.create_subscriber(Subscription("s"), [Collect()]) as first:
        second = queue.create_subscriber(Subscription("s"), [Collect()], takeover_timeout=1.0)
        with pytest.raises(SubscriberActive, match=f"attached at {first.address}"):
            second.start()
        assert not second.started
    # Once the first leaves, a new instance takes the name at once
    with queue.create_subscriber(Subscription("s"), [Collect()], takeover_timeout=1.0) as third:
        assert third.started


@pytest.mark.parametrize("store", ["local", "memory"])
def test_push_subscriptions_run_in_process_on_an_embedded_store(tmp_path, store):
    """No server: the process that opened the store delivers, with the same checkpoints."""
    url = f"local://{tmp_path}/data" if store == "local" else f"memory://subs-{tmp_path.name}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("local", 4)
        admin.add_subscriber("local", "early")  # registered now: nothing after this is missed
        with HQueue("local", url) as queue:
            ids = put_spread(queue, 40, partitions=4)
            listener = Collect()
            with queue.create_subscriber(Subscription("early"), [listener]):
                wait_for(lambda: len(listener.messages) >= 40, 20, "in-process delivery")
                more = put_spread(queue, 8, partitions=4)
                wait_for(lambda: len(listener.messages) >= 48, 20, "delivery of later puts")
            assert sorted(m.id for m in listener.messages) == sorted(ids + more)
            # Leaving saves every checkpoint (a moment later: the workers stop on their own thread)
            lag = lambda: set(admin.describe_subscriber("local", "early")["lag_messages"].values())  # noqa: E731
            wait_for(lambda: lag() == {0}, 10, "the checkpoints to be saved")
            assert admin.list_subscribers("local") == ["early"]
            second = Collect()
            with queue.create_subscriber(Subscription("early"), [second]):
                time.sleep(0.3)  # the checkpoints hold: nothing comes twice
            assert second.messages == []


def test_a_listener_that_never_returns_holds_up_no_stop(tmp_path):
    """A blocking listener that never returned held each partition's push until its stop
    gave up on it, one after another: closing the store took 50 s (an attacker pass)."""
    url = f"local://{tmp_path}/data"
    release, entered = threading.Event(), threading.Event()

    class Stuck(MessageListener):
        def on_messages(self, messages):
            entered.set()
            release.wait(60)

    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 4)
    queue = HQueue("q", url)
    try:
        subscriber = queue.create_subscriber(Subscription("s"), [Stuck()]).start()
        queue.put([Message("t", b"x", partition_id=p) for p in range(4)])
        assert entered.wait(30)
        closing = threading.Thread(target=lambda: (subscriber.stop(), queue.close()))
        closing.start()
        closing.join(8)  # (the push under way is cut short: its batch comes again)
        assert not closing.is_alive()
    finally:
        release.set()
        queue.close()


class RefusePoison(MessageListener):
    """Takes every message but b"poison", which it refuses every time."""

    def __init__(self):
        self.taken, self.refusals, self.lock = [], 0, threading.Lock()

    def on_messages(self, messages):
        with self.lock:
            if any(m.value == b"poison" for m in messages):
                self.refusals += 1
                raise ValueError("poison")
            self.taken += messages


@pytest.mark.parametrize("where", ["server", "embedded"])
def test_a_poison_message_goes_to_the_dead_letter_queue_and_the_rest_flows(tmp_path, url, where):
    url = url if where == "server" else f"local://{tmp_path}/embedded"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", 2)
        with HQueue("orders", url) as queue:
            listener = RefusePoison()
            subscription = Subscription("s", dead_letter_after=3)
            with queue.create_subscriber(subscription, [listener]):
                values = [b"a", b"b", b"poison", b"c", b"d"]
                ids = queue.put([Message("t", v) for v in values], partition_id=1)  # one batch
                wait_for(lambda: len(listener.taken) == 4, 30, "the good messages around the poison")
            assert [m.value for m in listener.taken] == [b"a", b"b", b"c", b"d"]  # in order, the poison skipped
            assert [m.id for m in listener.taken] == [ids[0], ids[1], ids[3], ids[4]]
            # 3 refusals of the whole batch, then 3 of the poison alone
            assert listener.refusals == 6
        with HQueue("orders.dlq", url) as dlq:  # an ordinary queue, same partition, topic and value
            (dead,) = list(dlq.scan())
            assert (dead.partition_id, dead.topic, dead.value) == (1, b"t", b"poison")
        if where == "embedded":  # its note is read where the store is open
            ((_, _, note),) = admin.dead_letters("orders")
            assert note == (1, ids[2], "subscriber s", 3)
        # Replay puts a copy back on the queue, in its partition, with a new ID
        assert admin.replay_dead_letters("orders") == 1
        with HQueue("orders", url) as queue:
            replayed = list(queue.scan(partition_id=1))[-1]
            assert (replayed.value, replayed.id > ids[-1]) == (b"poison", True)


def test_dead_letter_after_is_checked():
    with pytest.raises(InvalidArgument):
        Subscription("s", dead_letter_after=0)


def test_a_host_name_is_resolved_once_when_announced_never_at_push_time(queue, server, monkeypatch):
    """DNS rebinding: a subscriber advertises a name that resolves to its own host when it
    announces itself, and elsewhere afterwards. The server keeps and pushes to the IP it
    checked: a push never looks the name up."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host, *args, **kwargs):
        if host == "rebind.test":  # the announcement's lookup finds this host; every later one, another
            lookups.append("127.0.0.1" if not lookups else "10.255.255.1")
            return real(lookups[-1], *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = Collect()
    with queue.create_subscriber(Subscription("s1"), [listener], port=port, advertise=f"rebind.test:{port}"):
        put_spread(queue, 40)
        wait_for(lambda: len(listener.messages) >= 40, 30, "40 pushes to the IP that was checked")
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            assert admin.describe_subscriber("events", "s1")["address"] == f"127.0.0.1:{port}"  # the IP checked


def test_push_targets_are_the_ips_that_were_checked():
    policy = PushPolicy()
    assert policy.check("localhost:9000", "127.0.0.1") == "127.0.0.1:9000"  # a name: pinned to the peer
    assert policy.check("[::1]:9000", "::1") == "[::1]:9000"
    assert policy.check_push("127.0.0.1:9000", ["127.0.0.1:9000"]) == ("127.0.0.1", 9000)
    with pytest.raises(NotAuthorized, match="host name"):  # approved by name (an older server): not looked up
        policy.check_push("localhost:9000", ["localhost:9000"])
    with pytest.raises(NotAuthorized, match="never announced"):
        policy.check_push("127.0.0.2:9000", ["127.0.0.1:9000"])
    assert policy.check("[::ffff:127.0.0.1]:9000", "::ffff:127.0.0.1") == "127.0.0.1:9000"  # a dual-stack peer
    allowed = PushPolicy(["127.0.0.0/8"])  # in the allow networks: kept as announced, looked up once a push
    assert allowed.check("localhost:9000", None) == "localhost:9000"
    assert allowed.check_push("localhost:9000", []) == ("127.0.0.1", 9000)
    with pytest.raises(NotAuthorized):
        PushPolicy(["10.0.0.0/8"]).check_push("localhost:9000", ["localhost:9000"])
    assert policy.check("0.0.0.0:9000", "10.1.2.3") == "10.1.2.3:9000"  # every interface: the announcing host
    assert policy.check(":::9000", "::ffff:10.1.2.3") == "10.1.2.3:9000"
    assert policy.check("[::]:9000", "2001:db8::7") == "[2001:db8::7]:9000"


def test_a_subscriber_listening_on_every_interface_is_pushed_to(queue, server):
    """A subscriber bound to 0.0.0.0 (a container's usual bind) announced 0.0.0.0:port,
    which is nobody's address: the server refused it as not on the announcing host."""
    listener = Collect()
    with queue.create_subscriber(Subscription("everywhere"), [listener], host="0.0.0.0") as subscriber:
        assert subscriber.address.startswith("0.0.0.0:")
        put_spread(queue, 20)
        wait_for(lambda: len(listener.messages) >= 20, 30, "20 pushes to the announcing host")
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            described = admin.describe_subscriber("events", "everywhere")["address"]
    assert described == f"127.0.0.1:{subscriber.address.rpartition(':')[2]}"  # the peer's IP, the port announced


def test_a_subscriber_on_ipv6_is_pushed_to(tmp_path):
    """An IPv6 push address was checked and kept, and every push to it failed: the push
    socket was made for IPv4 whatever the address."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, push_policy=PushPolicy(["::1/128"])).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("events", 2)
        with HQueue("events", url) as queue:
            listener = Collect()
            with queue.create_subscriber(Subscription("v6"), [listener], host="::1"):
                put_spread(queue, 10, partitions=2)
                wait_for(lambda: len(listener.messages) >= 10, 30, "10 pushes over IPv6")
    finally:
        server.stop()


def test_a_queue_has_at_most_so_many_subscribers_registered(url, monkeypatch):
    """A consumer token may register subscribers, and every server looks at each when it
    reconciles: a queue holds MAX_SUBSCRIBERS_PER_QUEUE (3000 were taken, every server's
    idle CPU went from 1 % to 39 %)."""
    from hqueue import LimitExceeded
    from hqueue.subscriptions import service

    monkeypatch.setattr(service, "MAX_SUBSCRIBERS_PER_QUEUE", 3)
    with HQueueAdmin(url) as admin:
        for name in ("a", "b", "c"):
            admin.add_subscriber("events", name)
        with pytest.raises(LimitExceeded, match="3 subscribers registered: delete one first") as refused:
            admin.add_subscriber("events", "d")
        assert admin.list_subscribers("events") == ["a", "b", "c"]
        admin.add_subscriber("events", "c", topics=["t"])  # (one registered already may change)
        admin.delete_subscriber("events", "a")
        admin.add_subscriber("events", "d")
    assert refused.value.limit == "max_subscribers_per_queue"


_BURY_AND_DIE = """
import os, sys, threading
import hqueue.subscriptions.delivery as delivery
from hqueue import HQueue, Message, MessageListener, Subscription

real = delivery.dead_letter


def dead_letter_and_die(*args, **kwargs):
    real(*args, **kwargs)
    os._exit(9)  # killed between the dead letter's write and the checkpoint's save


class Refuse(MessageListener):
    def on_messages(self, messages):
        raise ValueError("poison")


delivery.dead_letter = dead_letter_and_die
with HQueue("orders", sys.argv[1]) as queue:
    with queue.create_subscriber(Subscription("s", dead_letter_after=1), [Refuse()]):
        queue.put(Message("t", b"poison"), partition_id=0)
        threading.Event().wait(60)
"""


def test_a_message_dead_lettered_again_after_a_kill_before_its_checkpoint_is_one_dead_letter(tmp_path):
    """A subscription's dead letter and its checkpoint's save are two writes: a process killed
    between them pushed the message again after the restart, and buried it twice. Its put is
    named by the registration (made, epoch), the partition and the message: the second is
    answered with the first's ID. A replay buries it anew, as it should."""
    import subprocess
    import sys

    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", 1)
    child = subprocess.run([sys.executable, "-c", _BURY_AND_DIE, url], capture_output=True, timeout=90)
    assert child.returncode == 9, child.stderr.decode()[-2000:]

    def dead(queue: HQueue) -> list[bytes]:
        with HQueue("orders.dlq", url) as dlq:
            return [m.value for m in dlq.scan()]

    with HQueueAdmin(url) as admin, HQueue("orders", url) as queue:
        assert dead(queue) == [b"poison"]
        listener = RefusePoison()
        with queue.create_subscriber(Subscription("s", dead_letter_after=1), [listener]):
            wait_for(lambda: listener.refusals >= 1, 30, "the poison pushed again")
            wait_for(
                lambda: admin.describe_subscriber("orders", "s")["lag_messages"] == {0: 0}, 30, "the checkpoint past it"
            )
            assert dead(queue) == [b"poison"]
            admin.set_checkpoint("orders", "s", 0, 0)  # a replay: buried anew
            wait_for(lambda: len(dead(queue)) == 2, 30, "the replay's dead letter")


def test_registering_an_attached_subscriber_again_keeps_it_attached_and_its_epoch(queue, url, server):
    """add_subscriber on one registered already rebuilt its registration: its address, push key
    and approvals went (pushes paused until its next heartbeat) and its epoch went back to 0 (a
    replayed subscriber's running workers were then of a newer epoch than the registration)."""
    registry = server.handler.subscription_calls.service.registry
    listener = Collect()
    with queue.create_subscriber(Subscription("s1"), [listener]):
        queue.put(Message("t", b"one"), partition_id=2)
        wait_for(lambda: listener.messages, 10, "first delivery")
        with HQueueAdmin(url) as admin:
            admin.set_checkpoint("events", "s1", 2, MessageID(0))  # epoch 1
            before = registry.load("events", "s1")
            admin.add_subscriber("events", "s1", dead_letter_after=3)
            after = registry.load("events", "s1")
            assert after.attached and after.address == before.address
            assert (after.push, after.approved, after.made) == (before.push, before.approved, before.made)
            assert after.epoch >= before.epoch == 1 and after.dead_letter_after == 3
            queue.put(Message("t", b"two"), partition_id=2)
            wait_for(lambda: b"two" in listener.values(), 10, "a push after the registration again")


def test_a_start_given_when_registering_again_is_where_running_workers_go_on(queue, url, server):
    """A start given to add_subscriber for a subscriber already pushed to is a replay: the
    running worker must not save its own position over it (it kept the registration's epoch)."""
    registry = server.handler.subscription_calls.service.registry
    listener = Collect()
    with queue.create_subscriber(Subscription("s1"), [listener]):
        ids = queue.put([Message("t", b"a"), Message("t", b"b")], partition_id=4)
        wait_for(lambda: len(listener.messages) >= 2, 10, "first pass")
        epoch = registry.load("events", "s1").epoch
        with HQueueAdmin(url) as admin:
            admin.add_subscriber("events", "s1", partitions={p: (ids[0] if p == 4 else None) for p in range(8)})
            assert registry.load("events", "s1").epoch == epoch + 1
            wait_for(lambda: len(listener.messages) >= 4, 10, "the replay from the given start")
            settled(server)
    assert listener.values()[:4] == [b"a", b"b", b"a", b"b"]


def test_a_deleted_subscribers_stopping_worker_does_not_save_into_its_new_registration(tmp_path):
    """delete + add_subscriber(from 0): the deleted registration's worker, still stopping (the
    one push thread busy with another subscriber's slow push), saved its position into the new
    registration, which then skipped the 100 messages it asked for (an attacker's pass)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, push_threads=1, checkpoint_interval=0.1).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("orders", 1)
            admin.create_queue("other", 1)
        with HQueueAdmin(url) as admin, HQueue("orders", url) as orders, HQueue("other", url) as other:
            listener, slow = Collect(), Slow(3.0)
            with (
                orders.create_subscriber(Subscription("s"), [listener]),
                other.create_subscriber(Subscription("slow"), [slow]),
            ):
                orders.put([Message("t", b"%d" % i) for i in range(100)], partition_id=0)
                wait_for(lambda: len(listener.messages) >= 100, 20, "the first pass")
                time.sleep(0.3)  # (its checkpoint saved)
                other.put(Message("t", b"x"), partition_id=0)  # the one push thread: busy for 3 s
                wait_for(lambda: slow.started, 10, "the slow push")
                admin.delete_subscriber("orders", "s")
                admin.add_subscriber("orders", "s", partitions={0: MessageID(0)})  # everything again
                wait_for(lambda: len(listener.messages) >= 200, 20, "the 100 asked for again")
    finally:
        server.stop()


class Slow(MessageListener):
    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, False

    def on_messages(self, messages):
        self.started = True
        time.sleep(self.seconds)


def test_a_second_instance_refused_changes_nothing_of_the_live_ones_registration(queue, url):
    """A second instance's start() registered it before it was refused: its partitions, starts
    and dead-letter limit replaced the live one's (the live one got nothing of partitions 1-7,
    and partition 0 skipped an hour; an attacker's pass)."""
    live = Collect()
    with queue.create_subscriber(Subscription("s"), [live]), HQueueAdmin(url) as admin:
        before = admin.describe_subscriber("events", "s")
        second = Subscription("s", dead_letter_after=1).add_partitions(
            {0: MessageID(int(time.time() * 1000) + 3_600_000)}
        )
        with pytest.raises(SubscriberActive):
            queue.create_subscriber(second, [Collect()], takeover_timeout=0.5).start()
        after = admin.describe_subscriber("events", "s")
        assert (after["partitions"], after["checkpoints"]) == (before["partitions"], before["checkpoints"])
        ids = put_spread(queue, 8)
        wait_for(lambda: len(live.messages) >= 8, 10, "every partition's message at the live instance")
    assert sorted(m.id for m in live.messages) == sorted(ids)


def test_partitions_an_admin_adds_to_a_running_subscriber_are_pushed_to_it(queue, url):
    """The subscriber's guard took only the partitions it started with: those an admin added
    (add_subscriber) were refused for ever, each refusal slowing the others (an attacker's pass)."""
    listener = Collect()
    subscriber = queue.create_subscriber(Subscription("s").add_partitions([0]), [listener]).start()
    try:
        queue.put(Message("t", b"p0"), partition_id=0)
        wait_for(lambda: listener.values() == [b"p0"], 10, "partition 0's message")
        with HQueueAdmin(url) as admin:
            admin.add_subscriber("events", "s", partitions=[0, 1])
        queue.put(Message("t", b"p1"), partition_id=1)
        wait_for(lambda: b"p1" in listener.values(), 10, "the added partition's message")
        assert subscriber.guard.refused == 0
    finally:
        subscriber.stop()


def test_a_registration_made_only_if_new_changes_nothing_of_one_that_exists(queue, url):
    from hqueue.errors import SubscriberExists

    with HQueueAdmin(url) as admin:
        subscriptions = admin.subscriptions("a test")
        subscriptions.add("events", "s", None, {0: None, 1: None}, None, create_only=True)
        before = admin.describe_subscriber("events", "s")
        with pytest.raises(SubscriberExists):
            subscriptions.add("events", "s", None, {2: None}, 3, create_only=True)
        assert admin.describe_subscriber("events", "s") == before


def test_two_new_instances_started_at_once_leave_the_registration_of_the_one_that_runs(queue, url):
    """Both found the name unregistered and registered it, the second's partitions, topics and
    dead-letter limit over the first's, then one of them was refused as active: the one that
    ran had another's registration (a review)."""
    import threading

    for attempt in range(6):
        name = f"race{attempt}"
        configs = [Subscription(name).add_partitions([0, 1]), Subscription(name).add_partitions([2, 3, 4])]
        subscribers = [queue.create_subscriber(c, [Collect()], takeover_timeout=0.5) for c in configs]
        barrier, outcome = threading.Barrier(2), [None, None]

        def start(i: int, subscribers=subscribers, barrier=barrier, outcome=outcome) -> None:
            barrier.wait()
            try:
                subscribers[i].start()
                outcome[i] = "started"
            except SubscriberActive:
                outcome[i] = "refused"

        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        try:
            assert sorted(outcome) == ["refused", "started"], outcome
            running = configs[outcome.index("started")]
            with HQueueAdmin(url) as admin:
                assert admin.describe_subscriber("events", name)["partitions"] == frozenset(running.partitions)
        finally:
            for subscriber in subscribers:
                if subscriber.started:
                    subscriber.stop()
