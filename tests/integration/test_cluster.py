"""Several hqueue servers over shared storage, coordinated by a real ZooKeeper.

Storage is the HBase backend on tests/hbase_standin.py (a TEST STAND-IN, not
HBase), shared by the servers like a real HBase would be. Servers are
subprocesses with a 2 s ZooKeeper session, killed with SIGKILL or paused
with SIGSTOP.
"""

import asyncio
import re
import threading
import time
import urllib.request

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from hqueue import GroupNotFound, HQueue, HQueueAdmin, Message, MessageID, OutcomeUnknown
from hqueue.aio import AsyncHQueue, AsyncHQueueAdmin
from hqueue.client import groups as groups_module
from hqueue.client.engine import RemoteEngine
from hqueue.rpc.wire import T

from ..conftest import hbase_url
from ..helpers.console_http import ConsoleUser
from ..processes import ServerProcess, drain, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.hbase]  # servers over the HBase stand-in
PARTITIONS = 8


@pytest.fixture
def cluster(tmp_path, zk_hosts, hbase_standin):
    """cluster(name, *options) starts one more server on the shared storage and ZooKeeper."""
    storage = hbase_url(hbase_standin[0])
    servers = []

    def start(name: str, *options: str) -> ServerProcess:
        server = ServerProcess(storage, tmp_path, zk=zk_hosts, name=name, extra_args=options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


def owners(url: str) -> list[str]:
    engine = RemoteEngine(url)
    try:
        return engine.locations("orders", fresh=True)
    finally:
        engine.release()


def settled(*servers: ServerProcess) -> list[str] | None:
    """Each partition's owner once every server agrees: a server names itself only for a
    partition it holds (one dealt to it and not held yet is ""), so agreement means each
    partition is held by the server the others name. None while they disagree."""
    answers = [owners(f"hqueue://{s.address}") for s in servers]
    return answers[0] if all(a == answers[0] for a in answers) and "" not in answers[0] else None


def split_evenly(a: ServerProcess, b: ServerProcess) -> str:
    """The URL of both servers, once queue 'orders' is made and each holds half its partitions."""
    url = f"hqueue://{a.address},{b.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", PARTITIONS)
    wait_for(lambda: sorted(settled(a, b) or []) == sorted([a.address, b.address] * 4), 30, "an even split")
    return url


class Writer(threading.Thread):
    """Puts one message at a time round the partitions; records every ack."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.acked, self.errors = url, threading.Event(), [], []

    def run(self) -> None:
        with HQueue("orders", self.url) as queue:
            i = 0
            while not self.stop.is_set():
                pid = i % PARTITIONS
                try:
                    (message_id,) = queue.put(Message("order", b"%d" % i), partition_id=pid)
                    self.acked.append((pid, message_id))
                except Exception as e:  # recorded, then the test fails on it
                    self.errors.append(repr(e))
                i += 1

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)


def two_servers_with_queue(cluster) -> tuple[ServerProcess, ServerProcess, str]:
    """Servers a and b, a queue "orders", its partitions split evenly between them (the
    split settled: both owning some is not enough, more may still move)."""
    a, b = cluster("a"), cluster("b")
    url = f"hqueue://{a.address},{b.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("orders", PARTITIONS)
    even = sorted([a.address, b.address] * (PARTITIONS // 2))
    wait_for(lambda: sorted(settled(a, b) or []) == even, 30, "both servers to hold half the partitions")
    return a, b, url


def ownership_log(server: ServerProcess) -> list[str]:
    """The server's ownership changes and session warnings, from its log."""
    return [
        line for line in server.log_path.read_text().splitlines() if " owns " in line or "ZooKeeper session" in line
    ]


def check_nothing_lost(url: str, writer: Writer) -> None:
    assert writer.errors == [], writer.errors[:3]
    with HQueue("orders", url) as queue:
        stored = {(m.partition_id, m.id) for m in queue.scan()}
    lost = [a for a in writer.acked if a not in stored]
    assert lost == [], f"{len(lost)} of {len(writer.acked)} acknowledged messages lost"
    last: dict[int, MessageID] = {}
    for pid, message_id in writer.acked:  # in the order the acks came back
        assert message_id > last.get(pid, MessageID(0)), f"ID went backwards in partition {pid}"
        last[pid] = message_id


def test_killed_server_partitions_fail_over_and_no_acked_message_is_lost(cluster):
    # Given two servers sharing the partitions, and a client writing
    a, b, url = two_servers_with_queue(cluster)
    writer = Writer(url)
    writer.start()
    time.sleep(1.5)
    before = len(writer.acked)
    # When one server is killed without warning
    a.kill()
    killed = time.monotonic()
    # Then the survivor owns every partition (after the 2 s session timeout; the deadline is
    # generous, as a loaded machine needs: how long a takeover takes is bench/'s to measure)
    survivor = f"hqueue://{b.address}"
    wait_for(lambda: owners(survivor) == [b.address] * PARTITIONS, 60, "the survivor to own all")
    takeover = time.monotonic() - killed
    wait_for(lambda: len(writer.acked) > before + 200, 30, "the writer to resume")
    writer.finish()
    # And every acknowledged message is there, IDs increasing per partition across the failover
    check_nothing_lost(survivor, writer)
    print(f"\nfailover: takeover {takeover:.2f}s (session 2 s); {len(writer.acked)} acked, 0 lost")


def test_a_joining_server_takes_a_share_and_no_put_fails(cluster):
    a, b, url = two_servers_with_queue(cluster)
    writer = Writer(url)
    writer.start()
    time.sleep(1.0)
    # When a third server joins
    c = cluster("c")
    # Then partitions spread over all three (3, 3 and 2), and the writer never fails for good
    three = {a.address, b.address, c.address}

    def shared_by_three() -> list[str] | None:
        spread = settled(a, b, c)
        return spread if spread and set(spread) == three else None

    spread = wait_for(shared_by_three, 30, "three servers to hold the partitions and agree on it")
    assert sorted(spread.count(s.address) for s in (a, b, c)) == [2, 3, 3], spread
    time.sleep(1.0)
    writer.finish()
    check_nothing_lost(url, writer)


def test_a_paused_server_is_fenced_before_others_take_its_partitions(cluster):
    a, b, url = two_servers_with_queue(cluster)
    # A partition a holds (a names itself for no other)
    mine = wait_for(lambda: owners(f"hqueue://{a.address}").index(a.address) + 1, 20, "a to hold one") - 1
    # Given server a frozen (a GC pause, a stopped VM) past its session timeout
    a.pause()
    try:
        wait_for(lambda: owners(f"hqueue://{b.address}") == [b.address] * PARTITIONS, 20, "b to take over")
    finally:
        # When it wakes up and a put reaches it at once
        a.resume()
    client = make_client(
        T.HQueueService, "127.0.0.1", a.port,
        proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(), timeout=10_000,
    )  # fmt: skip
    try:
        # Then it refuses: its lease lapsed while it slept
        with pytest.raises(T.TNotPartitionOwner):
            client.putMessageWithPid("orders", mine, T.TMessage(topic=b"t", value=b"stale"))
    finally:
        client.close()
    with HQueue("orders", f"hqueue://{b.address}") as queue:
        assert all(m.value != b"stale" for m in queue.scan())


def test_a_put_at_a_paused_owner_is_outcome_unknown_early_and_the_next_goes_to_the_new_owner(cluster):
    """A client that knew a paused server as a partition's owner sent it every put for as
    long as it was paused, each one waiting its whole deadline, though another server had
    taken the partition over within 2.4 s (an attacker's pass). Once the owner is silent
    for an eighth of the deadline the client asks the others who owns the partition: moved,
    the put is OutcomeUnknown at once (it is not sent to the new owner: it may be half
    written at the paused one, whose HBase write the fence would undo after the new owner
    had read its record), and the next put goes to the new owner; so for the async client.
    The paused server, resumed, writes none of them."""
    a, b, url = two_servers_with_queue(cluster)
    mine = wait_for(lambda: owners(f"hqueue://{a.address}").index(a.address) + 1, 20, "a to hold one") - 1
    with HQueue("orders", url, timeout=24) as queue, HQueue("orders", url, timeout=24) as timers:
        queue.put(Message("order", b"before"), mine)  # the client caches a as the owner
        (timer,) = timers.put(Message("order", b"timer"), mine, delay=600)  # so does this one
        a.pause()
        try:
            wait_for(lambda: owners(f"hqueue://{b.address}") == [b.address] * PARTITIONS, 30, "b to take over")
            began = time.monotonic()
            with pytest.raises(OutcomeUnknown, match="see whether it took effect"):
                timers.cancel(timer)  # (a cancel sent twice could say False for one it cancelled)
            cancelled = time.monotonic() - began
            started = time.monotonic()
            with pytest.raises(OutcomeUnknown, match="owns the partition now"):
                queue.put(Message("order", b"unknown"), mine)
            blocking = time.monotonic() - started
            (after_id,) = queue.put(Message("order", b"after"), mine)
            next_put = time.monotonic() - started - blocking

            async def aio_puts():
                async with AsyncHQueue("orders", url, timeout=24) as aqueue:
                    await aqueue.put(Message("order", b"warm"), mine - 1 if mine else mine + 1)
                    (await aqueue.async_engine())._locations["orders"][mine] = a.address  # as cached before the pause
                    began = time.monotonic()
                    with pytest.raises(OutcomeUnknown, match="owns the partition now"):
                        await aqueue.put(Message("order", b"aio unknown"), mine)
                    waited = time.monotonic() - began
                    (aio_id,) = await aqueue.put(Message("order", b"aio after"), mine)
                    return aio_id, waited

            aio_id, waited = asyncio.run(aio_puts())
        finally:
            a.resume()
    # Not the 24 s deadline: an eighth of it at the owner, the look, and, when the client's copy of the
    # queue's definition ran out meanwhile, its read, which may give the paused seed its share first (12 s)
    assert blocking < 20 and waited < 20 and next_put < 6 and cancelled < 20, (blocking, waited, next_put, cancelled)
    time.sleep(2.0)  # a, resumed, is fenced: nothing it held is written now
    with HQueue("orders", f"hqueue://{b.address}") as queue:
        stored = {m.value: m.id for m in queue.scan(partition_id=mine)}
    assert b"unknown" not in stored and b"aio unknown" not in stored, sorted(stored)
    assert stored[b"after"] == after_id and stored[b"aio after"] == aio_id


def test_group_calls_at_a_paused_owner_go_on_at_its_partitions_new_owner(cluster):
    """A member's receive and ack at a paused owner waited the call's whole deadline, then
    raised DeadlineExceeded, though the other server had the partitions within seconds (as
    puts did). Each waits a share of the deadline for an owner now, then the owners are
    read again and the call goes on at whoever owns the partitions: blocking and asyncio
    members alike. What was acked at the live owner never comes back; what the paused one
    held is acked at the new owner (as a retry waiting there) or goes out again from it:
    every message is finished in the end."""
    a, b, url = two_servers_with_queue(cluster)
    on_b = {pid for pid, owner in enumerate(owners(f"hqueue://{b.address}")) if owner == b.address}
    received, paused = threading.Event(), threading.Event()
    aio: dict = {}

    async def aio_member():
        async with AsyncHQueue("orders", url, timeout=24) as aqueue, aqueue.consumer("audit", member="aio") as member:
            got = []
            while len(got) < PARTITIONS:
                got += await member.receive(PARTITIONS - len(got), wait=0.5)
            received.set()
            while not paused.is_set():
                await asyncio.sleep(0.01)
            began = time.monotonic()
            again = await member.receive(PARTITIONS, wait=0.5)
            await member.ack(got)  # (acks what came again meanwhile too: the same receipts)
            aio["took"] = time.monotonic() - began
            until = time.monotonic() + 30
            while time.monotonic() < until and not finished(url, "audit"):
                deliveries = await member.receive(PARTITIONS, wait=0.5)
                again += deliveries
                await member.ack(deliveries)
            aio["again"] = again

    with HQueue("orders", url, timeout=24) as queue, queue.consumer("billing", member="blocking") as member:
        for pid in range(PARTITIONS):
            queue.put(Message("order", b"m%d" % pid), pid)
        first = drain(member, PARTITIONS, 20, wait=0.5)
        other = threading.Thread(target=lambda: asyncio.run(aio_member()), daemon=True)
        other.start()
        assert received.wait(30)
        a.pause()
        try:
            paused.set()
            began = time.monotonic()
            again = member.receive(PARTITIONS, wait=0.5)
            member.ack(first)
            took = time.monotonic() - began
            until = time.monotonic() + 30
            while time.monotonic() < until and not finished(url, "billing"):
                deliveries = member.receive(PARTITIONS, wait=0.5)
                again += deliveries
                member.ack(deliveries)
            other.join(60)
        finally:
            a.resume()
    assert len(first) == PARTITIONS and "took" in aio, aio
    assert took < 18 and aio["took"] < 18, (took, aio["took"])  # not the 24 s deadline, nor DeadlineExceeded
    assert finished(url, "billing") and finished(url, "audit")
    assert not on_b & {d.partition_id for d in again + aio["again"]}, (again, aio["again"])


def test_a_member_that_asks_ahead_goes_on_at_the_new_owner_of_a_paused_one_s_partitions(cluster):
    """A prefetching member (hqueue/client/ahead.py) whose batch ahead was asked of an owner
    that is paused past its session: the receive that reads its answer gives it up as any
    group call does (its owner named no more) and goes on at the new owner, far from the
    deadline; every message is acked in the end, and none acked at the live owner comes back."""
    a, b, url = two_servers_with_queue(cluster)
    on_b = {pid for pid, owner in enumerate(owners(f"hqueue://{b.address}")) if owner == b.address}
    with HQueue("orders", url, timeout=24) as queue, queue.consumer("billing", member="m", prefetch=True) as member:
        for pid in range(PARTITIONS):
            queue.put([Message("order", b"%d-%d" % (pid, i)) for i in range(6)], pid)
        first = []
        while len(first) < 2 or member._ahead._asked.owner != b.address:  # (the next is asked of a, in turn)
            first += member.receive(1, wait=0.5)
        member.ack(first)
        a.pause()
        try:
            took, asked_of_a, got, acked = [], 0, [], {d.value for d in first}
            until = time.monotonic() + 60
            while time.monotonic() < until and len(acked) < 6 * PARTITIONS:
                began = time.monotonic()
                deliveries = member.receive(1, wait=0.5)  # a whole batch: the next is asked ahead each time
                took.append(time.monotonic() - began)
                asked = member._ahead._asked
                asked_of_a += asked is not None and asked.owner == a.address
                if member.ack(deliveries):  # (0: handed out by a before the pause; b hands it out again)
                    acked |= {d.value for d in deliveries}
                got += deliveries
        finally:
            a.resume()
    assert len(acked) == 6 * PARTITIONS, sorted(acked)
    assert asked_of_a and max(took) < 18, (asked_of_a, max(took))  # not the 24 s deadline, nor DeadlineExceeded
    wait_for(lambda: finished(url, "billing"), 30, "every message acked")
    acked_at_b = [d for d in first if d.partition_id in on_b]
    assert not {d.rowkey for d in acked_at_b} & {d.rowkey for d in got}


def finished(url: str, group: str) -> bool:
    """Whether every message of queue "orders" is acked in ``group``."""
    with HQueueAdmin(url) as admin:
        partitions = admin.describe_group("orders", group)["partitions"]
    return all(p["lag_messages"] == 0 for p in partitions.values())


def test_timers_and_groups_follow_their_partitions_to_the_surviving_server(cluster):
    """Timers of a killed server's partitions fire on the server that takes them
    over; a group member reading both servers gets every message, and an acked
    one never comes back."""
    a, b, url = two_servers_with_queue(cluster)
    with HQueue("orders", url) as queue, queue.consumer("billing", lease=10) as member:
        on_a = wait_for(  # (a CI run read none once, as a saw them: a drain of 0 below was refused)
            lambda: [pid for pid, owner in enumerate(owners(f"hqueue://{a.address}")) if owner == a.address],
            10, "a's partitions as a says",
        )  # fmt: skip
        # (due late enough that a loaded machine drains and acks the orders first)
        timers = [queue.put(Message("timer", b"t%d" % pid), pid, delay=6.0)[0] for pid in on_a]
        for pid in range(PARTITIONS):
            queue.put(Message("order", b"m%d" % pid), pid)
        first = drain(member, PARTITIONS, 20, wait=0.5)
        member.ack(first)
        a.kill()  # a's partitions, their timers and its share of the group move to b
        wait_for(lambda: set(owners(f"hqueue://{b.address}")) == {b.address}, 30, "b to own every partition")
        later = drain(member, len(timers), 30, wait=0.5)  # a is gone: the client follows the partitions to b
        member.ack(later)
        assert sorted(d.value for d in later) == sorted(b"t%d" % pid for pid in on_a)
        due = {t.partition_id: t.due for t in timers}
        assert all(d.id.timestamp >= due[d.partition_id] for d in later)  # never early
        assert member.receive(100, wait=1.0) == []  # what was acked on a stays acked on b
    assert sorted(d.value for d in first) == sorted(b"m%d" % pid for pid in range(PARTITIONS))


def test_a_partition_a_rebalance_moves_counts_no_failed_delivery(cluster):
    """A graceful move (a server joins and takes its share) is not its holder's death: the
    holder removes its hand-out marks before it lets the partitions go, so the messages in
    flight there go out again as first deliveries, and a group with max_retries=0
    dead-letters none of them. (A death still counts: tests/system/test_shared_store.py.)"""
    a = cluster("a")
    with HQueueAdmin(f"hqueue://{a.address}") as admin:
        admin.create_queue("orders", PARTITIONS)
    wait_for(lambda: settled(a) == [a.address] * PARTITIONS, 30, "a to hold every partition")
    with HQueue("orders", f"hqueue://{a.address}") as queue:
        for pid in range(PARTITIONS):
            queue.put(Message("order", b"m%d" % pid), pid)
        with queue.consumer("billing", member="holder", lease=60, max_retries=0) as holder:
            held = drain(holder, PARTITIONS, 20, wait=0.5)  # (the first hand-out of each partition is marked)
            b = cluster("b")
            even = sorted([a.address, b.address] * (PARTITIONS // 2))
            wait_for(lambda: sorted(settled(a, b) or []) == even, 30, "b to take half the partitions")
    with HQueue("orders", f"hqueue://{a.address},{b.address}") as queue:
        with queue.consumer("billing", member="after", max_retries=0) as after:
            again = drain(after, PARTITIONS, 30, wait=0.5)  # b's half: the move; a's: the holder left
            after.ack(again)
        assert sorted(d.value for d in again) == sorted(d.value for d in held)
        assert [d.attempt for d in again] == [1] * PARTITIONS
    with HQueueAdmin(f"hqueue://{a.address},{b.address}") as admin:
        if admin.queue_exists("orders.dlq"):
            with admin.queue("orders.dlq") as dlq:
                assert list(dlq.scan()) == []


def test_a_client_whose_cached_owner_died_follows_the_partitions_to_the_new_owner(cluster, monkeypatch):
    """A member's cached owners can outlive a failover (a loaded machine, a long poll):
    its acks, nacks and receives, and puts and timers, refresh the owners and go to
    the survivor within the call's timeout, instead of raising ServerUnavailable."""
    # Given a member holding messages of both servers' partitions, its owners cached
    monkeypatch.setattr(groups_module, "LOCATION_REFRESH", 3600.0)  # the cache outlives the failover
    a, b, url = two_servers_with_queue(cluster)
    where = wait_for(lambda: settled(a, b), 20, "the servers to agree on the owners")
    with HQueue("orders", url, timeout=30) as queue, queue.consumer("billing", member="m", lease=60) as member:
        for pid in range(PARTITIONS):
            queue.put(Message("order", b"m%d" % pid), pid)
        held = drain(member, PARTITIONS, 20, wait=0.5)
        assert len(held) == PARTITIONS
        on_a = [d for d in held if where[d.partition_id] == a.address]
        # When a dies and b takes every partition
        watcher = HQueue("orders", url)  # another client, its owners cached (it sends no heartbeats to notice)
        assert len(watcher.pending("billing")) == PARTITIONS
        before = ownership_log(b)
        steady = len(before) == 1 and len(ownership_log(a)) == 1  # each took its half once, nothing moved since
        a.kill()
        wait_for(lambda: set(owners(f"hqueue://{b.address}")) == {b.address}, 30, "b to own every partition")
        steady = steady and all(line.endswith("-0)") for line in ownership_log(b)[len(before) :])
        # Then the merged calls skip the dead owner too: every partition described, b's leases pending
        described = watcher.engine.groups.describe("orders", "billing")
        assert sorted(described["partitions"]) == list(range(PARTITIONS))
        pending = {(p.partition_id, p.id) for p in watcher.pending("billing")}
        watcher.close()
        if steady:
            assert pending == {(d.partition_id, d.id) for d in held if d not in on_a}
        # And acks and nacks of the held messages go to b, without an error. b counts what
        # it handed out: the partitions it kept kept their leases (a's died with a). Only if
        # a session expired under load (partitions moved before the kill) may it count fewer.
        acked_at_b = member.ack([d for d in held if d not in on_a])
        nacked_at_b = member.nack(on_a, delay=0)
        if steady:
            assert (acked_at_b, nacked_at_b) == (PARTITIONS - len(on_a), 0)
        else:
            assert 0 <= acked_at_b + nacked_at_b <= PARTITIONS
        # And a receive gets a's messages (and any whose lease was dropped) again from b
        again = drain(member, PARTITIONS - acked_at_b, 20, wait=0.5)
        assert {d.value for d in on_a} <= {d.value for d in again}
        assert len(again) == PARTITIONS - acked_at_b
        assert member.ack(again) == len(again)
        # And puts and timers to a's old partitions go to b
        pid = on_a[0].partition_id
        queue.put(Message("order", b"after"), pid)
        queue.put(Message("timer", b"timer"), pid, delay=0.5)
        late = drain(member, 2, 20, wait=0.5)
        assert sorted(d.value for d in late) == [b"after", b"timer"]
        member.ack(late)


def test_a_servers_console_shows_every_server_and_the_partitions_it_owns(cluster):
    # Given two servers under ZooKeeper, the first with a console
    a, b = cluster("a", "--console-port", "0"), cluster("b")
    with HQueueAdmin(f"hqueue://{a.address},{b.address}") as admin:
        admin.create_queue("orders", PARTITIONS)
    owners_now = wait_for(lambda: settled(a, b), 30, "the partitions to settle")
    # When an operator logs in with the one-time token it printed
    token = wait_for(lambda: re.findall(r"one-time token: (\S+)", a.log_path.read_text()), 30, "the token")[-1]
    user = ConsoleUser(a.announced("console"))
    assert user.log_in(token).status == 200
    # Then the overview names both servers with the partitions ZooKeeper gave each
    page = user.get("/").body
    for server in (a, b):
        assert f"<td>{server.address}</td><td>{owners_now.count(server.address)}</td>" in page
    assert f"<td>{b.address}</td>" in user.get("/queues/orders").body  # each partition's owner


def test_the_survivor_has_the_lag_series_of_the_partitions_it_takes_over_at_once(cluster):
    """Issue 19.2: every group and partition a server owns has exact lag series, the ones
    it gained in a failover included, from the first scrape after it holds them."""
    a, b = cluster("a", "--metrics-port", "0"), cluster("b", "--metrics-port", "0")
    url = split_evenly(a, b)
    with HQueue("orders", url) as queue:
        for pid in range(PARTITIONS):
            queue.put([Message("order", b"x")] * (pid + 1), pid)
        queue.consumer("billing", member="m").close()  # a group no member reads
    a.kill()
    wait_for(lambda: set(owners(f"hqueue://{b.address}")) == {b.address}, 30, "b to own every partition")
    text = urllib.request.urlopen(f"{b.announced('metrics')}/metrics", timeout=30).read().decode()
    lag = dict(
        re.findall(r'^hqueue_group_lag_messages\{group="billing",partition="(\d+)",queue="orders"\} (\S+)$', text, re.M)
    )
    assert {int(p): float(v) for p, v in lag.items()} == {pid: pid + 1 for pid in range(PARTITIONS)}


def test_a_group_deleted_through_one_server_is_deleted_at_every_owner(cluster):
    """The owners of a group's partitions kept its state in memory when another server
    served the delete: their acks wrote its progress back, and the group made again
    under its name started from their old cursors and skipped messages."""
    # Given two servers sharing the partitions, and a group that has read and acked half of each
    a, b = cluster("a"), cluster("b")
    url = split_evenly(a, b)
    with HQueue("orders", url) as queue:
        for pid in range(PARTITIONS):
            queue.put([Message("order", b"%d-%d" % (pid, i)) for i in range(4)], pid)
        member = queue.consumer("g", member="m")
        got = drain(member, 4 * PARTITIONS, timeout=30)
        member.ack(got[::2])
        # When it is deleted through server a alone
        with HQueueAdmin(f"hqueue://{a.address}") as only_a:
            only_a.delete_group("orders", "g")
        # Then the member that still holds it is told so, at either server
        with pytest.raises(GroupNotFound):
            member.ack(got[1::2])
        # And the group made again under its name gets every message
        with queue.consumer("g", member="again") as again:
            assert len(drain(again, 4 * PARTITIONS, timeout=30)) == 4 * PARTITIONS
        # The asyncio admin deletes it at every owner too
        member = queue.consumer("g", member="m2")

        async def delete_through_a() -> None:
            async with AsyncHQueueAdmin(f"hqueue://{a.address}") as async_admin:
                await async_admin.delete_group("orders", "g")

        asyncio.run(delete_through_a())
        with pytest.raises(GroupNotFound):
            member.receive(1, wait=0)


def test_a_stuck_message_the_cursor_moved_past_goes_out_again_after_a_failover(cluster):
    """Past MAX_ACKED_AHEAD acks after an unfinished message, the group keeps it (behind
    its cursor) instead of the acks: the server that takes the partition over sends it
    again, and nothing acked."""
    from hqueue.groups.state import MAX_ACKED_AHEAD

    a, b, url = two_servers_with_queue(cluster)
    pid = owners(f"hqueue://{a.address}").index(a.address)  # one of a's partitions
    with HQueue("orders", url) as queue:
        queue.put(Message("order", b"stuck"), pid)
        for _ in range(MAX_ACKED_AHEAD // 1000 + 1):
            queue.put([Message("order", b"x")] * 1000, pid)
        with queue.consumer("billing", member="holder", lease=60) as holder:
            (held,) = wait_for(lambda: holder.receive(1, wait=0.5), 20, "the first message")
            assert held.value == b"stuck"
            with queue.consumer("billing", member="worker") as worker:
                acked = 0
                while acked < MAX_ACKED_AHEAD + 1000:
                    acked += worker.ack(worker.receive(1000, wait=1))
            a.kill()  # the partition, with the state of its group, moves to b
            wait_for(lambda: set(owners(f"hqueue://{b.address}")) == {b.address}, 30, "b to own every partition")
        with queue.consumer("billing", member="after") as after:
            again = drain(after, 1, 30, wait=0.5)
            assert [d.value for d in again] == [b"stuck"]
            assert after.receive(1000, wait=1) == []  # nothing acked comes again
