"""hqueue.aio on every store URL (api_url: embedded, memory, the HBase stand-in, remote).

Given a queue, when an asyncio application puts, scans and consumes it, then
it sees what the blocking API sees; a task cancelled in receive leaves nothing
leased, no thread and no socket behind; errors are hqueue's typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import pytest

from hqueue import HQueue, HQueueAdmin, InvalidArgument, Message, MessageID, QueueDisabled, QueueNotFound, Timer
from hqueue.aio import AsyncHQueue, AsyncHQueueAdmin

from ..processes import wait_for


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def hqueue_threads() -> int:
    return sum(t.name.startswith("hqueue-aio") for t in threading.enumerate())


def subscriber_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hqueue-subscriber")]


async def wait_async(condition, timeout: float = 5.0) -> None:
    """Until ``condition()`` holds (AssertionError after ``timeout`` seconds), the loop running."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def client_sockets(url: str) -> int:
    """Established TCP connections to the server of ``url`` (hqueue://host:port), from the kernel's table."""
    port = int(url.rpartition(":")[2])
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
            count += 1
    return count


async def made(url: str, name: str, partitions: int = 4, ttl: int = 0) -> AsyncHQueue:
    async with AsyncHQueueAdmin(url) as admin:
        await admin.create_queue(name, partitions, ttl)
    return await AsyncHQueue(name, url).open()


def test_put_then_scan_returns_every_message_in_id_order(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        try:
            ids = []
            for i in range(6):
                ids += await queue.put([Message(f"t{i % 2}", b"v%d-%d" % (i, j)) for j in range(50)])
            scanned = [m async for m in queue.scan()]
            assert [m.id for m in scanned] == sorted(ids)
            assert len({m.value for m in scanned}) == 300
            assert [m.id for m in scanned if m.topic == "t1"] == [m.id async for m in queue.scan(topics=["t1"])]
            assert len([m async for m in queue.scan(limit=7, caching=3)]) == 7
            one = await queue.put(Message("t", b"keyed"), key="k")
            assert [m.value async for m in queue.scan(one[0], partition_id=one[0] and (await where(queue, one)))] == [
                b"keyed"
            ]
        finally:
            await queue.close()

    run(main())


def test_a_scan_of_a_queue_deleted_and_created_again_says_so(api_url, queue_name):
    """As the blocking scan does (tests/api/test_queue.py): none of the new queue's messages."""

    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        try:
            old = set(await queue.put([Message("t", b"old %d" % i) for i in range(100)]))
            scan = queue.scan(caching=10)
            read = [(await anext(scan)).id]
            async with AsyncHQueueAdmin(api_url) as admin:
                await admin.disable_queue(queue_name)
                await admin.delete_queue(queue_name)
                await admin.create_queue(queue_name, 1)
            async with AsyncHQueue(queue_name, api_url) as again:
                new = set(await again.put([Message("t", b"new %d" % i) for i in range(100)]))
            with pytest.raises((QueueNotFound, QueueDisabled)):  # (a chunk read ahead may have met either)
                async for message in scan:
                    read.append(message.id)
            assert set(read) <= old and not set(read) & new
        finally:
            await queue.close()

    run(main())


async def where(queue: AsyncHQueue, ids: list[MessageID]) -> int:
    async for message in queue.scan(ids[0]):
        if message.id == ids[0]:
            return message.partition_id
    raise AssertionError("not found")


def test_a_timer_put_is_invisible_and_cancellable(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        try:
            timers = await queue.put(Message("t", b"later"), delay=3600)
            assert isinstance(timers[0], Timer)
            assert [m async for m in queue.scan()] == []
            other = Timer(timers[0].partition_id, timers[0].due, timers[0].id, "another_queue")
            with pytest.raises(InvalidArgument, match="timer of queue 'another_queue'"):
                await queue.cancel(other)  # another queue's timer, though its partition, due and ID match
            assert timers[0].queue == queue_name and await queue.cancel(timers[0]) is True
            assert await queue.cancel(str(timers[0])) is False
        finally:
            await queue.close()

    run(main())


def test_a_timer_batch_takes_a_due_time_per_message(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        try:
            # Given one put of three timers, each with its own due time (one pending an hour)
            now = int(time.time() * 1000)
            dues = [now + 3_600_000, now + 200, now]
            timers = await queue.put(
                [Message("t", b"hour"), Message("t", b"soon"), Message("t", b"now")], 1, deliver_at=dues
            )
            assert [t.due for t in timers] == dues
            # When the two fall due, then they fire in due order, and the third stays cancellable
            for _ in range(100):
                fired = [m.value async for m in queue.scan()]
                if len(fired) == 2:
                    break
                await asyncio.sleep(0.05)
            assert fired == [b"now", b"soon"]
            assert await queue.cancel(timers[0]) is True
        finally:
            await queue.close()

    run(main())


def test_past_due_timers_on_a_ttl_queue_get_the_handles_kept(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name, 1, ttl=3)
        try:
            # Given timers due in the past on a queue whose messages live 3 s
            now = int(time.time() * 1000)
            asked = [now - 60_000, now - 1, 0]
            timers = await queue.put([Message("t", b"%d" % i) for i in range(3)], deliver_at=asked)
            # Then each handle says the due time kept: its ID's time (the server's, not the client's clock)
            assert [t.due for t in timers] == [max(a, t.id.timestamp) for a, t in zip(asked, timers, strict=True)]
        finally:
            await queue.close()

    run(main())


def test_a_group_receives_acks_and_nacks(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        try:
            await queue.put([Message("t", b"%d" % i) for i in range(20)], partition_id=1)
            async with queue.consumer("g", lease=60) as consumer:
                first = await consumer.receive(10, wait=2)
                assert len(first) == 10 and {d.attempt for d in first} == {1}
                assert await consumer.extend(first, lease=120) == 10
                assert await consumer.nack(first[:3], delay=0) == 3
                assert await consumer.ack(first[3:]) == 7
                seen: dict[bytes, int] = {}
                async for delivery in consumer:
                    seen[delivery.value] = delivery.attempt
                    await consumer.ack(delivery)
                    if len(seen) == 13:
                        break
                assert sorted(v for v, a in seen.items() if a == 2) == sorted(d.value for d in first[:3])
                assert await consumer.receive(wait=0) == []
                assert (await queue.pending("g")) == []
        finally:
            await queue.close()

    run(main())


def test_after_a_cancelled_receive_the_other_member_gets_every_message(api_url, queue_name):
    """Given member A waiting in receive, when its task is cancelled and messages
    arrive, then member B gets them all: its own partition's at once, and A's once
    A, calling no more, is past the member timeout (10 s), not after A's 5-minute
    lease. (What a cancelled receive had leased goes back at once: the next test.)"""

    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        try:
            async with queue.consumer("g", lease=300, member="a") as a, queue.consumer("g", lease=300, member="b") as b:
                await b.receive(wait=0)  # both members share the partitions
                waiting = asyncio.ensure_future(a.receive(100, wait=5))
                await asyncio.sleep(0.3)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                await queue.put([Message("t", b"%d" % i) for i in range(10)], partition_id=0)
                await queue.put([Message("t", b"%d" % i) for i in range(10, 20)], partition_id=1)
                got: list = []
                for _ in range(40):
                    got += await b.receive(100, wait=0.5)
                    if len(got) >= 20:
                        break
                assert sorted(int(d.value) for d in got) == list(range(20))
                await b.ack(got)
        finally:
            await queue.close()

    run(main())


def test_a_receive_cancelled_as_messages_are_handed_out_leaves_none_leased(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        try:
            await queue.put([Message("t", b"%d" % i) for i in range(50)])
            async with queue.consumer("g", lease=300, member="a") as a, queue.consumer("g", lease=300, member="b") as b:
                for _ in range(5):  # cancelled at once: before, during or after the call
                    task = asyncio.ensure_future(a.receive(10, wait=1))
                    await asyncio.sleep(0)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    else:
                        await a.nack(task.result(), delay=0)  # it finished first: give those back too
                got: list = []
                for _ in range(40):
                    got += await b.receive(100, wait=0.5)
                    if len(got) >= 50:
                        break
                assert sorted(int(d.value) for d in got) == list(range(50))
        finally:
            await queue.close()

    run(main())


def test_cancelled_tasks_leave_no_thread_and_no_socket(api_url, queue_name):
    threads, fds = hqueue_threads(), open_fds()

    async def main():
        for _ in range(3):
            queue = await made(api_url, queue_name + "x" * _)
            consumer = await queue.consumer("g").open()
            tasks = [asyncio.ensure_future(consumer.receive(wait=2)) for _ in range(5)]
            tasks.append(asyncio.ensure_future(queue.put(Message("t", b"x"))))
            tasks.append(asyncio.ensure_future(_scan_all(queue)))
            await asyncio.sleep(0.2)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await consumer.close()
            assert queue.connections <= len(tasks) + 4  # at most one per call under way (and cursor), kept idle
            await queue.close()
            assert queue.connections == 0

    run(main())
    wait_for(lambda: hqueue_threads() <= threads, 10, "the executor's threads to end")
    if api_url.startswith("hqueue://"):  # the server is in this process: count the client's ends
        wait_for(lambda: client_sockets(api_url) == 0, 10, "the client's sockets to close")
    else:
        assert open_fds() <= fds + 2  # the stand-in's and RocksDB's own files may come and go


async def _scan_all(queue: AsyncHQueue) -> int:
    return len([m async for m in queue.scan()])


def test_errors_are_typed(api_url, queue_name):
    async def main():
        with pytest.raises(QueueNotFound):
            await AsyncHQueue("no_such_queue", api_url).open()
        queue = await made(api_url, queue_name)
        try:
            with pytest.raises(TypeError):
                await queue.put("not a message")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument):
                await queue.consumer("g").receive(0)
            with pytest.raises(InvalidArgument):
                [m async for m in queue.scan(limit=-1)]
            async with AsyncHQueueAdmin(api_url) as admin:
                await admin.disable_queue(queue_name)
                with pytest.raises(QueueDisabled):
                    await queue.put(Message("t", b"x"))
                assert queue_name in [q.name for q in await admin.list_queues()]
                await admin.delete_queue(queue_name)
                assert not await admin.queue_exists(queue_name)
                assert not await admin.queue_exists("x" * 300)  # (InvalidQueueName through a server)
        finally:
            await queue.close()

    run(main())


def test_group_administration(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        try:
            await queue.put([Message("t", b"%d" % i) for i in range(5)], partition_id=0)
            async with queue.consumer("g") as consumer:
                await consumer.ack(await consumer.receive(wait=2))
            async with AsyncHQueueAdmin(api_url) as admin:
                assert await admin.list_groups(queue_name) == ["g"]
                described = await admin.describe_group(queue_name, "g")
                assert described["partitions"][0]["lag_messages"] == 0
                await admin.set_group_position(queue_name, "g", "all", 0)
                assert (await admin.describe_group(queue_name, "g"))["partitions"][0]["lag_messages"] == 5
                await admin.delete_group(queue_name, "g")
                assert await admin.list_groups(queue_name) == []
        finally:
            await queue.close()

    run(main())


def test_a_push_subscription_calls_an_async_listener(api_url, queue_name):
    from hqueue import Subscription

    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        got: list[bytes] = []
        loop_thread = threading.get_ident()

        async def listener(messages):
            assert threading.get_ident() == loop_thread  # called on the event loop
            got.extend(m.value for m in messages)

        try:
            subscriber = queue.create_subscriber(Subscription("s"), [listener])
            async with subscriber:
                await queue.put([Message("t", b"%d" % i) for i in range(10)])
                for _ in range(200):
                    if len(got) >= 10:
                        break
                    await asyncio.sleep(0.05)
            assert sorted(got) == sorted(b"%d" % i for i in range(10))
        finally:
            await queue.close()

    run(main())


def test_stopping_a_subscriber_cancels_its_listener_still_running_and_its_batch_comes_again(api_url, queue_name):
    """An async listener that did not return kept running after stop(), and closing the
    queue then took 50 s (every partition's push waited out its stop; an attacker pass)."""
    from hqueue import Subscription

    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        started, got = asyncio.Event(), []

        async def stuck(messages):
            started.set()
            await asyncio.sleep(3600)

        async def taking(messages):
            got.extend(m.value for m in messages)

        try:
            # Given a subscriber whose listener is still on a batch
            subscriber = queue.create_subscriber(Subscription("s"), [stuck])
            await subscriber.start()
            await queue.put(Message("t", b"held"), partition_id=0)
            await asyncio.wait_for(started.wait(), 30)
            # When it stops, then its listener is cancelled and the stop is prompt
            await asyncio.wait_for(subscriber.stop(), 10)
            await asyncio.sleep(0.2)
            assert [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "stuck"] == []
            # And the batch goes to the subscriber's next instance
            async with queue.create_subscriber(Subscription("s"), [taking], takeover_timeout=30):
                for _ in range(400):
                    if got:
                        break
                    await asyncio.sleep(0.05)
            assert got == [b"held"]
        finally:
            await asyncio.wait_for(queue.close(), 10)

    run(main())


def test_leaving_an_async_for_early_hands_back_the_rest_of_its_batch(api_url, queue_name):
    """After a break, 9 of the 10 received messages stayed leased until their lease ran
    out (an acceptance probe): the rest of the batch now goes back when the loop ends."""

    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        await queue.put([Message("t", b"m%d" % i) for i in range(10)])
        async with queue.consumer("g", member="a", lease=60) as a:
            async for delivery in a:
                await a.ack(delivery)
                break
            await asyncio.sleep(0.1)  # the generator is closed by the loop: its hand-back runs
            got = await a.receive(20, wait=5)
            assert sorted(d.value for d in got) == [b"m%d" % i for i in range(1, 10)]
            assert all(d.attempt == 1 for d in got)  # handed back unseen: no attempt counted
            await a.ack(got)
        await queue.close()

    run(main())


def test_closing_the_queue_under_running_calls_ends_them_and_opens_nothing_more(api_url, queue_name):
    """After close(), a receive waiting and a scan going on ended with raw executor errors,
    QueueNotFound, or went on over new connections (an acceptance probe)."""

    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        await queue.put([Message("t", b"x" * 1000)] * 1000, partition_id=0)
        consumer = await queue.consumer("g", topics=["never"]).open()
        receiving = asyncio.ensure_future(consumer.receive(wait=3))

        async def scan_slowly() -> int:
            n = 0
            async for _ in queue.scan(caching=50):
                n += 1
                await asyncio.sleep(0.005)
            return n

        scanning = asyncio.ensure_future(scan_slowly())
        await asyncio.sleep(0.3)
        await queue.close()
        outcomes = await asyncio.wait_for(asyncio.gather(receiving, scanning, return_exceptions=True), 10)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, RuntimeError) and "closed" in str(outcome), repr(outcome)
        await consumer.close()  # nothing left to leave
        await asyncio.sleep(0.3)
        assert queue.connections == 0

    run(main())


def test_what_an_acceptance_probe_found_on_every_store(api_url, queue_name):
    """A scan with limit=0 gave one message; a receive's own lease was not checked (through
    a server: ValueError, OverflowError, a decode error); calls still queued for a thread at
    close() ended as cancelled in tasks nobody cancelled."""

    async def main() -> None:
        queue = await made(api_url, queue_name, partitions=1)
        await queue.put([Message("t", b"v")] * 3)
        assert [m async for m in queue.scan(limit=0)] == []
        async with queue.consumer("g") as consumer:
            for lease in ("x", float("nan"), float("inf"), 10**9, True, 0):
                with pytest.raises(InvalidArgument, match="'lease' must be seconds"):
                    await consumer.receive(1, wait=0, lease=lease)
        calls = [asyncio.ensure_future(queue.put(Message("t", b"late"))) for _ in range(40)]
        await asyncio.sleep(0)
        await queue.close()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert not [o for o in outcomes if isinstance(o, asyncio.CancelledError)]
        assert all(isinstance(o, (list, RuntimeError)) for o in outcomes), outcomes

    run(main())


def test_arguments_an_attackers_pass_found_unchecked_through_a_server(api_url, queue_name):
    """Through a server, nack(delay=-0.002) went as the wire's "given back unseen" (no attempt
    counted: never dead-lettered), receive("5") and member=5 were decode errors, and a put's
    delay=inf an OverflowError; each is an InvalidArgument on every store now."""

    async def main() -> None:
        queue = await made(api_url, queue_name, partitions=1)
        await queue.put(Message("t", b"v"))
        with pytest.raises(InvalidArgument, match="'delay' must be finite seconds >= 0"):
            await queue.put(Message("t", b"v"), delay=float("inf"))
        with pytest.raises(InvalidArgument, match="'member' must be a non-empty string"):
            queue.consumer("g", member=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="'max_retries' must be an int"):
            queue.consumer("g", max_retries=1.5)  # type: ignore[arg-type]  # (went as the i32 1)
        with pytest.raises(TypeError, match="group name must be a str"):
            queue.consumer(b"g")  # type: ignore[arg-type]  # (went as the name "g")
        async with queue.consumer("g") as consumer:
            with pytest.raises(InvalidArgument, match="'max_messages' must be an int"):
                await consumer.receive("5", wait=0)  # type: ignore[arg-type]
            got = await consumer.receive(1, wait=2)
            for delay in (-0.002, -0.001, -5, "x", float("inf")):
                with pytest.raises(InvalidArgument, match="'delay' must be seconds in"):
                    await consumer.nack(got, delay=delay)  # type: ignore[arg-type]
            assert await consumer.nack(got, delay=0) == 1
            assert [d.attempt for d in await consumer.receive(1, wait=2)] == [2]

    run(main())


def test_opening_a_scan_is_one_call_with_one_deadline(tmp_path):
    """The async scan read the queue's definition and then opened its cursors (the
    partitions' owners, a scanner each), each with its own deadline: on a slow link it took
    two timeouts to open (an attacker's probe: 4 s with timeout=2). Opening it is one call,
    as the blocking scan's is: here its two round trips of 1.2 s pass the 2 s timeout."""
    from hqueue import DeadlineExceeded
    from hqueue.config import INFO_CACHE_SECONDS
    from hqueue.server import HQueueServer

    from ..processes import slow_link

    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 1)
        with slow_link(server.address, 1.2) as relay:

            async def main() -> float:
                async with AsyncHQueue("q", f"hqueue://{relay}", timeout=2) as queue:
                    await asyncio.sleep(INFO_CACHE_SECONDS + 0.1)  # (its definition is read again)
                    started = time.monotonic()
                    with pytest.raises(DeadlineExceeded):
                        [m async for m in queue.scan()]
                    return time.monotonic() - started

            assert run(main()) < 4  # (its one deadline, and a margin for a loaded machine)
    finally:
        server.stop()


def test_a_handle_belongs_to_the_event_loop_it_was_first_used_in(api_url, queue_name):
    """Used from a second loop it hung, stored puts it reported failed, or failed with
    "Event loop is closed" (an acceptance probe): it says so now."""
    queue = run(made(api_url, queue_name, partitions=1))
    with pytest.raises(RuntimeError, match="belongs to the event loop it was first used in"):
        run(queue.put(Message("t", b"v")))


def test_a_consumer_and_a_scanner_belong_to_the_event_loop_they_were_first_used_in(api_url, queue_name):
    """Their handle refused another loop, they did not (an attacker's pass): through a
    server a consumer's receive waited out the client's timeout and raised a bare
    TimeoutError, in process it went on without its heartbeats; a scan left part-read
    when its asyncio.run ended said it was done (StopAsyncIteration)."""
    held = {}

    async def first():
        queue = held["queue"] = await made(api_url, queue_name, partitions=1)
        await queue.put([Message("t", b"%d" % i) for i in range(3)], partition_id=0)
        consumer = held["consumer"] = queue.consumer("g")
        assert len(await consumer.receive(1, wait=2)) == 1
        scanner = held["scanner"] = queue.scan(caching=1)
        assert (await scanner.__anext__()).value == b"0"

    run(first())
    consumer, scanner = held["consumer"], held["scanner"]

    async def second():
        for call in (consumer.receive(1, wait=0), consumer.ack([]), consumer.nack([]), scanner.__anext__()):
            with pytest.raises(RuntimeError, match="belongs to the event loop it was first used in"):
                await call

    started = time.monotonic()
    run(second())
    assert time.monotonic() - started < 2

    async def huge_caching():  # (embedded and memory failed in islice, a server took it)
        for caching in (0, True, 2**31, 10**19):
            with pytest.raises(InvalidArgument, match="'caching' must be an int in 1..2147483647"):
                async with AsyncHQueue(queue_name, api_url) as queue:
                    queue.scan(caching=caching)

    run(huge_caching())
    run(held["queue"].close())  # (from the next loop: test_a_handle_left_open_when_its_loop_ended_...)


def test_a_handle_left_open_when_its_loop_ended_closes_from_another(api_url, queue_name):
    """A handle its ``asyncio.run`` left open (a fixture closing it in the next loop) raised
    "Event loop is closed" on close through a server, and kept its connections and the
    member's leases: it closes now, and another member gets the message at once."""
    holder = {}

    async def lease_one():
        queue = holder["queue"] = await made(api_url, queue_name, partitions=1)
        await queue.put(Message("t", b"v"), partition_id=0)
        holder["consumer"] = queue.consumer("g", lease=60)
        assert len(await holder["consumer"].receive(1, wait=2)) == 1

    run(lease_one())
    run(holder["queue"].close())
    assert holder["queue"].closed
    if api_url.startswith("hqueue://"):
        wait_for(lambda: client_sockets(api_url) == 0, timeout=5)

    async def other_member():
        async with AsyncHQueue(queue_name, api_url) as queue, queue.consumer("g", lease=60) as other:
            return await other.receive(1, wait=5)

    started = time.monotonic()
    assert len(run(other_member())) == 1
    assert time.monotonic() - started < 4  # handed back, not lapsed (a lease of 60 s)


@pytest.mark.parametrize("with_producer", [False, True])
def test_a_close_from_another_thread_while_the_handle_s_loop_runs_is_refused(tmp_path, with_producer):
    """Without a producer such a close released the store under the running loop; with
    one it raised (an attacker's probe). Both raise; the handle goes on in its own loop."""
    import queue as threads_queue

    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    outcome: threads_queue.Queue = threads_queue.Queue()

    async def owner() -> list[bytes]:
        queue = await AsyncHQueue("q", url).open()
        if with_producer:
            await queue.producer().send(Message("t", b"sent"))
        else:
            await queue.put(Message("t", b"sent"))
        closer = threading.Thread(target=lambda: outcome.put(_raised(lambda: asyncio.run(queue.close()))))
        closer.start()
        await asyncio.to_thread(closer.join)
        await queue.put(Message("t", b"after"))  # (still open, in its loop)
        values = [m.value async for m in queue.scan()]
        await queue.close()
        return values

    assert run(owner()) == [b"sent", b"after"]
    error = outcome.get_nowait()
    assert isinstance(error, RuntimeError) and "belongs to the event loop" in str(error)


def _raised(call) -> BaseException | None:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - the outcome is the test's
        return e
    return None


def test_starting_a_started_subscriber_again_keeps_its_handle(tmp_path):
    """The second start raised SubscriberActive, as it should, but dropped the running
    subscriber's own handle, whose store stayed open after stop() (an acceptance probe)."""
    from hqueue import SubscriberActive, Subscription

    async def listener(messages) -> None:
        pass

    async def main() -> None:
        queue = await made(f"local://{tmp_path}", "q", partitions=1)
        subscriber = queue.create_subscriber(Subscription("s"), [listener], takeover_timeout=0.5)
        await subscriber.start()
        handle = subscriber._handle
        with pytest.raises(SubscriberActive):
            await subscriber.start()
        assert subscriber._handle is handle and handle is not None
        await subscriber.stop()  # (closes the handle it kept)
        assert subscriber._handle is None
        await queue.close()

    run(main())


@pytest.mark.parametrize("second", ["after", "together"])
def test_a_failed_second_start_leaves_stop_cancelling_the_running_listeners(tmp_path, second):
    """A second start of a running subscriber (or one awaited together with the first) put
    its own, unused listeners where stop() looked for those to cancel: the running one's
    listener, busy over a batch, ran on after stop() returned."""
    from hqueue import Message, SubscriberActive, Subscription

    async def main() -> list[str]:
        queue = await made(f"local://{tmp_path}", "q", partitions=1)
        began, seen = asyncio.Event(), []

        async def busy(messages) -> None:
            began.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        subscriber = queue.create_subscriber(Subscription("s"), [busy], takeover_timeout=0.5)
        if second == "together":
            results = await asyncio.gather(subscriber.start(), subscriber.start(), return_exceptions=True)
            assert sorted(type(r).__name__ for r in results) == ["AsyncSubscriber", SubscriberActive.__name__]
        else:
            await subscriber.start()
        await queue.put(Message("t", b"m"), partition_id=0)
        await asyncio.wait_for(began.wait(), 10)
        if second == "after":
            with pytest.raises(SubscriberActive):
                await subscriber.start()
        await asyncio.wait_for(subscriber.stop(), 10)
        await asyncio.sleep(0.1)  # (the cancellation reaches the listener's task)
        after_stop = list(seen)
        await queue.close()
        return after_stop

    assert run(main()) == ["cancelled"]


def test_of_two_starts_at_once_the_one_that_wins_runs_even_when_the_other_fails_first(tmp_path, monkeypatch):
    """The start that failed (SubscriberActive, after takeover_timeout) forgot the subscriber
    while the other was still starting: that one then took itself for stopped (as by its
    queue's close) and stopped what it had started."""
    from hqueue import SubscriberActive, Subscription
    from hqueue.aio import subscriber as aio_subscriber

    start, calls = aio_subscriber.AsyncSubscriber._start, []

    def slow_first(self, listeners):
        calls.append(None)
        started = start(self, listeners)
        if len(calls) == 1:
            time.sleep(1.5)  # (started: the other start fails meanwhile)
        return started

    monkeypatch.setattr(aio_subscriber.AsyncSubscriber, "_start", slow_first)

    async def main() -> None:
        queue = await made(f"local://{tmp_path}", "q", partitions=1)

        async def listener(messages) -> None:
            pass

        subscriber = queue.create_subscriber(Subscription("s"), [listener], takeover_timeout=0.2)
        first = asyncio.ensure_future(subscriber.start())
        await asyncio.sleep(0.3)  # (the first has its subscriber, and sleeps)
        with pytest.raises(SubscriberActive):
            await subscriber.start()
        assert not first.done()
        await first
        assert subscriber.subscriber is not None, "the start that won stopped what it started"
        await subscriber.stop()
        await queue.close()

    run(main())


def test_a_member_closed_while_another_task_receives_in_process_leaves_the_group(tmp_path):
    """On an embedded store, a receive another task awaited went on after its consumer's
    close, taking in turn until its wait ended, each take counting the member in again
    (a review's probe: members ['a', 'b'] 1.5 s after the close)."""

    async def main() -> tuple[list, list[str], list[int]]:
        url = f"local://{tmp_path}/data"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 4)
        async with AsyncHQueue("q", url) as queue:
            async with queue.consumer("g", member="b") as b:
                await b.receive(wait=0)
                a = queue.consumer("g", member="a")
                receiving = asyncio.ensure_future(a.receive(wait=30))
                await asyncio.sleep(0.3)
                await a.close()
                got = await receiving  # ended by the close, not by its wait
                async with AsyncHQueueAdmin(url) as admin:
                    members = (await admin.describe_group("q", "g"))["members"]
                for partition in range(4):
                    await queue.put(Message("t", b"%d" % partition), partition)
                return got, members, sorted(d.partition_id for d in await b.receive(10, wait=5))

    got, members, partitions = asyncio.run(asyncio.wait_for(main(), 20))
    assert (got, members, partitions) == ([], ["b"], [0, 1, 2, 3])


def test_a_subscriber_left_running_by_an_ended_loop_stops_at_its_next_push_and_frees_its_name(tmp_path):
    """An async subscriber whose asyncio.run returned without a stop went on in its threads:
    each push failed ("Event loop is closed", logged, again and again), nothing was
    delivered, and every later start of the name in the process raised SubscriberActive
    (an attacker's probe). Its next push now finds the loop ended: the batch comes again, to
    the next subscriber of the name, and the old one stops."""
    from hqueue import Subscription

    url, seen = f"local://{tmp_path}/data", []

    async def listener(messages) -> None:
        seen.extend(m.value for m in messages)

    async def first() -> None:
        queue = await made(url, "q", partitions=1)
        await queue.create_subscriber(Subscription("s"), [listener]).start()
        await queue.put(Message("t", b"a"))
        await wait_async(lambda: seen == [b"a"])  # (and returns without stopping it, nor closing)

    async def second() -> list[bytes]:
        async with AsyncHQueue("q", url) as queue:
            await queue.put(Message("t", b"b"))
            await wait_async(lambda: not subscriber_threads(), 10)  # (the push found the loop ended)
            subscriber = queue.create_subscriber(Subscription("s"), [listener], takeover_timeout=3)
            async with subscriber:  # (SubscriberActive before)
                await wait_async(lambda: b"b" in seen, 10)
            return seen

    asyncio.run(first())
    assert asyncio.run(asyncio.wait_for(second(), 30)) == [b"a", b"b"]


@pytest.mark.parametrize("store", ["local", "memory"])
def test_a_receive_another_task_awaits_returns_nothing_when_the_queue_handle_closes(tmp_path, store):
    """asyncio.md: a close ends the receives other tasks await (they return []). Closing the
    queue handle (which closes its consumers) made such a receive raise "RuntimeError:
    closed: the store ... was released" about 1 time in 4 on an embedded store: the receive,
    ended by its consumer's close, left the group again (its take may have counted the
    member in), and the handle released the store under that leave (an attacker's probe)."""

    async def main() -> list:
        url = f"local://{tmp_path}/data" if store == "local" else "memory://"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 2)
            outcomes = []
            for attempt in range(30):
                queue = AsyncHQueue("q", url)
                consumer = queue.consumer("g")
                await consumer.receive(1, wait=0)
                receiving = asyncio.ensure_future(consumer.receive(1, wait=5))
                await asyncio.sleep(0.02 + (attempt % 7) * 0.013)
                await queue.close()
                try:
                    outcomes.append(await asyncio.wait_for(receiving, 10))
                except Exception as e:  # noqa: BLE001 - what the test counts
                    outcomes.append(f"{type(e).__name__}: {e}")
            return outcomes

    outcomes = asyncio.run(main())
    assert [o for o in outcomes if o != []] == []


@pytest.mark.parametrize("url", ["local:///nowhere", "hqueue://127.0.0.1:1"])
@pytest.mark.parametrize("timeout", [0, -1, True, float("nan"), float("inf"), 1e10, 2**70, "5"])
def test_a_blocking_handle_refuses_a_bad_timeout_when_it_is_made(url, timeout):
    """1e10 s was taken, and then every call raised OverflowError from socket.settimeout (an
    attacker's probe): a deadline is at most 7 days."""
    for handle in (lambda: HQueue("q", url, timeout=timeout), lambda: HQueueAdmin(url, timeout=timeout)):
        with pytest.raises(InvalidArgument, match="'timeout' must be > 0 and at most 604800 seconds"):
            handle()


@pytest.mark.parametrize(
    ("url", "options", "error"),
    [
        ("memory://", {"timeout": 3}, "'timeout' is for hqueue:// servers and a local:// store"),
        ("local:///nowhere", {"token": "t" * 20}, "'token' is for hqueue:// servers"),
        ("local:///nowhere", {"timeout": 0}, "'timeout' must be > 0"),
        ("local:///nowhere", {"timeout": True}, "'timeout' must be > 0"),
        ("local:///nowhere", {"timeout": 1e10}, "at most 604800 seconds"),
        ("hqueue://127.0.0.1:1", {"group_limits": object()}, "'group_limits' are for a store in this process"),
        ("memory://", {"workers": 0}, "'workers' must be an int in 1..64"),
    ],
)
def test_options_that_do_not_go_with_the_url_are_refused_when_the_handle_is_made(url, options, error):
    """As HQueue refuses them: not at the first call (a producer's first send said so)."""
    for handle in (lambda: AsyncHQueue("q", url, **options), lambda: AsyncHQueueAdmin(url, **options)):
        with pytest.raises(InvalidArgument, match=error):
            handle()


def test_closing_the_queue_closes_the_consumers_made_there(api_url, queue_name):
    """A consumer left open (referenced, never closed) kept heartbeating a closed queue every
    second for good; the queue's close ends it."""

    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        await queue.put([Message("t", b"%d" % i) for i in range(5)], partition_id=0)
        consumer = queue.consumer("g", lease=60)
        assert len(await consumer.receive(5, wait=2)) == 5
        await queue.close()
        await asyncio.sleep(0)
        assert consumer.closed and consumer._heartbeats is not None and consumer._heartbeats.done()
        assert not [t for t in asyncio.all_tasks() if "_heartbeat" in repr(t)]
        async with AsyncHQueue(queue_name, api_url) as again:
            assert await again.pending("g") == [] or all(p.member is None for p in await again.pending("g"))
            async with again.consumer("g") as other:
                got = await other.receive(5, wait=2)
                assert len(got) == 5 and {d.attempt for d in got} == {1}

    run(main())


def test_a_cancelled_start_or_stop_of_a_subscriber_leaves_none_running(api_url, queue_name):
    """A start cancelled meanwhile (``wait_for``, a task's cancel, an ``async with`` in a
    cancelled task) raised CancelledError, and the subscriber it started ran on, unseen:
    its heartbeats kept the name from every later start (SubscriberActive). A stop
    cancelled before its thread took it was dropped, and the next stop did nothing
    (attackers' passes)."""
    from hqueue import Subscription
    from hqueue.errors import SubscriberActive

    async def main():
        queue = await made(api_url, queue_name, partitions=2)
        got: list[bytes] = []

        async def listener(messages):
            got.extend(m.value for m in messages)

        try:
            for delay in (0, 0, 0.001, 0.005):
                # Given starts cancelled at once and a little later
                starting = asyncio.ensure_future(queue.create_subscriber(Subscription("s"), [listener]).start())
                await asyncio.sleep(delay)
                starting.cancel()
                try:
                    started = await starting
                except asyncio.CancelledError:
                    continue
                await started.stop()  # (it started before the cancel came)
            # Then the name starts again at once, and none of those takes the pushes
            subscriber = queue.create_subscriber(Subscription("s"), [listener], takeover_timeout=10)
            await subscriber.start()
            await queue.put(Message("t", b"once"), partition_id=0)
            for _ in range(200):
                if got:
                    break
                await asyncio.sleep(0.05)
            assert got == [b"once"]
            # When its stop is cancelled before it ran, and stop is called again
            stopping = asyncio.ensure_future(subscriber.stop())
            await asyncio.sleep(0)
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
            await subscriber.stop()
            # Then it stopped all the same: the name is free again at once
            again = queue.create_subscriber(Subscription("s"), [listener])
            try:
                await asyncio.wait_for(again.start(), 10)
            except SubscriberActive as e:
                pytest.fail(f"the stopped subscriber still runs: {e}")
            await again.stop()
        finally:
            await queue.close()

    run(main())
    wait_for(lambda: not subscriber_threads(), 10, "the subscribers' threads to end")


def test_a_queue_s_first_call_cancelled_leaves_the_handle_usable(api_url, queue_name):
    """The first call opens the handle; cancelled there (``wait_for`` in a web request),
    it closed the handle for good: every later call raised RuntimeError (an attacker's pass)."""

    async def main():
        async with AsyncHQueueAdmin(api_url) as admin:
            await admin.create_queue(queue_name, 1)
        queue = AsyncHQueue(queue_name, api_url)
        try:
            putting = asyncio.ensure_future(queue.put(Message("t", b"maybe")))
            await asyncio.sleep(0)
            putting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await putting
            assert not queue.closed
            await queue.put(Message("t", b"then"))
            assert b"then" in [m.value async for m in queue.scan()]
        finally:
            await queue.close()
        missing = AsyncHQueue(queue_name + "_missing", api_url)
        with pytest.raises(QueueNotFound):
            await missing.put(Message("t", b"x"))
        assert not missing.closed  # (made later, the next call finds it)
        async with AsyncHQueueAdmin(api_url) as admin:
            await admin.create_queue(queue_name + "_missing", 1)
        assert len(await missing.put(Message("t", b"x"))) == 1
        await missing.close()

    run(main())


def test_a_consumer_s_close_cancelled_still_leaves_the_group(api_url, queue_name):
    """close() marked the consumer closed, then its leave was cancelled with it: the member
    held its leases to their end, and a second close() did nothing (an attacker's pass)."""

    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        try:
            await queue.put([Message("t", b"%d" % i) for i in range(10)], partition_id=0)
            consumer = queue.consumer("g", member="a", lease=60)
            assert len(await consumer.receive(10, wait=2)) == 10
            closing = asyncio.ensure_future(consumer.close())
            await asyncio.sleep(0)
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
            await consumer.close()
            for _ in range(100):  # (the leave goes on by itself)
                if not [p for p in await queue.pending("g") if p.member == "a"]:
                    break
                await asyncio.sleep(0.05)
            assert [p for p in await queue.pending("g") if p.member == "a"] == []
            async with queue.consumer("g", member="b") as other:
                assert len(await other.receive(10, wait=2)) == 10
        finally:
            await queue.close()

    run(main())


def test_closing_the_queue_stops_the_subscribers_made_there(api_url, queue_name):
    """As HQueue.close does: they ran on after the loop ended, each push failing on it."""
    from hqueue import Subscription

    async def main():
        queue = await made(api_url, queue_name, partitions=1)
        got: list[bytes] = []

        async def listener(messages):
            got.extend(m.value for m in messages)

        await queue.create_subscriber(Subscription("s"), [listener]).start()
        assert subscriber_threads()
        await queue.close()

    run(main())
    wait_for(lambda: not subscriber_threads(), 10, "the subscriber's threads to end")


def test_a_subscriber_starting_while_its_queue_closes_is_stopped(api_url, queue_name):
    """It joined the queue's subscribers only once started: a close meanwhile missed it,
    and it ran on (a review)."""
    from hqueue import Subscription

    async def main():
        queue = await made(api_url, queue_name, partitions=1)

        async def listener(messages):
            pass

        starting = asyncio.ensure_future(queue.create_subscriber(Subscription("s"), [listener]).start())
        await asyncio.sleep(0)
        await queue.close()
        await starting

    run(main())
    wait_for(lambda: not subscriber_threads(), 10, "the subscriber's threads to end")


async def key_in_order_handed_on(url: str) -> tuple[list[bytes], float]:
    """Queue q's key k: a holds its first message, b waits for the next; a acks. What b
    got, and how long after the ack."""
    async with AsyncHQueue("q", url) as queue:
        await queue.put([Message("k", b"1"), Message("k", b"2")], 0)
        async with (
            queue.consumer("g", member="a", key_affinity="topic") as a,
            queue.consumer("g", member="b", key_affinity="topic") as b,
        ):
            (first,) = await a.receive(1, wait=2)
            waiting = asyncio.ensure_future(b.receive(1, wait=20))
            await asyncio.sleep(0.3)  # (b waits: the key's next message is out until the ack)
            started = time.monotonic()
            await a.ack([first])
            return [d.value for d in await waiting], time.monotonic() - started


def test_an_ack_wakes_an_in_process_receive_waiting_for_its_key_s_next_message(tmp_path, monkeypatch):
    """On an embedded store an asyncio receive was woken by writes only: one waiting for a
    key in order's next message (out until acked) looked again at its next poll."""
    from hqueue.aio import executor

    monkeypatch.setattr(executor, "RECEIVE_POLL", 30.0)
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    values, took = asyncio.run(asyncio.wait_for(key_in_order_handed_on(url), 40))
    assert values == [b"2"] and took < 10  # (not at its next poll, 30 s away)


def test_group_events_still_wake_an_in_process_receive_after_the_store_was_served_again(tmp_path, monkeypatch):
    """The asyncio receives of an engine heard the group service of its first receive; a
    server started and stopped in the process gives the store a new one (an attacker's pass)."""
    from hqueue.aio import executor
    from hqueue.server import HQueueServer

    monkeypatch.setattr(executor, "RECEIVE_POLL", 30.0)
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url):  # (the engine, throughout)

        async def first() -> None:
            async with AsyncHQueue("q", url) as queue, queue.consumer("g0", member="z") as z:
                assert await z.receive(1, wait=0.1) == []

        asyncio.run(first())
        HQueueServer(url, port=0).start().stop()
        values, took = asyncio.run(asyncio.wait_for(key_in_order_handed_on(url), 40))
    assert values == [b"2"] and took < 10
