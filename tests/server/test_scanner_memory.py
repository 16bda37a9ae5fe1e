"""Server-side scanners hold bounded memory, whatever the messages' sizes and
however many scanners a client opens (the attacker's pass of issue 18: 100
scanners reading one 1 MiB message each held 6.4 GiB in the server)."""

from __future__ import annotations

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.errors import LimitExceeded
from hqueue.scanner import Scan
from hqueue.server import HQueueServer
from hqueue.server.scanners import HELD_BYTES, MAX_PER_CONNECTION, ColumnScanner, ScannerRegistry

from .test_hardening import raw_client

MiB = 1024 * 1024


@pytest.fixture
def engine(tmp_path):
    from hqueue.engine import Engine

    engine = Engine.acquire("local://" + str(tmp_path / "data"))
    yield engine
    engine.release()


def held(scanner: ColumnScanner) -> int:
    """Bytes of cells the scanner read and keeps between calls."""
    at = scanner._at
    return sum(map(len, scanner._keys[at:])) + sum(map(len, scanner._values[at:]))


def test_a_scanner_of_big_messages_reads_few_and_keeps_little_between_calls(engine):
    from hqueue.config import QueueInfo

    engine.create_queue(QueueInfo("big", 1))
    for i in range(64):
        engine.put("big", [Message("t", b"%03d" % i + b"x" * MiB)], 0)
    scanner = ColumnScanner(engine, "big", 0, Scan())
    seen = []
    while True:
        keys, values = scanner.take(1)
        if not keys:
            break
        seen += [v[:3] for v in values]
        assert held(scanner) <= HELD_BYTES  # not the rest of a 1,000-cell chunk of 1 MiB cells
    assert seen == [b"%03d" % i for i in range(64)]  # every message once, in order


def test_a_scanner_of_small_messages_still_reads_in_big_chunks(engine):
    from hqueue.config import QueueInfo

    engine.create_queue(QueueInfo("small", 1))
    engine.put("small", [Message("t", b"%05d" % i) for i in range(5000)], 0)
    scanner = ColumnScanner(engine, "small", 0, Scan())
    got = []
    while keys_values := scanner.take(1000)[1]:
        got += keys_values
    assert got == [b"%05d" % i for i in range(5000)]
    assert scanner.count <= 8  # a first read of 16, then whole replies: not a read per message


def test_a_connection_and_the_server_open_a_bounded_number_of_scanners(engine):
    from hqueue.config import QueueInfo

    engine.create_queue(QueueInfo("q", 1))
    registry = ScannerRegistry()
    try:
        ids = [registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=7) for _ in range(MAX_PER_CONNECTION)]
        with pytest.raises(LimitExceeded, match="close one first"):
            registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=7)
        registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=8)  # another connection may
        registry.close(ids[0], owner=7)
        registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=7)  # room again
    finally:
        registry.stop()


def test_through_a_server_a_scan_of_big_messages_is_whole_and_the_scanners_are_capped(tmp_path):
    server = HQueueServer("local://" + str(tmp_path / "data"), port=0).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("big", 1)
        with HQueue("big", url) as queue:
            for i in range(20):
                queue.put(Message("t", b"%03d" % i + b"x" * MiB), 0)
            assert [m.value[:3] for m in queue.scan(limit=3)] == [b"000", b"001", b"002"]
            assert [m.value[:3] for m in queue.scan()] == [b"%03d" % i for i in range(20)]
        from hqueue.rpc import wire
        from hqueue.rpc.wire import T

        client = raw_client(server.port)
        try:
            for _ in range(MAX_PER_CONNECTION):
                sid = client.messageScannerOpen("big", 0, wire.to_tscan(Scan()))
                assert client.messageScannerGetList(sid, 1)
            assert sum(held(s) for s, _, _ in server.scanners._scanners.values()) <= MAX_PER_CONNECTION * HELD_BYTES
            with pytest.raises(T.TInvalidMessage, match="close one first"):
                client.messageScannerOpen("big", 0, wire.to_tscan(Scan()))
        finally:
            client.close()
    finally:
        server.stop()
