"""The batching producer (``queue.producer()``), on every backend and through a server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from hqueue import (
    HQueue,
    InvalidArgument,
    InvalidMessage,
    InvalidPartition,
    Message,
    MessageID,
    MessageTooLarge,
    ProducerBufferFull,
    ProducerClosed,
    QueueDisabled,
    QueueNotFound,
)
from hqueue.admin import HQueueAdmin
from hqueue.producer import SEND_OVERHEAD

from ..processes import ROOT, python_env, wait_for


def send_from_threads(producer, threads: int, each: int, **route) -> dict[int, list[tuple[int, Future]]]:
    """Each thread sends ``each`` messages one at a time, not waiting: {thread: [(i, future)]}."""
    sent: dict[int, list[tuple[int, Future]]] = {t: [] for t in range(threads)}
    start = threading.Barrier(threads)

    def run(t: int) -> None:
        start.wait()
        for i in range(each):
            sent[t].append((i, producer.send(Message("t", b"%d-%d" % (t, i)), **{k: v(t) for k, v in route.items()})))

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sent


def test_many_threads_sending_get_increasing_ids_per_partition_in_few_puts(make_queue):
    # Given a queue of 4 partitions and a producer that lingers a little
    queue = make_queue(partitions=4)
    with queue.producer(linger_ms=20, max_batch=500) as producer:
        # When 16 threads each send 100 messages, one at a time, routed by key
        sent = send_from_threads(producer, 16, 100, key=lambda t: f"k{t}")
        assert producer.flush(timeout=60)
        # Then every future holds an ID, increasing per thread (one key: one partition)
        for futures in sent.values():
            ids = [f.result(0) for _, f in futures]
            assert all(isinstance(i, MessageID) for i in ids)
            assert ids == sorted(ids) and len(set(ids)) == len(ids)
        # and the 1,600 sends went out in far fewer puts
        assert producer.sent == 1600
        assert producer.puts < 400, producer.puts
    # and each ID names the message sent, in the partition its future names
    stored = {(m.partition_id, m.id): m.value for m in queue.scan()}
    assert len(stored) == 1600
    for t, futures in sent.items():
        for i, future in futures:
            assert stored[(future.partition_id, future.result())] == b"%d-%d" % (t, i)
    by_partition: dict[int, list[MessageID]] = {}
    for m in queue.scan():
        by_partition.setdefault(m.partition_id, []).append(m.id)
    assert all(ids == sorted(ids) for ids in by_partition.values())


def test_a_partition_or_key_routes_the_send(make_queue):
    queue = make_queue(partitions=4)
    with queue.producer() as producer:
        to_two = producer.send(Message("t", b"a"), partition=2)
        keyed = [producer.send(Message("t", b"k%d" % i), key=b"shop-42") for i in range(5)]
    assert to_two.result().timestamp > 0 and to_two.partition_id == 2
    assert [f.result() for f in keyed] == sorted(f.result() for f in keyed)
    by_value = {m.value: m.partition_id for m in queue.scan()}
    assert by_value[b"a"] == 2
    assert len({by_value[b"k%d" % i] for i in range(5)}) == 1


def test_flush_waits_for_every_send_and_close_flushes(make_queue):
    queue = make_queue(partitions=2)
    producer = queue.producer(linger_ms=60_000)  # nothing would go on its own for a minute
    futures = [producer.send(Message("t", b"%d" % i)) for i in range(10)]
    assert not any(f.done() for f in futures)
    assert producer.flush(timeout=30)
    assert all(f.done() and f.exception() is None for f in futures)
    late = producer.send(Message("t", b"late"))
    producer.close()
    assert late.done() and late.result().timestamp > 0
    assert sum(1 for _ in queue.scan()) == 11
    # When it is closed, Then a send is refused, with a typed error
    with pytest.raises(ProducerClosed):
        producer.send(Message("t", b"after"))
    producer.close()  # twice is fine


def test_a_disabled_queue_fails_exactly_the_futures_of_its_batch(make_queue, api_url):
    # Given a producer on a queue, and sends that were stored
    queue = make_queue(partitions=1)
    with queue.producer() as producer:
        stored = [producer.send(Message("t", b"ok%d" % i)) for i in range(3)]
        assert producer.flush(timeout=30)
        # When the queue is disabled, Then the next sends' futures fail with QueueDisabled
        with HQueueAdmin(api_url) as admin:
            admin.disable_queue(queue.name)
            failed = [producer.send(Message("t", b"no%d" % i)) for i in range(3)]
            assert producer.flush(timeout=30)
            for future in failed:
                assert isinstance(future.exception(), QueueDisabled)
            # and the stored ones kept their IDs
            assert [f.result() for f in stored] == sorted(f.result() for f in stored)
            admin.enable_queue(queue.name)
        # and once it is enabled again, sends are stored again
        assert producer.send(Message("t", b"again")).result(timeout=30).timestamp > 0
    assert sorted(m.value for m in queue.scan()) == [b"again", b"ok0", b"ok1", b"ok2"]


def test_bad_sends_are_refused_at_once_and_queue_nothing(make_queue):
    queue = make_queue(partitions=2)
    with queue.producer() as producer:
        with pytest.raises(TypeError, match="Message"):
            producer.send(b"not a message")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage):
            producer.send(Message("", b"no topic"))
        with pytest.raises(InvalidArgument, match="partition"):
            producer.send(Message("t", b"x"), partition=7)
        with pytest.raises(TypeError, match="not both"):
            producer.send(Message("t", b"x"), partition=0, key="k")
        assert producer.flush(timeout=10)
    assert list(queue.scan()) == []


@pytest.mark.parametrize(
    "option, value, error",
    [
        ("linger_ms", -1, InvalidArgument),
        ("max_batch", 0, InvalidArgument),
        ("max_batch", 10_001, InvalidArgument),
        ("max_bytes", 32 * 1024 * 1024, InvalidArgument),
        ("buffer_bytes", 1.5, TypeError),
        ("buffer_bytes", 2048, InvalidArgument),  # no message would fit (each counts 2 KiB besides its bytes)
        ("block_timeout", "1", TypeError),
        ("block_timeout", float("inf"), InvalidArgument),  # (a send that waited: OverflowError)
        ("block_timeout", 1e10, InvalidArgument),
    ],
)
def test_producer_options_are_checked(make_queue, option, value, error):
    queue = make_queue(partitions=1)
    with pytest.raises(error, match=option):
        queue.producer(**{option: value})


@pytest.mark.parametrize("timeout, error", [("x", TypeError), (-1, InvalidArgument), (float("inf"), InvalidArgument)])
def test_flush_and_close_timeouts_are_checked(make_queue, timeout, error):
    queue = make_queue(partitions=1)
    with queue.producer() as producer:
        producer.send(Message("t", b"x"))
        with pytest.raises(error, match="'timeout'"):
            producer.flush(timeout)
        with pytest.raises(error, match="'timeout'"):
            producer.close(timeout)
        assert producer.flush(timeout=30)


def test_a_send_cancelled_before_its_batch_goes_is_left_out(make_queue):
    queue = make_queue(partitions=1)
    with queue.producer(linger_ms=60_000) as producer:
        kept, dropped = producer.send(Message("t", b"kept")), producer.send(Message("t", b"dropped"))
        assert dropped.cancel()
    assert kept.result().timestamp > 0
    assert [m.value for m in queue.scan()] == [b"kept"]


def test_batches_keep_to_max_batch_and_max_bytes(make_queue):
    queue = make_queue(partitions=1)
    with queue.producer(linger_ms=60_000, max_batch=10, max_bytes=1000) as producer:
        for i in range(25):
            producer.send(Message("t", b"%d" % i))
        for _ in range(5):
            producer.send(Message("t", b"x" * 400))  # two at most to a put, by bytes
    # 10, 10, then 5 small ones with two big ones (835 bytes), two big ones, one
    assert (producer.sent, producer.puts) == (30, 5)
    ids = [m.id for m in queue.scan()]
    assert len(ids) == 30 and ids == sorted(ids)


def test_sends_without_key_stick_to_a_partition_until_its_batch_is_full(make_queue):
    # Given 8 partitions and batches of 10
    queue = make_queue(partitions=8)
    with queue.producer(linger_ms=60_000, max_batch=10) as producer:
        # When 30 messages are sent with neither key nor partition
        futures = [producer.send(Message("t", b"%d" % i)) for i in range(30)]
    # Then each 10 went together: one put each, one partition each, consecutive IDs
    by_value = {m.value: m.partition_id for m in queue.scan()}
    assert all(by_value[b"%d" % i] == f.partition_id for i, f in enumerate(futures))
    for start in (0, 10, 20):
        assert len({by_value[b"%d" % i] for i in range(start, start + 10)}) == 1
        ids = [futures[i].result() for i in range(start, start + 10)]
        assert ids == sorted(ids)
    assert producer.puts == 3


def test_flush_from_a_futures_callback_is_refused_not_a_deadlock(make_queue):
    queue = make_queue(partitions=1)
    seen: list[BaseException] = []

    def callback(_: Future) -> None:
        try:
            producer.flush(timeout=5)
        except RuntimeError as e:
            seen.append(e)

    with queue.producer() as producer:
        producer.send(Message("t", b"x")).add_done_callback(callback)
        assert producer.flush(timeout=30)
    assert len(seen) == 1 and "callback" in str(seen[0])


def test_a_send_from_a_futures_callback_gets_its_batchs_room(make_queue):
    # Given a producer whose buffer holds one message
    queue = make_queue(partitions=1)
    chained: list[object] = []

    def send_next(_: Future) -> None:  # a chain (or a retry) from the callback
        try:
            chained.append(producer.send(Message("t", b"second")))
        except Exception as e:  # noqa: BLE001 - the test says which
            chained.append(e)

    with queue.producer(buffer_bytes=2048 + 100, block_timeout=30) as producer:
        # When the first message's callback sends the second
        first = producer.send(Message("t", b"first"))
        first.add_done_callback(send_next)
        first.result(30)
        # Then the first batch's room was free for it: no wait for room only it could free
        assert producer.flush(timeout=30)
        assert len(chained) == 1 and isinstance(chained[0], Future), chained
        assert chained[0].result(0) > first.result(0)
    assert [m.value for m in queue.scan()] == [b"first", b"second"]


@pytest.mark.parametrize("held_by", [0, 1], ids=["its-own-partition", "another-partition"])
def test_a_send_from_a_futures_callback_waits_only_for_room_another_partition_holds(make_queue, held_by):
    # Given a buffer of three messages, full of one partition's next batch as a callback of
    # partition 0 sends (its partition held up until the callback returns)
    queue = make_queue(partitions=2)
    cost = len(b"t") + len(b"x" * 10) + SEND_OVERHEAD
    running, full = threading.Event(), threading.Event()
    chained: list[object] = []

    def send_next(_: Future) -> None:
        running.set()
        full.wait(30)
        try:
            chained.append(producer.send(Message("t", b"x" * 10), partition=0))
        except Exception as e:  # noqa: BLE001 - the test says which
            chained.append(e)

    with queue.producer(buffer_bytes=3 * cost, block_timeout=60, linger_ms=60_000) as producer:
        producer.send(Message("t", b"x" * 10), partition=0).add_done_callback(send_next)
        producer.flush(timeout=0)  # (the first goes now: its callback runs, holding its partition)
        assert running.wait(30)
        held = [producer.send(Message("t", b"x" * 10), partition=held_by) for _ in range(3)]
        # When the callback sends
        full.set()
        assert producer.flush(timeout=30)
        wait_for(lambda: chained, 30, "the callback's send")
        assert len(chained) == 1
        if held_by == 0:  # then, with the room its own partition's alone, it is refused at once, saying why
            assert isinstance(chained[0], ProducerBufferFull), chained
            assert "callbacks does not wait" in str(chained[0])
        else:  # else it waits for that room (the other batch goes now), and is queued
            assert isinstance(chained[0], Future), chained
            assert producer.flush(timeout=30) and isinstance(chained[0].result(0), MessageID)
        assert all(isinstance(f.result(0), MessageID) for f in held)
    assert len(list(queue.scan())) == 4 + held_by


def test_a_producer_checks_sends_against_its_queue_made_again_after_a_refused_put(make_queue, admin):
    # Given a producer on a queue of 4 partitions, and the queue made again with 2 and a 100-byte limit
    queue = make_queue(partitions=4)
    with queue.producer() as producer:
        assert isinstance(producer.send(Message("t", b"x"), partition=3).result(30), MessageID)
        admin.disable_queue(queue.name)
        admin.delete_queue(queue.name)
        admin.create_queue(queue.name, 2, max_message_bytes=100)
        # When a send goes in a batch routed by the old definition, that batch's put is refused
        with pytest.raises(QueueNotFound, match="deleted and created again since this client read its definition"):
            producer.send(Message("t", b"x"), partition=3).result(30)
        # Then the producer reads the queue's definition again: send itself refuses what it would refuse
        with pytest.raises(InvalidPartition):
            producer.send(Message("t", b"x"), partition=3)
        with pytest.raises(MessageTooLarge):
            producer.send(Message("t", b"x" * 200), partition=0)
        assert isinstance(producer.send(Message("t", b"x"), partition=1).result(30), MessageID)


def test_keyed_sends_follow_the_queue_made_again_with_more_partitions(make_queue, admin):
    """A queue made again with more partitions refused no put, so the producer never read
    its definition again: its keyed sends went by the old count for ever, one key's
    messages in two partitions of the new queue (an attacker's probe). A put now says the
    definition it was routed by: a batch routed by the old one fails, nothing written, and
    the next sends go by the new one; a send also reads the definition once it is 2 s old."""
    from hqueue.checks import partition_for_key
    from hqueue.config import INFO_CACHE_SECONDS

    queue = make_queue(partitions=2)
    with queue.producer() as producer:
        before = producer.send(Message("t", b"before"), key=b"user-4")
        assert isinstance(before.result(30), MessageID) and before.partition_id == partition_for_key(b"user-4", 2)
        admin.disable_queue(queue.name)
        admin.delete_queue(queue.name)
        admin.create_queue(queue.name, 16)
        at_once = producer.send(Message("t", b"at once"), key=b"user-4")  # (routed by the old definition,
        try:  # unless that one was 2 s old already)
            at_once.result(30)
        except QueueNotFound as e:
            assert "deleted and created again since this client read its definition" in str(e)
        after = [producer.send(Message("t", b"after %d" % i), key=b"user-4") for i in range(3)]
        assert all(isinstance(f.result(30), MessageID) for f in after)
        time.sleep(INFO_CACHE_SECONDS + 0.1)  # (and a send reads the definition again when it is due)
        late = producer.send(Message("t", b"late"), key=b"user-4")
        assert isinstance(late.result(30), MessageID)
    where, expected = {m.value: m.partition_id for m in queue.scan()}, partition_for_key(b"user-4", 16)
    assert where.pop(b"at once", expected) == expected  # (stored only if routed by the new definition)
    assert where == dict.fromkeys([b"after 0", b"after 1", b"after 2", b"late"], expected)


def test_a_partitions_futures_resolve_in_the_order_of_its_ids(make_queue):
    # Given one partition, and batches of 10
    queue = make_queue(partitions=1)
    resolved: list[MessageID] = []
    with queue.producer(max_batch=10) as producer:
        # When 200 sends go, each future noting its ID as it resolves
        for i in range(200):
            producer.send(Message("t", b"%d" % i)).add_done_callback(lambda f: resolved.append(f.result()))
        assert producer.flush(timeout=60)
    # Then a batch's futures resolved before the next batch's (its partition waits for them)
    assert len(resolved) == 200 and resolved == sorted(resolved)


def test_flush_waits_for_the_futures_a_callback_holds_up(make_queue):
    # Given a batch of two whose first future's callback holds the others up
    queue = make_queue(partitions=1)
    release = threading.Event()
    with queue.producer(linger_ms=200) as producer:
        first = producer.send(Message("t", b"1"))
        second = producer.send(Message("t", b"2"))
        first.add_done_callback(lambda _: release.wait(30))
        try:
            # When the batch was put and its callbacks run
            while not first.done():
                time.sleep(0.01)
            # Then a flush does not return before the second future is done
            assert producer.flush(timeout=0.3) is False and not second.done()
        finally:
            release.set()
        assert producer.flush(timeout=30) and second.result(0) > first.result(0)


def test_closing_the_queue_closes_its_producers_after_sending_what_they_hold(make_queue):
    """A send after queue.close() failed with QueueNotFound on the embedded store and was
    stored on the others (an acceptance probe): now every store refuses it the same way."""
    queue = make_queue(partitions=2)
    producer = queue.producer(linger_ms=60_000)  # nothing goes by itself
    future = producer.send(Message("t", b"held"))
    queue.close()
    assert producer.closed and future.result(timeout=30).timestamp > 0
    with pytest.raises(ProducerClosed):
        producer.send(Message("t", b"late"))


def test_a_producer_does_not_cross_fork(tmp_path):
    """In a forked child the producer has none of its threads: a send queued into nothing
    and its result, flush() and close() waited for ever (an acceptance probe)."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
    with HQueue("q", data_dir=tmp_path) as queue, queue.producer() as producer:
        producer.send(Message("t", b"parent")).result(10)
        child = os.fork()
        if child == 0:  # the child: nothing of pytest's may run here
            code = 1
            try:
                producer.send(Message("t", b"child"))
            except ProducerClosed as e:
                code = 0 if "before this process forked" in str(e) else 2
            producer.flush()
            producer.close()
            os._exit(code)
        status = None
        for _ in range(300):  # 30 s: a child that waits for ever is a failure, not a hung suite
            if (done := os.waitpid(child, os.WNOHANG))[0]:
                status = done[1]
                break
            time.sleep(0.1)
        else:
            os.kill(child, 9)
            os.waitpid(child, 0)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0
        assert producer.send(Message("t", b"parent again")).result(10)


SHUTDOWN = """
import sys, threading
from hqueue import HQueue, Message
queue = HQueue("q", data_dir=sys.argv[1])
producer = queue.producer(linger_ms=50)
def late():  # still sending while the interpreter ends: no new thread can start then
    for n in range(200):
        producer.send(Message("t", b"%d" % n))
    producer.flush()
    print("flushed", flush=True)
threading.Thread(target=late).start()
"""


def test_sends_while_the_interpreter_ends_are_sent_not_left_waiting(tmp_path):
    """The producer's sender thread died (no thread for a put once the interpreter ends):
    its batch never ended, and flush() waited for ever (an acceptance probe)."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
    done = subprocess.run([sys.executable, "-c", SHUTDOWN, str(tmp_path)], cwd=ROOT, env=python_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "flushed" in done.stdout, done.stderr
    with HQueue("q", data_dir=tmp_path) as queue:
        assert sum(1 for _ in queue.scan()) == 200


LEFT_OPEN = """
import sys
from hqueue import HQueue, Message
queue = HQueue("q", data_dir=sys.argv[1])
producer = queue.producer(linger_ms=60_000)
for n in range(100):
    producer.send(Message("t", b"%d" % n))
"""


def test_a_producer_left_open_at_exit_says_what_it_loses(tmp_path):
    """Sends a producer held at exit (never closed nor flushed) were lost without a word
    (an attacker's probe): a warning now says how many, and what to do."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
    done = subprocess.run([sys.executable, "-c", LEFT_OPEN, str(tmp_path)], cwd=ROOT, env=python_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "100 message(s) sent and not stored are lost at exit: close() or flush() the producer" in done.stderr


def test_a_full_buffer_sends_what_lingers_now(tmp_path):
    """A send waiting for room did not make the lingering batches go: with a linger as long
    as block_timeout, a healthy store raised ProducerBufferFull (an acceptance probe)."""
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 2)
    with HQueue("q", data_dir=tmp_path) as queue:
        with queue.producer(linger_ms=5000, buffer_bytes=64 * 1024, block_timeout=2) as producer:
            started = time.monotonic()
            futures = [producer.send(Message("t", b"v" * 1000)) for _ in range(100)]  # about 300 KB
            assert time.monotonic() - started < 4  # not a linger of 5 s per buffer's worth
            producer.flush()
            assert all(f.result(10) for f in futures)


def test_a_callback_raising_systemexit_leaves_no_future_of_its_batch_pending(make_queue):
    """A Future passes on what is not an Exception from its callbacks: the first future's
    SystemExit left the four after it pending for ever (stored all the same), and flush()
    said every send was done."""
    queue = make_queue(partitions=1)
    with queue.producer(linger_ms=200) as producer:
        futures = [producer.send(Message("t", b"m%d" % i)) for i in range(5)]
        futures[0].add_done_callback(lambda future: sys.exit(0))
        assert producer.flush(10)
        assert all(future.done() for future in futures)
        assert [future.result(0) for future in futures] == [m.id for m in queue.scan()]
