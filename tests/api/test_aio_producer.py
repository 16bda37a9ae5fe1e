"""The asyncio producer (``AsyncHQueue.producer()``) on every store URL: sends awaited
together go out in few puts, each send's ID is stored, order per partition is kept,
backpressure and errors are typed, cancellation leaves unsent messages out, and
closing sends what is held."""

from __future__ import annotations

import asyncio

import pytest

from hqueue import (
    InvalidArgument,
    Message,
    MessageID,
    MessageTooLarge,
    ProducerClosed,
    QueueDisabled,
    QueueNotFound,
)
from hqueue.aio import AsyncHQueue, AsyncHQueueAdmin, AsyncProducer
from hqueue.producer import SEND_OVERHEAD
from hqueue.storage.embedded import EmbeddedStorage

from ..processes import wait_for
from .test_aio import client_sockets, made, run


def test_sends_awaited_together_go_out_in_few_puts_and_are_all_stored(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        async with queue.producer(linger_ms=5) as producer:
            assert isinstance(producer, AsyncProducer)

            async def sender(t: int) -> list[MessageID]:  # one task: one key, one message at a time
                return [await producer.send(Message("t", b"%d-%d" % (t, i)), key=f"k{t}") for i in range(50)]

            per_task = await asyncio.gather(*(sender(t) for t in range(16)))
            for ids in per_task:
                assert ids == sorted(ids) and len(set(ids)) == len(ids)  # one key: one partition, in order
            assert producer.sent == 800 and producer.puts < 400, producer.puts
        stored = {(m.partition_id, m.id): m.value async for m in queue.scan()}
        assert len(stored) == 800
        await queue.close()

    run(main())


def test_routing_is_put_s_and_bad_sends_queue_nothing(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name, partitions=4)
        async with queue.producer() as producer:
            await producer.send(Message("t", b"p2"), partition=2)
            await producer.send(Message("t", b"k"), key="shop-42")
            with pytest.raises(TypeError):
                await producer.send("not a message")  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await producer.send(Message("t", b"x"), key="a", partition=1)
            with pytest.raises(InvalidArgument):
                await producer.send(Message("t", b"x"), partition=9)
        await queue.put(Message("t", b"k2"), key="shop-42")
        by_partition = {m.value: m.partition_id async for m in queue.scan()}
        assert by_partition[b"p2"] == 2 and by_partition[b"k"] == by_partition[b"k2"]
        assert len(by_partition) == 3
        await queue.close()

    run(main())


def test_options_are_checked_when_the_producer_is_made(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        with pytest.raises(InvalidArgument):
            queue.producer(max_batch=0)
        with pytest.raises(TypeError):
            queue.producer(linger_ms="5")  # type: ignore[arg-type]
        await queue.close()

    run(main())


def test_a_full_buffer_sends_what_lingers_and_a_cancelled_send_is_left_out(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        producer = queue.producer(linger_ms=60_000, buffer_bytes=3 * (101 + SEND_OVERHEAD), block_timeout=5)
        sends = [asyncio.ensure_future(producer.send(Message("t", b"x" * 100), partition=0)) for _ in range(3)]
        await asyncio.sleep(0.05)  # the three are held: the batch lingers a minute
        sends[1].cancel()
        # A send that finds no room makes the held batch go now (as Kafka's), then fits
        fourth = asyncio.ensure_future(producer.send(Message("t", b"x" * 100), partition=0))
        done, _ = await asyncio.wait([sends[0], sends[2]], timeout=10)
        assert len(done) == 2 and isinstance(sends[0].result(), MessageID) and isinstance(sends[2].result(), MessageID)
        assert sends[1].cancelled()
        for _ in range(500):  # the fourth, in the room they left, lingers in a batch of its own
            if producer._batches.open:
                break
            await asyncio.sleep(0.01)
        assert await producer.flush(timeout=30)
        assert isinstance(await fourth, MessageID)
        await producer.close()
        with pytest.raises(ProducerClosed):
            await producer.send(Message("t", b"late"))
        assert len([m async for m in queue.scan()]) == 3
        await queue.close()

    run(main())


def test_a_send_cancelled_while_it_waits_to_wake_the_sender_is_left_out(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        producer = queue.producer(linger_ms=60_000)
        await producer.open()
        # Given a send that queued its message and waits for the producer's lock (another
        # task's a moment, as after a wake-up of many), to tell the sender
        changed = producer._changed
        await changed.acquire()
        send = asyncio.ensure_future(producer.send(Message("t", b"cancelled"), partition=0))
        await asyncio.sleep(0.05)
        # When it is cancelled there, then its message is left out of the batch that goes
        send.cancel()
        changed.release()
        with pytest.raises(asyncio.CancelledError):
            await send
        assert await producer.flush(timeout=30)
        await producer.close()
        assert [m.value async for m in queue.scan()] == []
        await queue.close()

    run(main())


def test_a_failed_put_fails_its_sends_with_the_put_s_error(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        async with queue.producer() as producer:
            await producer.send(Message("t", b"before"))
            async with AsyncHQueueAdmin(api_url) as admin:
                await admin.disable_queue(queue_name)
            with pytest.raises(QueueDisabled):
                await producer.send(Message("t", b"while disabled"))
            async with AsyncHQueueAdmin(api_url) as admin:
                await admin.enable_queue(queue_name)
            assert isinstance(await producer.send(Message("t", b"after")), MessageID)
        await queue.close()

    run(main())


def test_a_producer_checks_sends_against_its_queue_made_again_after_a_refused_put(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        async with queue.producer() as producer:
            await producer.send(Message("t", b"before"), partition=0)
            async with AsyncHQueueAdmin(api_url) as admin:  # made again: 2 partitions, 100 bytes at most
                await admin.disable_queue(queue_name)
                await admin.delete_queue(queue_name)
                await admin.create_queue(queue_name, 2, max_message_bytes=100)
            with pytest.raises(QueueNotFound, match="created again"):  # a batch's put refused (routed by the
                await producer.send(Message("t", b"x" * 200), partition=0)  # old definition): it is read again
            puts = producer.puts
            with pytest.raises(MessageTooLarge):  # so send itself refuses it now, queueing nothing
                await producer.send(Message("t", b"x" * 200), partition=0)
            assert producer.puts == puts
            assert isinstance(await producer.send(Message("t", b"after"), partition=1), MessageID)
        await queue.close()

    run(main())


def test_keyed_sends_follow_the_queue_made_again_with_more_partitions(api_url, queue_name):
    """As the blocking producer's (test_producer.py)."""
    from hqueue.checks import partition_for_key

    async def main() -> dict[bytes, int]:
        queue = await made(api_url, queue_name, partitions=2)
        async with queue.producer() as producer:
            await producer.send(Message("t", b"before"), key=b"user-4")
            async with AsyncHQueueAdmin(api_url) as admin:
                await admin.disable_queue(queue_name)
                await admin.delete_queue(queue_name)
                await admin.create_queue(queue_name, 16)
            try:  # (routed by the old definition, unless that one was 2 s old already)
                await producer.send(Message("t", b"at once"), key=b"user-4")
            except QueueNotFound as e:
                assert "deleted and created again since this client read its definition" in str(e)
            for i in range(3):
                await producer.send(Message("t", b"after %d" % i), key=b"user-4")
            where = {m.value: m.partition_id async for m in queue.scan()}
        await queue.close()
        return where

    where, expected = run(main()), partition_for_key(b"user-4", 16)
    assert where.pop(b"at once", expected) == expected
    assert where == dict.fromkeys([b"after 0", b"after 1", b"after 2"], expected)


def test_closing_the_queue_sends_what_its_producers_hold(api_url, queue_name):
    async def main():
        queue = await made(api_url, queue_name)
        producer = queue.producer(linger_ms=60_000)
        held = asyncio.ensure_future(producer.send(Message("t", b"held")))
        await asyncio.sleep(0.05)
        await queue.close()
        assert isinstance(await held, MessageID) and producer.closed
        async with AsyncHQueue(queue_name, api_url) as again:
            assert [m.value async for m in again.scan()] == [b"held"]

    run(main())


def test_a_producer_belongs_to_the_event_loop_it_was_first_used_in(tmp_path):
    """Used from a second loop (another asyncio.run) its send waited for ever on the first
    loop's sender task, which had died with it (an acceptance probe)."""

    async def first() -> tuple[AsyncHQueue, AsyncProducer]:
        async with AsyncHQueueAdmin(f"local://{tmp_path}") as admin:
            await admin.create_queue("q", 1)
        queue = AsyncHQueue("q", f"local://{tmp_path}")
        producer = queue.producer()
        await producer.send(Message("t", b"first loop"))
        return queue, producer

    queue, producer = run(first())
    with pytest.raises(RuntimeError, match="belongs to the event loop it was first used in"):
        run(producer.send(Message("t", b"second loop")))


def test_a_handle_whose_producer_s_loop_ended_closes_from_the_next_loop(api_url, queue_name):
    """A handle an ``asyncio.run`` left open with a producer raised "Event loop is closed"
    on every close from the next loop (the producer waited on the dead loop's tasks): the
    store stayed held and its threads ran (an attacker's probe). It closes now: the send
    the ended loop cancelled is not stored, the one acknowledged is."""
    holder = {}

    async def first() -> None:
        queue = holder["queue"] = await made(api_url, queue_name, partitions=1)
        producer = holder["producer"] = queue.producer(linger_ms=60_000)
        acked = asyncio.ensure_future(producer.send(Message("t", b"acked")))
        await asyncio.sleep(0.05)
        assert await producer.flush(10)
        assert isinstance(await acked, MessageID)
        asyncio.ensure_future(producer.send(Message("t", b"cancelled with its loop")))
        await asyncio.sleep(0.05)

    run(first())
    run(holder["queue"].close())
    assert holder["queue"].closed and holder["producer"].closed
    if api_url.startswith("hqueue://"):
        wait_for(lambda: client_sockets(api_url) == 0, timeout=5)
    if api_url.startswith("local://"):
        EmbeddedStorage(api_url.removeprefix("local://")).close()  # (StorageLocked while still held)

    async def stored() -> list[bytes]:
        async with AsyncHQueue(queue_name, api_url) as again:
            return [m.value async for m in again.scan()]

    assert run(stored()) == [b"acked"]


def test_a_first_send_caught_by_its_queue_s_close_is_closed_or_stored(api_url, queue_name):
    """A first send opens its producer; a close of the queue meanwhile made it fail with the
    released store's RuntimeError on memory and embedded stores (an acceptance probe)."""

    async def main():
        await made(api_url, queue_name)
        queue = AsyncHQueue(queue_name, api_url)
        producer = queue.producer(linger_ms=200)
        sending = asyncio.ensure_future(producer.send(Message("t", b"caught")))
        await asyncio.sleep(0)  # it is opening the producer
        await queue.close()
        try:
            return await sending
        except ProducerClosed:
            return None

    result = run(main())
    assert result is None or isinstance(result, MessageID)


def test_sends_made_before_a_close_are_sent_though_the_producer_was_still_opening(api_url, queue_name):
    """Sends made before close() that still waited for the producer's opening failed with
    ProducerClosed (22-140 of 200 in an attacker's probe): the close sends them now."""

    async def main():
        queue = await made(api_url, queue_name)
        producer = queue.producer(linger_ms=5)
        sends = [asyncio.ensure_future(producer.send(Message("t", b"%d" % i))) for i in range(200)]
        await asyncio.sleep(0)  # they are opening the producer
        await producer.close()
        ids = await asyncio.gather(*sends)
        with pytest.raises(ProducerClosed):  # and one made after the close is refused
            await producer.send(Message("t", b"late"))
        stored = sorted([m.value async for m in queue.scan()])
        await queue.close()
        return ids, stored

    ids, stored = run(main())
    assert all(isinstance(i, MessageID) for i in ids) and stored == sorted(b"%d" % i for i in range(200))


def test_a_close_that_gives_up_on_the_opening_sends_nothing_after_it(api_url, queue_name):
    """close(timeout) returned while the producer still opened, and the sends made before it
    were then stored anyway, after the close (a review): past the timeout they fail."""

    async def main():
        queue = await made(api_url, queue_name)
        producer = queue.producer()
        reach = producer._engine_of

        async def slowly():
            await asyncio.sleep(0.5)
            return await reach()

        producer._engine_of = slowly
        sends = [asyncio.ensure_future(producer.send(Message("t", b"%d" % i))) for i in range(5)]
        await asyncio.sleep(0)
        await producer.close(timeout=0.1)
        results = await asyncio.gather(*sends, return_exceptions=True)
        stored = [m async for m in queue.scan()]
        await queue.close()
        return results, stored

    results, stored = run(main())
    assert all(isinstance(r, ProducerClosed) for r in results) and stored == []


def test_a_producer_dropped_without_close_sends_on_until_its_queue_closes(tmp_path, caplog):
    """Its sender task was collected with it, pending: "Task was destroyed but it is pending!"."""
    import gc

    async def main() -> None:
        url = f"local://{tmp_path}/s"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 2)
        async with AsyncHQueue("q", url) as queue:
            producer = queue.producer(linger_ms=50)
            await producer.send(Message("t", b"x"))
            late = asyncio.ensure_future(producer.send(Message("t", b"y")))  # still waiting for company
            del producer
            gc.collect()
            await asyncio.sleep(0.1)
            gc.collect()
            assert isinstance(await late, MessageID)  # the dropped producer sent it

    with caplog.at_level("ERROR", logger="asyncio"):
        run(main())
    assert "Task was destroyed" not in caplog.text


def test_a_flush_waits_for_sends_made_while_the_producer_was_opening(api_url, queue_name):
    """flush() returned True at once while a send made before it waited for the producer to
    open: the send was not stored yet."""

    async def main() -> None:
        queue = await made(api_url, queue_name, partitions=1)
        producer = queue.producer(linger_ms=50)
        sending = asyncio.ensure_future(producer.send(Message("t", b"first")))
        await asyncio.sleep(0)  # (it is opening the producer)
        assert await producer.flush(10) and sending.done()
        await producer.close()
        assert [m.value async for m in queue.scan()] == [b"first"]
        await queue.close()

    run(main())


def test_a_flush_under_steady_sending_into_a_full_buffer_returns(tmp_path):
    """A flush waited until no send at all was waiting for room: with tasks sending on into
    a full buffer, one always was, and flush() never returned."""

    async def main() -> None:
        url = f"local://{tmp_path}/data"
        queue = await made(url, "q", partitions=2)
        producer = queue.producer(linger_ms=5, buffer_bytes=4 * (SEND_OVERHEAD + 200), block_timeout=30)
        stop = False

        async def sender() -> None:
            while not stop:
                await producer.send(Message("t", b"x" * 190))

        tasks = [asyncio.ensure_future(sender()) for _ in range(20)]
        await asyncio.sleep(0.3)
        assert await asyncio.wait_for(producer.flush(), 20)
        stop = True
        await asyncio.gather(*tasks)
        await producer.close()
        await queue.close()

    run(main())


def test_a_producer_left_open_when_its_loop_ends_says_what_it_loses(tmp_path, caplog):
    """The blocking producer warns at exit of what it held unsent; the asyncio one, whose
    sender the end of ``asyncio.run`` cancels, dropped its messages without a word."""
    url = f"local://{tmp_path}/s"
    held: list[AsyncHQueue] = []

    async def main() -> None:
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 2)
        queue = AsyncHQueue("q", url)  # never closed in this loop
        held.append(queue)
        producer = queue.producer(linger_ms=60_000)
        for n in range(100):
            asyncio.ensure_future(producer.send(Message("t", b"%d" % n)))
        for _ in range(500):
            if producer._batches.unsent() == 100:
                break
            await asyncio.sleep(0.01)

    with caplog.at_level("WARNING", logger="hqueue.aio.producer"):
        asyncio.run(main())
    assert "100 message(s) sent and not stored are lost: its event loop ended" in caplog.text
    asyncio.run(held[0].close())  # (from the next loop: test_a_handle_whose_producer_s_loop_ended_...)


def test_sends_cancelled_while_they_wait_for_room_leave_the_producer_working(tmp_path):
    """A send waiting for room was cancelled as asyncio.wait_for (3.11) ended its inner wait:
    it let go of the producer's lock it no longer held ("RuntimeError: Lock is not
    acquired"), the inner wait took it back for nobody, and every later send, flush and
    close hung (an attacker's pass: 3 runs of 5)."""
    import random

    async def main(name: str) -> None:
        url = "memory://cancel-room-" + str(tmp_path).replace("/", "-")
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue(name, 2)
        async with AsyncHQueue(name, url) as queue:
            producer = queue.producer(linger_ms=1, buffer_bytes=20_000, block_timeout=5)
            sends = [asyncio.ensure_future(producer.send(Message("t", b"x" * 100))) for _ in range(1500)]
            for _ in range(200):
                await asyncio.sleep(random.random() * 0.002)
                random.choice(sends).cancel()
            done, waiting = await asyncio.wait(sends, timeout=10)
            assert not waiting, f"{len(waiting)} sends still waiting past block_timeout"
            errors = {type(s.exception()).__name__ for s in done if not s.cancelled() and s.exception()}
            assert errors == set()
            await asyncio.wait_for(producer.close(), 10)

    for round in range(4):
        asyncio.run(main(f"q{round}"))
