"""A consumer group member that asks for its next batch ahead (``queue.consumer(g, prefetch=True)``,
hqueue/client/ahead.py), through a real server on loopback: every message once, the batch
ahead given back unseen when it is not used, never handed out with less than 3/4 of its
lease, and nothing asked ahead where there is no round trip to save; the asyncio member the same."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import time

import pytest
from click.testing import CliRunner

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.aio import AsyncHQueue
from hqueue.aio.client.groups import AsyncRemoteGroups
from hqueue.aio.consumer import AsyncConsumer
from hqueue.cli import main
from hqueue.client.ahead import GroupAhead
from hqueue.client.groups import RemoteGroups
from hqueue.groups.limits import HEARTBEAT_INTERVAL, PREFETCH_CLOSE_WAIT, GroupLimits
from hqueue.groups.limits import PREFETCH_STALE_SHARE as STALE_SHARE
from hqueue.server import HQueueServer

from ..processes import drain, one_queue_served, wait_for


def held(queue: HQueue, member: str) -> list:
    """What ``member`` holds now, by the server's word."""
    return [p for p in queue.pending("g") if p.member == member]


def test_the_next_batch_is_asked_for_as_a_whole_one_is_handed_out(queue, monkeypatch):
    """With several owners (here: sole_owner says none), on a connection of its own at once."""
    monkeypatch.setattr(RemoteGroups, "sole_owner", lambda self, queue: None)
    queue.put([Message("t", b"%d" % i) for i in range(30)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        first = member.receive(10, wait=0)
        assert len(first) == 10
        # The server handed out the next 10 too, before this member asked for them
        wait_for(lambda: len(held(queue, "m")) == 20, 5, "the batch asked ahead to be handed out")
        second = member.receive(10, wait=0)
        assert [d.value for d in first + second] == [b"%d" % i for i in range(20)]
        assert {d.attempt for d in second} == {1}
        member.ack(first + second)
        third = member.receive(10, wait=0)
        member.ack(third)
        assert [d.value for d in third] == [b"%d" % i for i in range(20, 30)]
        assert member.receive(10, wait=0.2) == []  # (a batch ahead, empty: then a receive that waits)
    assert queue.pending("g") == []


def test_at_a_sole_owner_the_ack_asks_for_the_next_batch_in_its_call(queue):
    queue.put([Message("t", b"%d" % i) for i in range(30)], 0)
    calls = []
    with queue.consumer("g", member="m", prefetch=True) as member:
        groups = member._groups
        for name in ("ack", "ack_asking", "receive"):  # (counting the client's calls)
            method = getattr(groups, name)
            setattr(groups, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))
        first = member.receive(10, wait=0)
        assert len(held(queue, "m")) == 10  # nothing asked ahead yet
        assert member.ack(first) == 10
        assert len(held(queue, "m")) == 10  # the first ten finished, the next ten handed out
        second = member.receive(10, wait=0)  # (no call: the ack's answer)
        assert member.ack(second) == 10
        third = member.receive(10, wait=0)
        member.ack(third)
        assert member.receive(10, wait=0.2) == []
    assert [d.value for d in first + second + third] == [b"%d" % i for i in range(30)]
    assert {d.attempt for d in first + second + third} == {1}
    assert calls[:5] == ["receive", "ack_asking", "ack_asking", "ack_asking", "receive"], calls
    assert queue.pending("g") == []


def test_a_batch_that_is_not_whole_asks_nothing_ahead(queue):
    queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        assert len(member.receive(10, wait=0)) == 5
        queue.put([Message("t", b"late")], 0)
        time.sleep(0.2)
        assert len(held(queue, "m")) == 5  # the late one was not taken out for it
        assert [d.value for d in member.receive(10, wait=0)] == [b"late"]


def test_close_gives_the_batch_ahead_back_unseen(queue):
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        got = member.receive(10, wait=0)
        member.ack(got)
        wait_for(lambda: len(held(queue, "m")) == 10, 5, "the batch asked ahead")
    assert {(p.member, p.attempt, p.retry_in) for p in queue.pending("g")} == {(None, 1, 0.0)}  # back at once
    with queue.consumer("g", member="n") as other:
        again = other.receive(20, wait=0)
    assert [d.value for d in again] == [b"%d" % i for i in range(10, 20)]
    assert {d.attempt for d in again} == {1}  # not counted as a failed delivery


def test_a_smaller_receive_takes_part_of_the_batch_ahead_and_gives_the_rest_back_unseen(queue):
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        member.ack(member.receive(10, wait=0))
        part = member.receive(4, wait=0)
        assert [d.value for d in part] == [b"10", b"11", b"12", b"13"]
        rest = []
        while deliveries := member.receive(10, wait=0):
            rest += deliveries
        member.ack(part + rest)
    values = [d.value for d in rest]
    assert values == [b"%d" % i for i in range(14, 20)], values
    assert {d.attempt for d in part + rest} == {1}


def test_a_batch_ahead_whose_lease_ran_a_quarter_goes_back_and_a_fresh_lease_is_given(queue):
    lease = 2.0
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    with queue.consumer("g", member="m", prefetch=True, lease=lease) as member:
        member.ack(member.receive(10, wait=0))
        time.sleep(lease * STALE_SHARE + 0.3)  # the work took longer than a quarter of the lease
        began = time.monotonic()
        second = member.receive(10, wait=0)
        assert [d.value for d in second] == [b"%d" % i for i in range(10, 20)]
        assert {d.attempt for d in second} == {1}  # given back unseen, then handed out again
        left = min(p.lease_left for p in held(queue, "m") if p.id in {d.id for d in second})
        assert left > lease * (1 - STALE_SHARE) - (time.monotonic() - began), left
        member.ack(second)


def test_a_receive_with_another_lease_does_not_take_the_batch_ahead(queue):
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    with queue.consumer("g", member="m", prefetch=True, lease=2) as member:
        member.ack(member.receive(10, wait=0))
        second = member.receive(10, wait=0, lease=40)
        assert [d.value for d in second] == [b"%d" % i for i in range(10, 20)]
        assert min(p.lease_left for p in held(queue, "m")) > 20  # its own lease, not the batch ahead's
        member.ack(second)


def test_iterating_with_prefetch_hands_every_message_once(queue):
    queue.put([Message("t", b"%d" % i) for i in range(250)], 0)
    queue.put([Message("t", b"b%d" % i) for i in range(250)], 1)
    seen = []
    with queue.consumer("g", member="m", prefetch=True) as member:
        for delivery in member:
            seen.append(delivery.value)
            member.ack(delivery)
            if len(seen) == 500:
                break
    assert sorted(seen) == sorted([b"%d" % i for i in range(250)] + [b"b%d" % i for i in range(250)])
    assert queue.pending("g") == []


def test_members_receiving_from_many_threads_share_the_work_once(queue):
    queue.put([Message("t", b"%d" % i) for i in range(2000)], 0)
    queue.put([Message("t", b"b%d" % i) for i in range(2000)], 1)
    got: list[bytes] = []
    lock = threading.Lock()
    with queue.consumer("g", member="m", prefetch=True) as member:

        def work() -> None:
            while True:
                deliveries = member.receive(50, wait=0.3)
                if not deliveries:
                    return
                with lock:
                    got.extend(d.value for d in deliveries)
                member.ack(deliveries)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(got) == 4000 and len(set(got)) == 4000


@pytest.mark.parametrize("pause", [0, 2.5 * HEARTBEAT_INTERVAL])
def test_a_restarted_server_loses_nothing_under_a_prefetching_member(tmp_path, pause):
    """Received right after the restart, or after heartbeats made new connections to the new
    server meanwhile (a review: the batch the ack brought was then handed out again)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    address = server.address
    url = f"hqueue://{address}?timeout=10"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"%d" % i) for i in range(40)], 0)
        with queue.consumer("g", member="m", prefetch=True) as member:
            first = member.receive(10, wait=0)
            member.ack(first)
            server.stop()  # it handed the batch asked ahead out, and its leases go with it
            server = HQueueServer(f"local://{tmp_path}/data", host=address.rpartition(":")[0],
                                  port=int(address.rpartition(":")[2])).start()  # fmt: skip
            time.sleep(pause)
            rest = []
            until = time.monotonic() + 30
            while time.monotonic() < until and len(rest) < 30:
                deliveries = member.receive(10, wait=0.2)
                member.ack(deliveries)
                rest += deliveries
            assert member.receive(10, wait=0.5) == []  # every one acked at the new server
    server.stop()
    # The answer ahead came before the stop, and is not handed out: its leases went with the server,
    # and acks at the new one would not count (the batch would come again)
    assert [d.value for d in first + rest] == [b"%d" % i for i in range(40)]


@pytest.mark.parametrize("url_of", ["embedded", "memory"])
def test_a_store_in_this_process_asks_nothing_ahead(tmp_path, url_of):
    url = f"local://{tmp_path}/data" if url_of == "embedded" else f"memory://prefetch-{id(tmp_path)}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue, queue.consumer("g", member="m", prefetch=True) as member:
        queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
        assert len(member.receive(10, wait=0)) == 10
        assert len(held(queue, "m")) == 10
        assert member._ahead is None


def test_a_prefetching_member_does_not_ack_across_a_fork(queue):
    """In a forked child its ack is refused, as any member's (a review: the ack that asks for
    the next batch went through the parent's socket)."""
    queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        got = member.receive(10, wait=0)
        child = os.fork()
        if child == 0:  # the child: nothing of pytest's may run here
            code = 1
            try:
                member.ack(got)
            except RuntimeError as e:
                code = 0 if "before this process forked" in str(e) else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert member.ack(got) == 10


def test_a_member_closed_while_its_ack_is_on_its_way_leaves_again_even_if_nothing_came(queue, server, monkeypatch):
    """Closed by another thread as its ack went: the server may take the leave first, and the
    ack's receive counts the member in again, with no messages (a review: the member stayed in
    the group, holding its partitions from the others until its timeout)."""
    queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
    ack_asking = RemoteGroups.ack_asking
    member = queue.consumer("g", member="m", prefetch=True)

    def closed_first(self, *args, **kwargs):
        closing = threading.Thread(target=member.close)
        closing.start()
        closing.join()
        return ack_asking(self, *args, **kwargs)

    got = member.receive(5, wait=0)
    monkeypatch.setattr(RemoteGroups, "ack_asking", closed_first)
    assert member.ack(got) == 5
    monkeypatch.setattr(RemoteGroups, "ack_asking", ack_asking)
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        assert not admin.describe_group("q", "g")["members"]


def test_a_member_whose_acks_lag_its_receives_asks_ahead_at_the_receive(queue):
    """Acks that come after the next receive (from other threads) cannot ask: from the first
    receive that finds the ask unused, each whole batch is asked ahead at the receive."""
    queue.put([Message("t", b"%d" % i) for i in range(40)], 0)
    with queue.consumer("g", member="m", prefetch=True) as member:
        first = member.receive(10, wait=0)
        second = member.receive(10, wait=0)  # (before the first's ack)
        wait_for(lambda: len(held(queue, "m")) == 30, 5, "the batch asked ahead at the receive")
        member.ack(first + second)
        rest = []
        while deliveries := member.receive(10, wait=0.2):
            rest += deliveries
            member.ack(deliveries)
    assert [d.value for d in first + second + rest] == [b"%d" % i for i in range(40)]
    assert queue.pending("g") == []


def test_prefetch_must_be_a_bool(queue):
    with pytest.raises(TypeError, match="prefetch"):
        queue.consumer("g", prefetch="yes")


# -- asyncio -----------------------------------------------------------------------------------


def test_an_asyncio_member_asks_ahead_and_hands_every_message_once(queue, server):
    queue.put([Message("t", b"%d" % i) for i in range(250)], 0)

    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            async with aqueue.consumer("g", member="m", prefetch=True) as member:
                first = await member.receive(10, wait=0)
                await member.ack(first)
                ahead, until = 0, time.monotonic() + 5  # what the server handed out: 10 more, not asked for yet
                while ahead != 10 and time.monotonic() < until:
                    ahead = len(await asyncio.to_thread(held, queue, "m"))
                got = list(first)
                while deliveries := await member.receive(100, wait=0.2):
                    await member.ack(deliveries)
                    got += deliveries
                return ahead, got

    ahead, got = asyncio.run(main())
    assert ahead == 10
    assert [d.value for d in got] == [b"%d" % i for i in range(250)]
    assert {d.attempt for d in got} == {1}
    assert queue.pending("g") == []


def test_an_asyncio_member_gives_a_stale_or_unfitting_batch_ahead_back_unseen(queue, server):
    queue.put([Message("t", b"%d" % i) for i in range(30)], 0)

    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            async with aqueue.consumer("g", member="m", prefetch=True, lease=2) as member:
                await member.ack(await member.receive(10, wait=0))
                await asyncio.sleep(2 * STALE_SHARE + 0.3)
                stale = await member.receive(10, wait=0)  # taken afresh: a full lease
                lease_left = min(p.lease_left for p in await asyncio.to_thread(held, queue, "m"))
                await member.ack(stale)
                part = await member.receive(4, wait=0)  # of the 10 asked ahead: the other 6 go back
                await member.ack(part)
                rest = []
                while deliveries := await member.receive(10, wait=0.2):
                    await member.ack(deliveries)
                    rest += deliveries
                return stale, lease_left, part, rest

    stale, lease_left, part, rest = asyncio.run(main())
    assert [d.value for d in stale] == [b"%d" % i for i in range(10, 20)]
    assert lease_left > 2 * (1 - STALE_SHARE), lease_left
    assert [d.value for d in part + rest] == [b"%d" % i for i in range(20, 30)]
    assert {d.attempt for d in stale + part + rest} == {1}


@pytest.mark.parametrize("asked_by", ["the ack", "a receive of its own"])
def test_an_asyncio_receive_cancelled_while_it_awaits_the_batch_ahead_leaves_it_for_the_next(
    queue, server, monkeypatch, asked_by
):
    """At a sole owner the ack asks for the batch ahead in its call; with several owners (here:
    sole_owner says none) a receive of its own asks for it."""
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
    if asked_by == "the ack":
        ack_asking = AsyncRemoteGroups.ack_asking

        async def slow(self, *args, **kwargs):  # the ack and the batch ahead come 0.3 s late
            await asyncio.sleep(0.3)
            return await ack_asking(self, *args, **kwargs)

        monkeypatch.setattr(AsyncRemoteGroups, "ack_asking", slow)
    else:
        calls = itertools.count()
        receive = AsyncRemoteGroups.receive

        async def slow_second(self, *args, **kwargs):  # the batch ahead (the second call) comes 0.3 s late
            if next(calls) == 1:
                await asyncio.sleep(0.3)
            return await receive(self, *args, **kwargs)

        monkeypatch.setattr(AsyncRemoteGroups, "receive", slow_second)
        monkeypatch.setattr(AsyncRemoteGroups, "sole_owner", lambda self, queue: None)

    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            async with aqueue.consumer("g", member="m", prefetch=True) as member:
                acking = asyncio.ensure_future(member.ack(await member.receive(10, wait=0)))
                await asyncio.sleep(0)  # (the ack under way)
                receiving = asyncio.ensure_future(member.receive(10, wait=0))
                await asyncio.sleep(0.1)  # (it awaits the batch ahead, not come yet)
                assert not receiving.done()
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                assert await acking == 10
                second = await member.receive(10, wait=0)
                await member.ack(second)
                return second

    second = asyncio.run(main())
    assert [d.value for d in second] == [b"%d" % i for i in range(10, 20)]
    assert {d.attempt for d in second} == {1}
    assert queue.pending("g") == []


def test_an_asyncio_member_s_close_gives_the_batch_ahead_back_unseen(queue, server):
    queue.put([Message("t", b"%d" % i) for i in range(20)], 0)

    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            async with aqueue.consumer("g", member="m", prefetch=True) as member:
                await member.ack(await member.receive(10, wait=0))
                until = time.monotonic() + 5  # (the batch ahead handed out: close reads its answer, then leaves)
                while len(await asyncio.to_thread(held, queue, "m")) < 10 and time.monotonic() < until:
                    await asyncio.sleep(0.01)

    asyncio.run(main())
    assert {(p.member, p.attempt) for p in queue.pending("g")} <= {(None, 1)}
    with queue.consumer("g", member="n") as other:
        again = other.receive(20, wait=0)
    assert [d.value for d in again] == [b"%d" % i for i in range(10, 20)]
    assert {d.attempt for d in again} == {1}


def test_an_asyncio_prefetch_must_be_a_bool(server):
    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            aqueue.consumer("g", prefetch=1)

    with pytest.raises(TypeError, match="prefetch"):
        asyncio.run(main())


def test_hqueue_consume_prefetch_prints_what_it_took_and_gives_the_rest_back_unseen(queue, server):
    queue.put([Message("t", b"%d" % i) for i in range(250)], 0)
    url = f"hqueue://{server.address}"
    runner = CliRunner()
    first = runner.invoke(main, ["--url", url, "consume", "q", "g", "--prefetch", "--max", "150", "--format", "json"])
    assert first.exit_code == 0, first.output
    assert [json.loads(line)["value"] for line in first.output.splitlines()] == [str(i) for i in range(150)]
    rest = runner.invoke(main, ["--url", url, "consume", "q", "g", "--for", "1", "--format", "json"])
    printed = [json.loads(line) for line in rest.output.splitlines()]
    assert [p["value"] for p in printed] == [str(i) for i in range(150, 250)]
    assert {p["attempt"] for p in printed} == {1}


def test_a_batch_ahead_is_stale_by_the_lease_the_server_gave_not_the_one_asked(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, group_limits=GroupLimits(max_lease=2)).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue, queue.consumer("g", member="m", prefetch=True, lease=600) as member:
            queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
            member.ack(member.receive(10, wait=0))
            time.sleep(2 * STALE_SHARE + 0.3)  # a quarter of the 2 s it was given (not of the 600 s asked)
            began = time.monotonic()
            second = member.receive(10, wait=0)
            left = min(p.lease_left for p in held(queue, "m"))
            member.ack(second)
        assert [d.value for d in second] == [b"%d" % i for i in range(10, 20)]
        assert left > 2 * (1 - STALE_SHARE) - (time.monotonic() - began), left  # a fresh lease
    finally:
        server.stop()


def test_close_at_a_server_paused_with_the_batch_ahead_unanswered_still_leaves(tmp_path, monkeypatch):
    """The answer ahead took the close's whole timeout, and the leave, given none, never went:
    what the member held came back as failed deliveries when their leases ended."""
    with one_queue_served(tmp_path, 30) as (server, queue, _):
        member = queue.consumer("g", member="m", prefetch=True, lease=60)
        member.ack(member.receive(10, wait=0))
        asks = GroupAhead._ask
        monkeypatch.setattr(GroupAhead, "_ask", lambda self, *a: (server.pause(), asks(self, *a))[1])
        held_by_app = member.receive(10, wait=0)  # (the next 10 asked of a server paused first: no answer)
        began = time.monotonic()
        member.close()  # the leave goes (the server takes it when it resumes)
        took = time.monotonic() - began
        server.resume()
        wait_for(lambda: {p.member for p in queue.pending("g")} == {None}, 10, "the leases given back")
        with queue.consumer("g", member="n") as other:
            again = drain(other, 20, timeout=10)
    assert len(held_by_app) == 10 and took < 2 + PREFETCH_CLOSE_WAIT + 1.5, took
    assert sorted(d.value for d in again) == sorted(b"%d" % i for i in range(10, 30))
    assert {d.attempt for d in again} == {1}  # given back by the leave, not by leases run out


def test_an_asyncio_receive_cancelled_while_it_gives_back_what_does_not_fit_gives_back_the_rest_too(
    queue, server, monkeypatch
):
    queue.put([Message("t", b"%d" % i) for i in range(100)], 0)
    handing_back = asyncio.Event()
    give_back = AsyncConsumer._given_back_now

    async def spied(self, pairs):
        handing_back.set()
        return await give_back(self, pairs)

    monkeypatch.setattr(AsyncConsumer, "_given_back_now", spied)

    async def main():
        async with AsyncHQueue("q", f"hqueue://{server.address}") as aqueue:
            async with aqueue.consumer("g", member="m", prefetch=True) as member:
                await member.ack(await member.receive(50, wait=0))
                await asyncio.sleep(0.1)  # (the 50 ahead answered)
                receiving = asyncio.ensure_future(member.receive(5, wait=0))
                await handing_back.wait()
                receiving.cancel()  # at the hand-back of the 45 that do not fit
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                await asyncio.sleep(0.2)
                still = [p for p in await asyncio.to_thread(queue.pending, "g") if p.member == "m"]
                rest = []
                while deliveries := await member.receive(100, wait=0.2):
                    await member.ack(deliveries)
                    rest += deliveries
                return still, rest

    still, rest = asyncio.run(main())
    assert still == []  # not the 5 it would have returned, held until their lease ends
    assert sorted(d.value for d in rest) == sorted(b"%d" % i for i in range(50, 100))
    assert {d.attempt for d in rest} == {1}
