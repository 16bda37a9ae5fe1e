"""A blocking call cut short while its answer is on the way (an exception raised from a
signal handler, as Celery's soft time limit or an alarm-based timeout raise it; a send
that failed part-way) leaves its connection with an answer still to come. That
connection is never used again: read by the next call, the late answer was that call's
(client/pool.py, client/cursor.py).

Against a real server made slow where the test says; the exception comes from SIGALRM,
in the main thread, while the client waits.
"""

from __future__ import annotations

import signal
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.client.pool import Pool
from hqueue.engine import Engine
from hqueue.server import HQueueServer
from hqueue.server.scanners import ScannerRegistry


class SoftTimeLimit(Exception):
    pass


@pytest.fixture
def alarm():
    """``alarm(seconds)``: SoftTimeLimit raised in the main thread that many seconds on."""

    def raise_it(signum, frame):
        raise SoftTimeLimit("soft time limit")

    before = signal.signal(signal.SIGALRM, raise_it)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, before)


@pytest.fixture(params=["loop", "threads"])
def url(tmp_path, request):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, io=request.param).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 1)
    yield f"hqueue://{server.address}"
    server.stop()


def test_a_put_cut_short_leaves_no_answer_for_the_next_put(url, alarm, monkeypatch):
    # Given a server slow to store one message
    put_columns = Engine.put_columns

    def slow(self, *args, **kwargs):
        if b"first" in args[2]:  # (name, topics, values, partition_id, ...)
            time.sleep(0.6)
        return put_columns(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "put_columns", slow)
    with HQueue("q", url) as queue:
        queue.put(Message("t", b"warm-up"), partition_id=0)
        # When a put of it is cut short while its answer is on the way
        alarm(0.2)
        with pytest.raises(SoftTimeLimit):
            queue.put(Message("t", b"first"), partition_id=0)
        alarm(0)
        # Then the next puts are each answered with their own message's ID
        second = queue.put(Message("t", b"second"), partition_id=0)
        third = queue.put(Message("t", b"third"), partition_id=0)
        time.sleep(0.8)  # (the first is stored once the server gets to it)
        stored = {m.id: m.value for m in queue.scan(partition_id=0)}
    assert stored[second[0]] == b"second" and stored[third[0]] == b"third"
    assert sorted(stored.values()) == [b"first", b"second", b"third", b"warm-up"]


def test_a_scan_cut_short_while_its_requests_ahead_are_answered_leaves_clean_connections(url, alarm, monkeypatch):
    # Given a server slow to answer a scanner's batches after its first
    take, calls = ScannerRegistry.take, []

    def slow(self, scanner_id, *args, **kwargs):
        calls.append(scanner_id)
        if len(calls) > 1:
            time.sleep(0.3)
        return take(self, scanner_id, *args, **kwargs)

    expected = [b"%05d" % i for i in range(5000)]
    with HQueue("q", url) as queue:
        queue.put([Message("t", value) for value in expected], partition_id=0)
        monkeypatch.setattr(ScannerRegistry, "take", slow)
        batches = queue.scan_batches(partition_id=0, batch_size=1000)
        assert next(batches).values == expected[:1000]
        # When the scan is cut short while it waits for its next batch (two asked for ahead)
        alarm(0.1)
        with pytest.raises(SoftTimeLimit):
            next(batches)
        alarm(0)
        monkeypatch.setattr(ScannerRegistry, "take", take)
        # Then the pooled connections answer their own calls
        for _ in range(4):
            assert [m.value for m in queue.scan(partition_id=0, limit=3)] == expected[:3]
            assert queue.partitions == 1
        assert [v for batch in queue.scan_batches(partition_id=0, batch_size=700) for v in batch.values] == expected


def test_a_connection_whose_call_failed_part_way_is_not_given_back_to_the_pool(url):
    # Given a call whose arguments fail to encode after its head was written
    address = url.removeprefix("hqueue://")
    pool = Pool(address, 5000)
    try:
        with pytest.raises(Exception), pool.client() as client:  # noqa: B017 - thriftpy2's encoding error
            client.getQueue(2**40)
        # Then the next call goes on a connection of its own, and is answered
        with pool.client() as client:
            assert client.getQueue("q").partitions == 1
    finally:
        pool.close()


def test_a_pooled_connection_with_a_call_unanswered_is_stale(url):
    address = url.removeprefix("hqueue://")
    pool = Pool(address, 5000)
    try:
        connection = pool.take()
        client = connection.client
        client._send("listQueues")  # sent; its answer not read
        assert connection.protocol.unanswered == 1 and connection.stale()
        pool.give_back(connection)
        assert pool._idle.empty()  # closed, not kept
        assert connection.socket.sock is None
    finally:
        pool.close()


def test_a_call_cut_short_while_its_answer_s_body_is_read_is_still_unanswered(url):
    """The head of the answer read, then an exception while its body was decoded: the call
    was taken as answered, its connection kept, and the next call read the rest of the
    frame (a put stored, and raised as a raw protocol error)."""
    pool = Pool(url.removeprefix("hqueue://"), 5000)
    try:
        connection = pool.take()
        pool.give_back(connection)
        read_struct, cut = connection.protocol._protocol.read_struct, []

        def cut_once(obj, *args, **kwargs):
            if not cut:
                cut.append(obj)
                raise SoftTimeLimit("after the answer's head")
            return read_struct(obj, *args, **kwargs)

        connection.protocol.read_struct = cut_once  # (NumberedProtocol keeps what it looked up)
        with pytest.raises(SoftTimeLimit), pool.client() as client:
            client.getQueue("q")
        assert connection.protocol.unanswered == 1 and connection.socket.sock is None and pool._idle.empty()
        with pool.client() as client:
            assert client.getQueue("q").partitions == 1
    finally:
        pool.close()
