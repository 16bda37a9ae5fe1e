"""Server-side scanners hold bounded memory, whatever the messages' sizes and
however many scanners a client opens (the attacker's pass of issue 18: 100
scanners reading one 1 MiB message each held 6.4 GiB in the server)."""

from __future__ import annotations

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.errors import InvalidArgument, LimitExceeded
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


def test_one_token_s_connections_open_a_quarter_of_the_server_s_scanners(engine, monkeypatch):
    """One token opened every scanner the server has (10,000 over 157 connections, kept
    alive by a read each minute): every other token's scans failed with LimitExceeded."""
    from hqueue.config import QueueInfo
    from hqueue.server import scanners

    monkeypatch.setattr(scanners, "MAX_SCANNERS", 40)
    monkeypatch.setattr(scanners, "MAX_PER_PRINCIPAL", 10)
    engine.create_queue(QueueInfo("q", 1))
    registry = ScannerRegistry()
    try:
        ids = [
            registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=connection, principal="tenant")
            for connection in range(1, 11)
        ]
        with pytest.raises(LimitExceeded, match="token 'tenant' have 10 scanners open"):
            registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=11, principal="tenant")
        other = registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=12, principal="other")  # the others may
        registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=13)  # and a server without tokens counts none
        # A scanner closed, or its connection gone, or reaped idle, gives its room back
        registry.close(ids[0], owner=1, principal="tenant")
        ids[0] = registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=1, principal="tenant")
        registry.close_owned(2)
        ids[1] = registry.open(ColumnScanner(engine, "q", 0, Scan()), owner=2, principal="tenant")
        # A connection that authenticated again as another token has none of the first one's scanners
        with pytest.raises(InvalidArgument, match="not open on this connection"):
            registry.take(ids[0], 1, owner=1, principal="other")
        with pytest.raises(InvalidArgument, match="not open on this connection"):
            registry.close(other, owner=12, principal="tenant")
        assert registry.take(other, 1, owner=12, principal="other") == ([], [])
        registry.idle_timeout = 0
        assert registry.reap() == 12
        assert not registry._per_principal and not registry._principals
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


def test_a_connection_authenticated_again_as_another_token_reads_none_of_the_first_one_s_scanners(tmp_path):
    from hqueue.rpc import wire
    from hqueue.rpc.wire import T

    from .test_hardening import ADMIN, CRAWLER, _token_server

    server = _token_server(tmp_path)
    try:
        with HQueueAdmin(f"hqueue://{server.address}", token=ADMIN) as admin:
            admin.create_queue("crawl.q", 1)
            admin.create_queue("ops.q", 1)
        with HQueue("ops.q", f"hqueue://{server.address}", token=ADMIN) as queue:
            queue.put(Message("t", b"secret"), 0)
        client = raw_client(server.port)
        try:
            client.authenticate(ADMIN)
            scanner = client.messageScannerOpen("ops.q", 0, wire.to_tscan(Scan()))
            client.authenticate(CRAWLER)  # a token with no role on ops.*
            with pytest.raises(T.TInvalidMessage, match="not open on this connection"):
                client.messageScannerGetPacked(scanner, 10)
            client.authenticate(ADMIN)
            assert len(client.messageScannerGetList(scanner, 10)) == 1  # its own again
        finally:
            client.close()
    finally:
        server.stop()


def test_a_connection_s_scanners_are_freed_when_it_ends_whatever_it_called_first(tmp_path):
    """Scanners were freed with their connection only if a scanner was the first thing on it
    to ask for that: after a group call, they stayed until the idle reaper (and held their
    token's share meanwhile)."""
    from hqueue.rpc import wire

    from ..processes import wait_for
    from .test_hardening import ADMIN, _token_server

    server = _token_server(tmp_path)
    try:
        with HQueueAdmin(f"hqueue://{server.address}", token=ADMIN) as admin:
            admin.create_queue("ops.q", 1)
        client = raw_client(server.port)
        try:
            client.authenticate(ADMIN)
            client.openGroup("ops.q", "g", None, 0, 3, None)
            client.groupReceive("ops.q", "g", "m", 1, 1000, 0)  # (a group call first)
            for _ in range(5):
                client.messageScannerOpen("ops.q", 0, wire.to_tscan(Scan()))
            assert len(server.scanners) == 5 and server.scanners._per_principal == {"ops": 5}
        finally:
            client.close()
        wait_for(lambda: len(server.scanners) == 0, 10, "the scanners freed with their connection")
        assert not server.scanners._per_principal
    finally:
        server.stop()


def test_on_a_server_without_tokens_no_token_s_share_is_counted(tmp_path):
    """A client that sends a token to a server without tokens is let in as anybody: its
    scanners counted in one share for all such clients (2,500), and a connection that
    authenticated after opening some lost them."""
    from hqueue.rpc import wire

    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 1)
        client = raw_client(server.port)
        try:
            scanner = client.messageScannerOpen("q", 0, wire.to_tscan(Scan()))
            client.authenticate("any-token-at-all")
            client.messageScannerOpen("q", 0, wire.to_tscan(Scan()))
            assert client.messageScannerGetList(scanner, 10) == []  # still its own
            assert not server.scanners._per_principal
        finally:
            client.close()
    finally:
        server.stop()


def test_replies_read_as_thrift_structs_fit_apache_thrift_s_default_frame_limit(tmp_path):
    """Apache Thrift's generated clients (Java, Go, Python) read frames of at most 16,384,000
    bytes by default: a messageScannerGetList or groupReceive of 1,000 messages of 20 KB
    (20 MB) failed there, the receive's messages leased all the same. The packed scan reply
    keeps its 16 MiB (hqueue's clients take a shorter one for the scan's end)."""
    from thriftpy2.transport import TMemoryBuffer

    from hqueue.rpc import wire
    from hqueue.rpc.wire import T

    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 1)
        with HQueue("q", f"hqueue://{server.address}") as queue:
            for _ in range(2):
                queue.put([Message("t", b"v" * 20_000)] * 500, partition_id=0)
        client = raw_client(server.port)
        try:

            def frame_bytes(struct) -> int:
                buffer = TMemoryBuffer()
                struct.write(TBinaryProtocolFactory().get_protocol(buffer))
                return len(buffer.getvalue())

            listed = client.messageScannerGetList(client.messageScannerOpen("q", 0, wire.to_tscan(Scan())), 1000)
            result = T.HQueueService.messageScannerGetList_result(success=listed)
            assert 400 <= len(listed) < 1000 and frame_bytes(result) < 16_384_000
            client.openGroup("q", "g", None, 0, 3, None)
            received = client.groupReceive("q", "g", "m", 1000, 60_000, 0)
            result = T.HQueueService.groupReceive_result(success=received)
            assert frame_bytes(result) < 16_384_000
            packed_reply = client.messageScannerGetPacked(
                client.messageScannerOpen("q", 0, wire.to_tscan(Scan())), 1000
            )
            assert len(packed_reply) > wire.SCAN_REPLY_BYTES
        finally:
            client.close()
    finally:
        server.stop()
