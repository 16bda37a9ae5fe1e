"""A remote scan asks for its next batches (AHEAD of them) before it hands out the one it
has (client/cursor.py).

Against a real server: the messages come in order, each once, whether the
scan runs to its end or is left part-way with requests still on the wire;
the connection it gives back to the pool carries no stray answer.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.aio import AsyncHQueue
from hqueue.errors import InvalidArgument
from hqueue.server import HQueueServer
from hqueue.server.scanners import ScannerRegistry

from ..processes import wait_for

EXPECTED = [b"%d-%d" % (n, i) for n in range(11) for i in range(500)]


def filled(server: HQueueServer) -> str:
    """The server's URL, with queue q's one partition holding EXPECTED (11 puts of 500)."""
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        for n in range(11):
            queue.put([Message("t", value) for value in EXPECTED[n * 500 : (n + 1) * 500]], partition_id=0)
    return url


@pytest.fixture
def url(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    yield filled(server)
    server.stop()


def test_a_pipelined_scan_hands_out_every_message_once_in_order(url):
    with HQueue("q", url) as queue:
        with queue.get_partition_scanner(0, caching=1000) as scanner:
            assert [m.value for m in scanner] == EXPECTED
        assert [v for batch in queue.scan_batches(partition_id=0, batch_size=700) for v in batch.values] == EXPECTED


@pytest.mark.parametrize("io", ["loop", "threads"])
def test_a_scan_keeps_one_scanner_while_its_requests_ahead_are_answered(tmp_path, monkeypatch, io, caplog):
    """The answers to the requests sent ahead are each checked against the oldest call still
    to be answered. Checked against the newest one sent, every answer to a request ahead was
    taken for a stray: the scanner was dropped, and another opened after a 10 ms pause, at
    every batch (a remote read ran at 67,000 messages a second instead of 1.2 million)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, io=io).start()
    opened = []
    open_scanner = ScannerRegistry.open

    def counted(self, scanner, owner=0, principal=None):
        opened.append(scanner)
        return open_scanner(self, scanner, owner, principal)

    monkeypatch.setattr(ScannerRegistry, "open", counted)
    caplog.set_level("INFO", logger="hqueue.client.cursor")
    try:
        url = filled(server)
        with HQueue("q", url) as queue:
            opened.clear()
            with queue.get_partition_scanner(0, caching=1000) as scanner:
                assert [m.value for m in scanner] == EXPECTED
            assert len(opened) == 1
            opened.clear()

            async def awaited() -> list[bytes]:
                async with AsyncHQueue("q", url) as aqueue:
                    opened.clear()
                    return [m.value async for m in aqueue.scan(partition_id=0, caching=1000)]

            assert asyncio.run(awaited()) == EXPECTED
            assert len(opened) == 1
        assert not [r for r in caplog.records if "lost" in r.getMessage()]
    finally:
        server.stop()


def test_a_scan_left_with_a_request_ahead_gives_back_a_clean_connection(url):
    with HQueue("q", url) as queue:
        for _ in range(5):
            # When a scan is left after its first full batch (the next two already asked for)
            with queue.get_partition_scanner(0, caching=1000) as scanner:
                first = [next(scanner).value for _ in range(1000)]
            assert first == EXPECTED[:1000]
            # Then the pooled connection it gave back answers the next calls, not the old request
            assert queue.partitions == 1
            assert [m.value for m in queue.scan(limit=3)] == EXPECTED[:3]
        with queue.get_partition_scanner(0, caching=1000) as scanner:
            assert [m.value for m in scanner] == EXPECTED


def test_an_awaited_scan_pipelines_the_same_way(url):
    """hqueue.aio's cursor (aio/client/cursor.py) keeps the same requests ahead."""

    async def main():
        async with AsyncHQueue("q", url) as queue:
            whole = [m.value async for m in queue.scan(partition_id=0, caching=1000)]
            for _ in range(3):
                # A scan left after its first full batch, its next two already asked for
                async with queue.scan(partition_id=0, caching=1000) as scanner:
                    first = [(await anext(scanner)).value for _ in range(1000)]
                # The pooled connection it gave back answers the next calls
                assert (await queue.info()).partitions == 1
                assert [m.value async for m in queue.scan(partition_id=0, limit=3)] == EXPECTED[:3]
            return whole, first

    whole, first = asyncio.run(main())
    assert whole == EXPECTED and first == EXPECTED[:1000]


@pytest.mark.parametrize("io", ["loop", "threads"])
def test_a_scanner_gone_with_requests_ahead_leaves_no_answer_on_a_pooled_connection(tmp_path, monkeypatch, io):
    """Its scanner closed by the server while idle, a scan's next fetches find it gone;
    the first "gone" answer came while the second request sent ahead was still to be
    answered, and its connection went back to the pool: the next calls on it read the
    answers of the ones before (a scan that failed, then QueueNotFound for a queue that is)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, idle_timeout=0.4, io=io).start()
    gone = ScannerRegistry._get

    def slow_gone(self, scanner_id, owner, principal):  # a busy server: "gone" answers come late
        try:
            return gone(self, scanner_id, owner, principal)
        except InvalidArgument:
            time.sleep(0.1)
            raise

    monkeypatch.setattr(ScannerRegistry, "_get", slow_gone)
    try:
        with HQueue("q", filled(server)) as queue:
            with queue.get_partition_scanner(0, caching=1000) as scanner:
                first = [next(scanner).value for _ in range(1000)]
                wait_for(lambda: len(server.scanners) == 0, 10, "the server to close the idle scanner")
                rest = [m.value for m in scanner]
            assert first + rest == EXPECTED
            for _ in range(3):  # the pooled connections answer their own calls
                assert queue.partitions == 1
                assert [m.value for m in queue.scan(limit=3)] == EXPECTED[:3]
    finally:
        server.stop()


@pytest.mark.parametrize("io", ["loop", "threads"])
def test_scans_whose_reads_ahead_fill_the_budget_wait_for_room_and_finish(tmp_path, io):
    """Each scan keeps two batches asked for ahead: a few scans of big messages at once filled
    the server's budget with their own answers, and the next get was refused ServerBusy,
    which the cursor raised (an attacker's probe). A refused get reads nothing: the cursor
    asks again after a pause, within its deadline."""
    from hqueue.rpc.connections import ServerLimits

    limits = ServerLimits(max_inflight_bytes=34 << 20, inflight_wait=0.2)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, limits=limits, io=io).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("big", 1)
        with HQueue("big", url) as queue:
            for _ in range(8):
                queue.put([Message("t", b"v" * 250_000)] * 25, partition_id=0)  # 50 MB
        counts: list = []

        def scan() -> None:
            try:
                with HQueue("big", f"{url}?timeout=60") as queue:
                    n = 0
                    for n, _ in enumerate(queue.scan(), 1):  # noqa: B007
                        if n % 40 == 0:
                            time.sleep(0.2)  # a reader that works a little
                    counts.append(n)
            except Exception as e:  # noqa: BLE001 - counted
                counts.append(repr(e))

        threads = [threading.Thread(target=scan) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert counts == [200] * 5, counts
    finally:
        server.stop()


def test_when_one_partition_s_fetch_fails_the_others_are_ended_before_the_scan_raises():
    """The scan raised on one fetch's error while the others still ran: one of them then
    opened its scanner again on a new connection, and held it and the server's memory (an
    attacker's probe). The fetches of a merge now end together."""
    from hqueue.aio.scanner import _all

    ended: list[str] = []

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise InvalidArgument("refused")

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append("slow")

    async def main() -> None:
        before = asyncio.all_tasks()
        with pytest.raises(InvalidArgument):
            await _all([fails(), slow()])
        assert ended == ["slow"]  # before the error reached the scan
        assert asyncio.all_tasks() - before == set()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_an_answer_that_is_not_a_packed_batch_is_the_server_s_fault_not_the_caller_s(url, monkeypatch):
    """A broken server's scanner answer that packed.unpack refuses was raised to the caller
    as InvalidArgument, the error of a caller's mistake."""
    from hqueue.errors import ServerUnavailable
    from hqueue.rpc import packed

    monkeypatch.setattr(packed, "pack", lambda keys, values: b"\xff" * 9)  # (the server's side: this process)
    with HQueue("q", url) as queue:
        with pytest.raises(ServerUnavailable, match="not a packed batch") as raised:
            list(queue.scan(partition_id=0))
        assert not isinstance(raised.value, InvalidArgument)

    async def awaited():
        async with AsyncHQueue("q", url) as queue:
            return [m async for m in queue.scan(partition_id=0)]

    with pytest.raises(ServerUnavailable, match="not a packed batch"):
        asyncio.run(awaited())


#: How late a slow scanner's batches after the first come (s): well apart from what the
#: first batch takes on a busy machine.
LATE = 3.0


def test_a_scan_of_big_batches_left_part_way_does_not_wait_for_its_answers_ahead(url, monkeypatch):
    """Leaving a scan read the answers to its two requests ahead, then closed its scanner:
    a ``break`` after the first message of 16 MiB batches read 32 MiB more (2 s over a link
    of 1 s round trips, and until the deadline from a stalled server). Past DRAIN_BYTES
    the connection is dropped instead, and the server frees the scanner with it."""
    with HQueueAdmin(url) as admin:
        admin.create_queue("big", 1)
    with HQueue("big", url) as queue:
        queue.put([Message("t", b"%02d" % i + b"x" * 600_000) for i in range(12)], partition_id=0)
        take, taken = ScannerRegistry.take, []

        def slow(self, *args, **kwargs):  # the batches after the first come LATE seconds late
            taken.append(args)
            if len(taken) > 1:
                time.sleep(LATE)
            return take(self, *args, **kwargs)

        monkeypatch.setattr(ScannerRegistry, "take", slow)
        started = time.monotonic()
        with queue.get_partition_scanner(0, caching=2) as scanner:
            assert next(scanner).value[:2] == b"00"
        assert time.monotonic() - started < LATE - 0.5  # (the answers ahead not waited for)
        monkeypatch.setattr(ScannerRegistry, "take", take)
        assert [m.value[:2] for m in queue.scan(partition_id=0, limit=3)] == [b"00", b"01", b"02"]

        async def awaited() -> float:
            async with AsyncHQueue("big", url) as aqueue:
                taken.clear()
                monkeypatch.setattr(ScannerRegistry, "take", slow)
                started = time.monotonic()
                async for message in aqueue.scan(partition_id=0, caching=2):
                    assert message.value[:2] == b"00"
                    break
                return time.monotonic() - started

        assert asyncio.run(awaited()) < LATE - 0.5


def test_a_scan_that_ends_reads_its_empty_answers_ahead_and_keeps_its_connection(url, monkeypatch):
    """At its end a scan's answers ahead are empty: one whose last batch passed DRAIN_BYTES
    dropped its pooled connection all the same (a new connection, and TLS handshake, each
    scan of that size)."""
    from hqueue.client import cursor

    releases, release = [], cursor.RemoteCursor._release

    def counted(self, broken=False):
        releases.append(broken)
        return release(self, broken)

    monkeypatch.setattr(cursor.RemoteCursor, "_release", counted)
    with HQueueAdmin(url) as admin:
        admin.create_queue("kb", 1)
    with HQueue("kb", url) as queue:
        for _ in range(7):
            queue.put([Message("t", b"x" * 1000)] * 1000, partition_id=0)
        assert sum(len(batch) for batch in queue.scan_batches(partition_id=0, batch_size=5000)) == 7000
    assert releases and not any(releases)
