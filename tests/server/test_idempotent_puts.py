"""Idempotent puts (hqueue/requests.py): a put whose answer was lost is sent again and written once.

A relay on loopback (tests/helpers/relay.py) stands for a server killed
after its write: it passes the put on, then resets the client's
connection, so the client cannot know the put was written and sends it
again. Before lanes, the second copy was stored under new IDs (and a timer
fired twice).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from hqueue import HQueue, HQueueAdmin
from hqueue.aio import AsyncHQueue
from hqueue.client.engine import RemoteEngine
from hqueue.config import QueueInfo
from hqueue.engine import Engine
from hqueue.errors import InvalidArgument, OutcomeUnknown
from hqueue.keys.requests import Request, records_range
from hqueue.message import Message, MessageID
from hqueue.requests import RETENTION_MS, Lanes, RequestLog
from hqueue.rpc import packed, wire
from hqueue.server import HQueueServer

from ..helpers.relay import Relay


@pytest.fixture
def relayed(tmp_path):
    """A server whose clients reach it (and its partitions' owner) through a relay."""

    def start(breaks: int, on: bytes) -> tuple[HQueueServer, Relay]:
        front = Relay(("127.0.0.1", 0), breaks=breaks, on=on, acted=True)  # it connects on each accept:
        server = HQueueServer(f"local://{tmp_path}/data", port=0, advertise=front.address).start()
        front.target = ("127.0.0.1", server.port)  # the port the server took, before anyone connects
        started.append((server, front))
        with HQueueAdmin(f"hqueue://{server.address}?timeout=10") as admin:
            admin.create_queue("q", 1)
        return server, front

    started: list[tuple[HQueueServer, Relay]] = []
    yield start
    for server, front in started:
        server.stop()
        front.close()


def stored(url: str) -> list[bytes]:
    with HQueue("q", url) as queue:
        return [m.value for m in queue.scan()]


@pytest.mark.parametrize("breaks", [1, 3])
def test_a_put_whose_answer_was_lost_is_written_once(relayed, breaks):
    # Given a server that writes a put and whose answer then never comes back, `breaks` times
    server, front = relayed(breaks=breaks, on=b"putPacked")
    with HQueue("q", f"hqueue://{front.address}?timeout=10") as queue:
        # When a client puts a batch through it
        ids = queue.put([Message("t", b"a"), Message("t", b"b")], partition_id=0)
    # Then the put went again after each break, and the batch is stored once, under the IDs answered
    assert front.broken == breaks
    assert stored(f"hqueue://{front.address}") == [b"a", b"b"]
    with HQueue("q", f"hqueue://{front.address}") as queue:
        assert [m.id for m in queue.scan()] == ids


def test_an_asyncio_put_whose_answer_was_lost_is_written_once(relayed):
    # Given a server that writes a put and whose answer then never comes back, twice
    server, front = relayed(breaks=2, on=b"putPacked")

    async def put() -> list[MessageID]:
        async with AsyncHQueue("q", f"hqueue://{front.address}?timeout=10") as queue:
            return await queue.put([Message("t", b"a"), Message("t", b"b")], partition_id=0)

    # When an asyncio client puts a batch through it
    ids = asyncio.run(put())
    # Then the batch is stored once, under the IDs answered
    assert front.broken == 2
    with HQueue("q", f"hqueue://{front.address}") as queue:
        assert [(m.id, m.value) for m in queue.scan()] == list(zip(ids, [b"a", b"b"], strict=True))


def test_a_timer_whose_answer_was_lost_is_scheduled_once(relayed):
    # Given a server that writes a timer put and whose answer then never comes back
    server, front = relayed(breaks=1, on=b"scheduleTimers")
    with HQueue("q", f"hqueue://{front.address}?timeout=10") as queue:
        # When a client puts a timer through it
        timer = queue.put(Message("t", b"later"), delay=3600, partition_id=0)
    # Then it is pending once, under the handle answered
    pending = server.engine.pending_timers("q", 0)
    assert front.broken == 1
    assert [t for t, _ in pending] == timer


def test_a_put_sent_again_to_the_partitions_next_owner_is_answered_from_the_store(store_url):
    # Given a put written with a request by one process (on each store), which then went away
    url = store_url
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    request = Request(b"L" * 16, 7)
    first = Engine.acquire(url)
    try:
        written = first.put_columns("q", [b"t"], [b"v"], 1, request)
    finally:
        first.release()
    # When the next process (a new engine on the store) is sent the same put again, marked resent
    second = Engine.acquire(url)
    try:
        again = second.put_columns("q", [b"t"], [b"v"], 1, request._replace(resent=True))
    finally:
        second.release()
    # Then it answers the first write's ID and writes nothing
    assert again == written
    assert stored(url) == [b"v"]


def test_a_put_sent_again_after_its_queue_was_truncated_is_written_again(store_url):
    """Its first copy went with the truncate: answered from the record the writer still held
    (in memory, or in the store for one marked resent), it was lost (a review)."""
    with HQueueAdmin(store_url) as admin:
        admin.create_queue("q", 1)
    request = Request(b"T" * 16, 3)
    engine = Engine.acquire(store_url)
    try:
        written = engine.put_columns("q", [b"t"], [b"v"], 0, request)
        engine.truncate_queue("q")
        again = engine.put_columns("q", [b"t"], [b"v"], 0, request._replace(resent=True))
        assert engine.put_columns("q", [b"t"], [b"v"], 0, request) == again  # (and once only)
    finally:
        engine.release()
    assert again > written
    assert stored(store_url) == [b"v"]


def test_a_put_sent_again_while_its_queue_is_being_truncated_is_written_again(tmp_path):
    """It waited for the partition's lock the truncate held, was checked against the floor
    the queue had before (its definition read first), and was answered from the record still
    held in memory: its first copy gone with the truncate, the message lost (a review)."""
    import threading

    engine = Engine.acquire(f"local://{tmp_path}/data")
    try:
        engine.create_queue(QueueInfo("q", 1))
        request = Request(b"R" * 16, 3)
        written = engine.put_columns("q", [b"t"], [b"v"], 0, request)
        real, truncating = engine.storage.truncate_queue, threading.Event()

        def slow_truncate(name: str) -> None:
            truncating.set()
            time.sleep(0.5)  # (the partition's lock held meanwhile)
            real(name)

        engine.storage.truncate_queue = slow_truncate  # type: ignore[method-assign]
        truncate = threading.Thread(target=engine.truncate_queue, args=("q",))
        truncate.start()
        assert truncating.wait(10)
        again = engine.put_columns("q", [b"t"], [b"v"], 0, request._replace(resent=True))
        truncate.join()
        assert again > written
    finally:
        engine.release()
    assert stored(f"local://{tmp_path}/data") == [b"v"]


def test_malformed_stale_and_mismatched_requests_get_typed_errors(relayed):
    # Given a server, and a lane that put one message as its put 5
    server, _ = relayed(breaks=0, on=b"")
    engine = RemoteEngine(f"hqueue://{server.address}?timeout=10")
    blob = packed.pack([b"t"], [b"v"])
    lane = b"M" * 16

    def put(lane: bytes, sequence: int, blob: bytes = blob) -> object:
        request = wire.T.TRequest(lane=lane, sequence=sequence, resent=False)
        return engine._owner_call("q", 0, "put", "putPacked", 0, blob, request)

    try:
        put(lane, 5)
        # When a client sends malformed requests, an older put of the lane, or put 5 with other messages
        for bad in [(b"short", 1), (lane, 0), (lane, -1), (lane, 4), (lane, 5, packed.pack([b"t"] * 2, [b"v"] * 2))]:
            # Then each is refused with a typed error, and nothing more is stored
            with pytest.raises(InvalidArgument):
                put(*bad)
        assert stored(f"hqueue://{server.address}") == [b"v"]
    finally:
        engine.release()


def test_records_older_than_the_retention_are_swept(tmp_path):
    # Given a partition's records: one of a lane that last put over an hour ago, one just now
    now = int(time.time() * 1000)
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    engine = Engine.acquire(url)
    try:
        old, recent = RequestLog(clock=lambda: now - RETENTION_MS - 1), RequestLog(clock=lambda: now)
        first = MessageID(1_700_000_000_000, 0)
        cells = [
            RequestLog.cell(0, b"O" * 16, old.record(Request(b"O" * 16, 1), first, 1)),
            RequestLog.cell(0, b"R" * 16, recent.record(Request(b"R" * 16, 1), first, 1)),
        ]
        engine.storage.write("q", cells, "SYNC_WAL")
        # When the writer sweeps
        scan = lambda start, stop, limit: engine.storage.scan("q", start, stop, None, limit)  # noqa: E731
        expired = RequestLog(clock=lambda: now).expired(scan, 0)
        # Then only the old lane's record is to go
        assert expired == [cells[0][0]]
        assert [k for k, _ in engine.storage.scan("q", *records_range(0), None, 10)] == [c[0] for c in cells]
    finally:
        engine.release()


def test_a_lane_carries_puts_in_order_and_is_dropped_when_one_ended_unknown():
    lanes = Lanes()
    # Given a lane whose put was answered
    with lanes.lane() as first:
        pass
    # Then the next put goes on it, numbered after
    with lanes.lane() as again:
        assert (again.id, again.sequence) == (first.id, 2)
    # When a put's outcome is unknown (a stalled server may still write it), or its task was cancelled
    for ending in (OutcomeUnknown("no answer"), asyncio.CancelledError()):
        with pytest.raises(type(ending)), lanes.lane() as lost:
            raise ending
        # Then its lane is never used again
        with lanes.lane() as fresh:
            assert fresh.id != lost.id and fresh.sequence == 1
        lanes = Lanes()
    # And an error the server answered leaves the lane free
    with pytest.raises(InvalidArgument), lanes.lane() as refused:
        raise InvalidArgument("refused")
    with lanes.lane() as after:
        assert (after.id, after.sequence) == (refused.id, 2)


def test_a_draining_server_answers_a_put_sent_again_whose_first_try_it_wrote(relayed):
    """A shutting-down server refused every put, one sent again too: its client could not
    tell whether the first try (slower than its share of the deadline) was written, so the
    put ended OutcomeUnknown though its record said it was (a review). It is answered from
    its record; any other put is refused, for the next owner."""
    from hqueue.errors import NotPartitionOwner

    server, _ = relayed(breaks=0, on=b"")
    engine = RemoteEngine(f"hqueue://{server.address}?timeout=10")
    blob = packed.pack([b"t"], [b"v"])
    address = engine.locations("q")[0]

    def put(lane: bytes, resent: bool) -> object:
        request = wire.T.TRequest(lane=lane, sequence=1, resent=resent)
        return engine._call_at(address, "putPacked", "q", 0, blob, request, queue="q", pid=0)

    try:
        first = put(b"A" * 16, False)
        server.handler.guard.draining = True
        again = put(b"A" * 16, True)
        assert (again.firstID, again.count) == (first.firstID, first.count)
        for lane, resent in ((b"B" * 16, True), (b"C" * 16, False)):
            with pytest.raises(NotPartitionOwner):
                put(lane, resent)
        server.handler.guard.draining = False
        assert stored(f"hqueue://{server.address}") == [b"v"]
    finally:
        engine.release()
