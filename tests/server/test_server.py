"""The hqueue server over the wire: typed errors, bad frames, scanners, shutdown."""

import socket
import struct
import threading
import time

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from hqueue import HQueue, HQueueAdmin, HQueueError, Message, NoPartitionOwner, QueueInfo, QueueNotFound, Scan
from hqueue.client.engine import RemoteEngine
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from ..processes import ServerProcess, drain, wait_for


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, idle_timeout=0.5).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 4, max_message_bytes=1000)
    yield server
    server.stop()


@pytest.fixture
def client(server):
    """A raw Thrift client, as any generated client would talk."""
    client = make_client(
        T.HQueueService, "127.0.0.1", server.port,
        proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(), timeout=10_000,
    )  # fmt: skip
    yield client
    client.close()


def test_the_nine_seed_calls_work_over_the_wire(server, client):
    tid = client.putMessage("q", T.TMessage(topic=b"t", value=b"a"))
    ids = client.putMessages("q", [T.TMessage(topic=b"t", value=b"b")] * 2)
    one = client.putMessageWithPid("q", 2, T.TMessage(topic=b"u", value=b"c"))
    many = client.putMessagesWithPid("q", 2, [T.TMessage(topic=b"u", value=b"d")] * 3)
    assert tid.timestamp > 0 and len(ids) == 2 and len(many) == 3
    assert (many[0].timestamp, many[0].sequenceID) > (one.timestamp, one.sequenceID)
    assert client.getQueueLocations("q") == [server.address] * 4
    scanner = client.messageScannerOpen("q", 2, T.TMessageScan(topics=[b"u"]))
    first = client.messageScannerGet(scanner)
    rest = client.messageScannerGetList(scanner, 100)
    assert [m.value for m in [first, *rest]] == [b"c", b"d", b"d", b"d"]
    assert client.messageScannerGet(scanner).id is None  # the end
    assert client.messageScannerGetList(scanner, 10) == []
    client.messageScannerClose(scanner)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda c: c.putMessage("nope", T.TMessage(topic=b"t", value=b"x")), "TQueueNotFound"),
        (lambda c: c.putMessageWithPid("q", 9, T.TMessage(topic=b"t", value=b"x")), "TInvalidMessage"),
        (lambda c: c.putMessageWithPid("q", -1, T.TMessage(topic=b"t", value=b"x")), "TInvalidMessage"),
        (lambda c: c.putMessage("q", T.TMessage(topic=b"t", value=b"x" * 2000)), "TInvalidMessage"),
        (lambda c: c.putMessage("q", T.TMessage(topic=b"", value=b"x")), "TInvalidMessage"),
        (lambda c: c.putMessage("q", T.TMessage(topic=b"t")), "TInvalidMessage"),
        (lambda c: c.putMessages("q", []), "TInvalidMessage"),
        (lambda c: c.messageScannerOpen("nope", 0, T.TMessageScan()), "TQueueNotFound"),
        (lambda c: c.messageScannerGetList(12345, 10), "TInvalidMessage"),
        (lambda c: c.messageScannerGetList(1, 0), "TInvalidMessage"),
        (lambda c: c.createQueue(T.TQueueInfo(name="bad name", partitions=1)), "TInvalidMessage"),
        (lambda c: c.createQueue(T.TQueueInfo(name="q", partitions=1)), "TQueueExists"),
        (lambda c: c.dropQueue("q"), "TInvalidMessage"),  # enabled: must be disabled first
        (lambda c: c.describeQueue("nope"), "TQueueNotFound"),
        (lambda c: c.getQueue("nope"), "TQueueNotFound"),
    ],
)
def test_bad_input_gets_a_typed_exception_and_the_connection_lives(client, call, error):
    with pytest.raises(Exception) as info:
        call(client)
    assert type(info.value).__name__ == error, info.value
    # the same connection keeps serving
    assert client.putMessage("q", T.TMessage(topic=b"t", value=b"ok")).timestamp > 0


def test_a_disabled_queue_is_typed_over_the_wire(client):
    client.disableQueue("q")
    with pytest.raises(T.TQueueDisabled):
        client.putMessage("q", T.TMessage(topic=b"t", value=b"x"))
    client.enableQueue("q")


def _raw(server, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            return s.recv(1024)
        except OSError:  # the server closed first
            return b""


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not Thrift at all
        struct.pack("!i", 0x7FFFFFF0) + b"\x80\x01",  # a 2 GB frame that never comes
        struct.pack("!i", 20) + b"\x80\x01\x00\x01" + b"\x00" * 4,  # a truncated frame
        struct.pack("!i", 12) + b"\x80\x01\x00\x01\x00\x00\x00\x05nosuc",  # garbage inside a frame
        struct.pack("!i", -5),  # a negative frame size
    ],
)
def test_malformed_frames_end_only_their_own_connection(server, client, payload):
    _raw(server, payload)
    assert client.putMessage("q", T.TMessage(topic=b"t", value=b"still serving")).timestamp > 0
    with HQueue("q", f"hqueue://{server.address}") as queue:
        assert any(m.value == b"still serving" for m in queue.scan())


def test_an_unknown_method_is_an_application_error_not_a_crash(server, client):
    frame_body = struct.pack("!I", 0x80010001) + struct.pack("!i", 6) + b"bogus!" + struct.pack("!i", 1) + b"\x00"
    reply = _raw(server, struct.pack("!i", len(frame_body)) + frame_body)
    assert b"bogus!" in reply  # a TApplicationException names the method
    assert client.listQueues()[0].name == "q"


def test_idle_scanners_are_closed_by_the_server(server, client):
    scanner = client.messageScannerOpen("q", 0, T.TMessageScan())
    time.sleep(1.5)  # idle_timeout is 0.5 s; the reaper runs every 0.25 s
    with pytest.raises(T.TInvalidMessage, match="not open"):
        client.messageScannerGetList(scanner, 10)
    assert len(server.scanners) == 0


def test_sigterm_drains_and_exits_cleanly_and_data_survives(tmp_path):
    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{proc.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    with HQueue("q", url) as queue:
        ids = queue.put([Message("t", b"%d" % i) for i in range(100)], partition_id=1)
    assert proc.terminate() == 0
    assert "stopped" in proc.log_path.read_text()
    proc.start()
    with HQueue("q", f"hqueue://{proc.address}") as queue:
        assert [m.id for m in queue.scan()] == ids
    proc.terminate()


@pytest.mark.slow
@pytest.mark.parametrize(
    "durability, writers, batch",
    [("ASYNC_WAL", 1, 10), ("SYNC_WAL", 8, 1)],
    ids=["batches", "sync-wal-single-puts-sharing-the-loops-fsync"],
)
def test_kill_9_the_server_mid_load_loses_no_acknowledged_message(tmp_path, durability, writers, batch):
    """Crash proof through the server: SIGKILL it 3 times under a remote load (with
    SYNC_WAL single puts from 8 connections, the event loop's writes whose answers wait
    for the fsync at the end of its turn)."""
    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{proc.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 4, durability=durability)
    acked, errors, stop = [], [], threading.Event()

    def write(n: int) -> None:
        with HQueue("q", url) as queue:
            i = n
            while not stop.is_set():
                try:
                    messages = [Message("t", b"%d" % i)] * batch
                    acked.extend((i % 4, mid) for mid in queue.put(messages, partition_id=i % 4))
                except Exception as e:
                    errors.append(repr(e))
                i += 1

    threads = [threading.Thread(target=write, args=(n,), daemon=True) for n in range(writers)]
    for thread in threads:
        thread.start()
    for _ in range(3):
        time.sleep(1.0)
        count = len(acked)
        proc.kill()  # SIGKILL mid-load
        proc.start()  # same port: the client's retries reach it again
        wait_for(lambda count=count: len(acked) > count + 50, 60, "the writer to resume")
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [], errors[:3]
    with HQueue("q", url) as queue:
        stored = {(m.partition_id, m.id) for m in queue.scan()}  # an ID is unique within its partition
    lost = [i for i in acked if i not in stored]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged messages lost"
    assert len(set(acked)) == len(acked), "an ID acknowledged twice"
    print(f"\nserver crash test: 3 kill -9 cycles, {len(acked)} acknowledged, 0 lost")
    proc.terminate()


def test_a_put_with_no_server_up_times_out_with_a_clear_error(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    engine = RemoteEngine(f"hqueue://{server.address}", owner_timeout=1.0)
    engine.create_queue(QueueInfo("q", 2))
    engine.put("q", [Message("t", b"x")], 0)
    server.stop()
    started = time.monotonic()
    with pytest.raises(NoPartitionOwner, match="within 1s"):
        engine.put("q", [Message("t", b"y")], 0)
    assert time.monotonic() - started < 10
    engine.release()


def test_typed_errors_do_not_leak_connections(server):
    engine = RemoteEngine(f"hqueue://{server.address}")
    try:
        for _ in range(50):
            with pytest.raises(HQueueError):
                engine.describe_queue("missing")
        pool = engine._pool(server.address)
        assert pool._idle.qsize() == 1  # one connection, reused every time
    finally:
        engine.release()


def test_a_queue_sharing_the_store_with_a_stopped_server_keeps_its_groups_and_timers(tmp_path):
    """A server and an HQueue in one process on one local store share its engine: when
    the server stops, its services go with it and the process serves the store itself."""
    url = f"local://{tmp_path}/shared"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        server = HQueueServer(url, port=0).start()
        server.stop()
        queue.put(Message("t", b"now"))
        queue.put(Message("t", b"soon"), partition_id=0, delay=0.2)
        with queue.consumer("g") as member:
            got = []
            wait_for(lambda: got.extend(member.receive(2, wait=0.5)) or len(got) >= 2, 10, "both messages")
        assert sorted(d.value for d in got) == [b"now", b"soon"]


def test_a_scanner_idle_past_the_server_s_timeout_goes_on_where_it_was(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        ids = queue.put([Message("t", b"%d" % i) for i in range(35)], partition_id=2)
        # Given a scan read for one chunk, then left idle past the server's scanner timeout
        scanner = queue.get_partition_scanner(2, Scan(), caching=10)
        first = [scanner.next() for _ in range(10)]
        wait_for(lambda: len(server.scanners) == 0, 10, "the server to close the idle scanner")
        # When it reads on
        rest = list(scanner)
    # Then it opened another after the last message it handed out: none twice, none missed
    assert [m.id for m in first + rest] == ids  # type: ignore[union-attr]


def test_a_server_stopped_cleanly_counts_no_failure_for_the_messages_its_members_held(tmp_path):
    """A clean stop closes its members' connections: that is not their going (which counts
    their leases failed): what they held goes back unseen. With max_retries=0 each held
    message was dead-lettered at every SIGTERM (a rolling restart, a rebalance's leave)."""
    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    try:
        with HQueueAdmin(f"hqueue://{proc.address}") as admin:
            admin.create_queue("q", 2)
        with HQueue("q", f"hqueue://{proc.address}", timeout=5) as queue:
            queue.put([Message("t", b"%d" % i) for i in range(10)])
            member = queue.consumer("g", member="m", lease=60, max_retries=0)
            held = drain(member, 10, 20)
            assert proc.terminate() == 0
            member.close()  # (its server is gone: nothing to leave)
        proc.start()
        with HQueue("q", f"hqueue://{proc.address}") as queue, queue.consumer("g", max_retries=0) as again:
            back = drain(again, 10, 20)
            again.ack(back)
        assert sorted(d.value for d in back) == sorted(d.value for d in held)
        assert {d.attempt for d in back} == {1}
        with HQueueAdmin(f"hqueue://{proc.address}") as admin:
            assert not admin.queue_exists("q.dlq")
    finally:
        proc.kill()


def test_a_scan_goes_on_through_a_server_restart(server_process):
    with HQueue("q", f"hqueue://{server_process.address}") as queue:
        put = [(p, i) for p in (0, 1) for i in queue.put([Message("t", b"x")] * 50, partition_id=p)]
        # Given a scan of both partitions, part read
        scanner = queue.get_queue_scanner(Scan(), caching=7)
        first = [scanner.next() for _ in range(20)]
        # When the server is killed and comes back on its port
        server_process.kill()
        server_process.start()
        rest = list(scanner)
    # Then the scan went on from where each partition was: every message once, in ID order
    read = [(m.partition_id, m.id) for m in first + rest]  # type: ignore[union-attr]
    assert len(read) == len(put) and set(read) == set(put)
    assert [i for _, i in read] == sorted(i for _, i in read)


def remade_while_down(proc: ServerProcess, data: str) -> set:
    """Kill the server, delete queue 'q' and make it again on its store (put 50 there), and
    start the server again on its port: the new queue's message IDs."""
    proc.kill()
    with HQueueAdmin(f"local://{data}") as admin:
        admin.disable_queue("q")
        admin.delete_queue("q")
        admin.create_queue("q", 2)
    with HQueue("q", f"local://{data}") as again:
        new = {(p, i) for p in (0, 1) for i in again.put([Message("t", b"new")] * 50, partition_id=p)}
    proc.start()
    return new


def test_a_scan_reopened_after_a_restart_on_a_queue_made_again_says_so(server_process, tmp_path):
    """A scanner opened again after a restart read on into the new queue made under the
    same name while the server was down (a server-side scanner checks only the queue it
    opened on). The cursor checks the queue is the one it began on."""
    with HQueue("q", f"hqueue://{server_process.address}") as queue:
        queue.put([Message("t", b"old")] * 50, partition_id=0)
        scanner = queue.get_partition_scanner(0, Scan(), caching=7)
        read = [scanner.next() for _ in range(3)]
        new = remade_while_down(server_process, f"{tmp_path}/data")
        with pytest.raises(QueueNotFound, match="deleted and created again"):
            read += list(scanner)
    assert {m.value for m in read} == {b"old"} and not {(m.partition_id, m.id) for m in read} & new


def test_a_scan_begun_after_the_queue_was_made_again_reads_the_new_one(server, tmp_path):
    """A client's definition of the queue is cached (2 s): a scan begun just after another
    client made the queue again opened its cursors on the new queue, found it was not the
    cached one, and said QueueNotFound (an attacker's probe); a partition the new queue has
    and the old had not was refused. It reads the new queue."""
    import asyncio

    from hqueue.aio import AsyncHQueue

    url = f"hqueue://{server.address}"

    def remake() -> None:  # (through the server's engine: not this client's)
        with HQueueAdmin(f"local://{tmp_path}/data") as admin:
            admin.delete_queue("q", force=True)
            admin.create_queue("q", 6)
        with HQueue("q", f"local://{tmp_path}/data") as there:
            there.put(Message("t", b"new"), partition_id=5)

    with HQueue("q", url) as queue:
        queue.put(Message("t", b"old"), partition_id=0)
        assert [m.value for m in queue.scan()] == [b"old"]  # (its definition cached: 4 partitions)
        remake()
        assert [m.value for m in queue.scan()] == [b"new"]
        assert [m.value for b in queue.scan_batches() for m in b] == [b"new"]
        assert [m.value for m in queue.get_partition_scanner(5)] == [b"new"]
        assert {s.partition_id for s in queue.splits()} == set(range(6))

    async def main() -> tuple[list[bytes], list[bytes]]:
        async with AsyncHQueue("q", url) as aqueue:
            assert [m.value async for m in aqueue.scan()] == [b"new"]  # (cached: 6 partitions)
            await asyncio.to_thread(remake)
            every = [m.value async for m in aqueue.scan()]
            one = [m.value async for m in aqueue.scan(partition_id=5)]
            return every, one

    assert asyncio.run(main()) == ([b"new"], [b"new"])


def test_a_put_s_priority_and_next_due_read_a_queue_made_again_with_more(server, tmp_path):
    """A priority past the cached definition's tiers was refused for up to 2 s after another
    client made the queue again with more tiers, and next_due() asked the cached partition
    count (InvalidPartition with fewer, a timer missed with more) where count_timers() and
    timers() read the queue afresh (an attacker's pass)."""
    import asyncio

    from hqueue.aio import AsyncHQueue

    url = f"hqueue://{server.address}"

    def remake(partitions: int, priorities: int) -> None:  # (through the server's engine: not this client's)
        with HQueueAdmin(f"local://{tmp_path}/data") as admin:
            admin.delete_queue("tiers", force=True)
            admin.create_queue("tiers", partitions, priorities=priorities)

    with HQueueAdmin(url) as admin:
        admin.create_queue("tiers", 4, priorities=2)
    with HQueue("tiers", url) as queue:
        queue.put(Message("t", b"cached"), priority=1)  # (its definition cached: 4 partitions, 2 tiers)
        assert queue.next_due() is None
        remake(8, 4)
        assert queue.put(Message("t", b"top"), priority=3)
        later = queue.put(Message("t", b"later"), 7, delay=600)[0]
        assert queue.next_due() == later.due == queue.timers()[0][0].due
        remake(2, 2)
        assert queue.next_due() is None

    async def main() -> None:
        async with AsyncHQueue("tiers", url) as aqueue:
            await aqueue.put(Message("t", b"cached"), priority=1)
            await asyncio.to_thread(remake, 8, 4)
            assert await aqueue.put(Message("t", b"top"), priority=3)

    asyncio.run(main())


def test_clients_reach_a_server_on_ipv6(tmp_path):
    """hqueue://[::1]:port named a host '[::1]' that did not resolve, and the client's
    sockets were IPv4 whatever the address."""
    import asyncio

    from hqueue.aio import AsyncHQueue

    server = HQueueServer(f"local://{tmp_path}/data", host="::1", port=0).start()
    try:
        assert server.address == f"[::1]:{server.port}"  # '::1:port' was no address a client could split
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("v6", 2)
        with HQueue("v6", url) as queue:
            assert queue.engine.locations("v6") == [server.address] * 2
            queue.put(Message("t", b"blocking"), partition_id=0)
            with queue.consumer("g") as consumer:
                assert [d.value for d in consumer.receive(wait=5)] == [b"blocking"]

        async def main() -> list[bytes]:
            async with AsyncHQueue("v6", url) as queue:
                await queue.put(Message("t", b"asyncio"), partition_id=1)
                return [m.value async for m in queue.scan()]

        assert sorted(asyncio.run(asyncio.wait_for(main(), 30))) == [b"asyncio", b"blocking"]
    finally:
        server.stop()


def test_a_server_on_every_interface_is_reached_where_the_url_says(tmp_path):
    """A server listening on 0.0.0.0 with no --advertise named itself the partitions' owner
    at 0.0.0.0:port: a client on another host would have put to its own host (perhaps to
    another hqueue server there). The owner is the server the URL names, on its port."""
    server = HQueueServer(f"local://{tmp_path}/data", host="0.0.0.0", port=0).start()
    try:
        url = f"hqueue://127.0.0.1:{server.port}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("wide", 2)
        with HQueue("wide", url) as queue:
            assert queue.engine.locations("wide") == [f"127.0.0.1:{server.port}"] * 2
            queue.put(Message("t", b"x"), partition_id=1)
            assert [m.value for m in queue.scan()] == [b"x"]
    finally:
        server.stop()


def test_a_cluster_server_on_every_interface_must_advertise_an_address(tmp_path):
    for host in ("0.0.0.0", "::", "::ffff:0.0.0.0"):
        with pytest.raises(HQueueError, match="advertise"):
            HQueueServer("hbase://127.0.0.1:1/ns", host=host, port=0, coordinator_factory=lambda address: None)


def test_owners_named_by_a_wildcard_are_the_server_the_url_names():
    from hqueue.auth import is_wildcard
    from hqueue.client.engine import owner_addresses

    # as the URL names it: a forwarded or published port is not the one the server bound
    assert owner_addresses(["0.0.0.0:9700", "", "h2:9701"], ["h1:19700"]) == ["h1:19700", "", "h2:9701"]
    assert owner_addresses(["[::]:9702"], ["[fd00::1]:9700"]) == ["[fd00::1]:9700"]
    assert owner_addresses(["0.0.0.0:9700"], ["h1:9700", "h2:9700"]) == ["0.0.0.0:9700"]  # which one: unknown
    # ::ffff:0.0.0.0 too: a dual-stack socket bound to it listens on every interface (an attacker's pass)
    for host in ("0.0.0.0", "::", "[::]", "", "0", "::0", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0", "[::ffff:0:0]"):
        assert is_wildcard(host), host
    for host in ("127.0.0.1", "::1", "localhost", "h1", "10.0.0.0", "::ffff:127.0.0.1"):
        assert not is_wildcard(host), host


def test_each_address_a_host_name_resolves_to_is_dialled_in_turn(tmp_path, monkeypatch):
    """The blocking client made an IPv4 socket for every host name (one with only IPv6
    addresses could not be reached), and gave the first address all of a call's time."""
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        v6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))
        if host == "v6only.test":
            return [v6]
        if host == "dual.test":  # an address that never answers, then this host
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", silent.getsockname()), *real("127.0.0.1", port)]
        return real(host, port, *args, **kwargs)

    silent = socket.socket()  # a listener whose accept queue is full: connecting to it hangs
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    queued = socket.create_connection(silent.getsockname())
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    v4 = HQueueServer(f"local://{tmp_path}/v4", host="127.0.0.1", port=0).start()
    v6 = HQueueServer(f"local://{tmp_path}/v6", host="::1", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://v6only.test:{v6.port}") as admin:
            admin.create_queue("named", 1)
            assert [q.name for q in admin.list_queues()] == ["named"]
        # the blackholed address has half of the 4 s: the second is reached within the call's timeout
        with HQueueAdmin(f"hqueue://dual.test:{v4.port}?timeout=4") as admin:
            assert admin.list_queues() == []
    finally:
        v4.stop()
        v6.stop()
        queued.close()
        silent.close()


def test_a_consumer_closed_while_another_thread_receives_leaves_the_group(tmp_path):
    """A worker thread's receive went on polling after the main thread closed its consumer
    (a shutdown): each poll counted the member in again, and the others waited for its
    partitions until it timed out."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 4)
        with HQueue("q", url) as queue, queue.consumer("g", member="b") as b:
            b.receive(wait=0)
            a = queue.consumer("g", member="a")
            got: list = []
            worker = threading.Thread(target=lambda: got.append(a.receive(wait=20)))
            worker.start()
            time.sleep(0.3)  # its long poll is at the server
            a.close()
            worker.join(30)
            assert not worker.is_alive() and got == [[]]
            with HQueueAdmin(url) as admin:
                assert admin.describe_group("q", "g")["members"] == ["b"]
            for partition in range(4):
                queue.put(Message("t", b"%d" % partition), partition_id=partition)
            assert sorted(d.partition_id for d in b.receive(10, wait=5)) == [0, 1, 2, 3]
    finally:
        server.stop()


def test_a_closed_consumer_does_not_receive(tmp_path):
    """A receive after close() joined the group again, silently."""
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        admin.create_queue("q", 1)
    with HQueue("q", f"local://{tmp_path}/data") as queue:
        consumer = queue.consumer("g")
        consumer.close()
        with pytest.raises(RuntimeError, match="is closed"):
            consumer.receive(wait=0)


def test_optional_arguments_sent_empty_are_unset_as_a_c_plus_plus_or_go_client_sends_them(server, client):
    """Apache Thrift's compilers ignore ``optional`` in argument lists: their C++ and Go
    clients send "" or 0 or [] for an argument left out. openGroup refused keyAffinity "",
    and with topics [] made a group that received nothing; addSubscriber refused
    deadLetterAfter 0; putPacked refused an empty TRequest; scheduleTimers empty dues."""
    from hqueue.ids import wall_clock_ms
    from hqueue.rpc import packed

    batch = packed.pack([b"t", b"t"], [b"a", b"b"])
    put = client.putPacked("q", 0, batch, T.TRequest(lane=b"", sequence=0, resent=False))
    assert put.count == 2
    client.openGroup("q", "g", [], 0, 3, "")
    received = client.groupReceive("q", "g", "m", 10, 60_000, 0)
    assert packed.unpack(received.messages)[1] == [b"a", b"b"]  # all topics
    client.addSubscriber("q", "s", [], None, 0)  # (0: never dead-lettered)
    assert client.describeSubscriber("s", "q").topics is None  # all topics
    timers = client.scheduleTimers("q", 1, batch, wall_clock_ms() + 60_000, b"", T.TRequest(lane=b"", sequence=0))
    assert timers.count == 2


def test_hqueue_s_own_client_refuses_what_the_wire_would_read_as_unset(server):
    """Through a server, dead_letter_after=0 went out as 0 and was read as unset (never
    dead-lettered), where in process it is refused; and a group of no topic is refused
    alike, not read as all of them."""
    from hqueue.errors import InvalidArgument

    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin, pytest.raises(InvalidArgument, match="'dead_letter_after' must be"):
        admin.add_subscriber("q", "s", dead_letter_after=0)
    with HQueue("q", url) as queue, pytest.raises(InvalidArgument, match="names no topic"):
        queue.consumer("g", topics=[])


def test_a_group_stored_naming_no_topic_opens_as_one_of_all_topics():
    from hqueue.groups.state import GroupConfig

    config = GroupConfig.from_json(b'{"topics": [], "start": 0, "max_retries": 3}')
    assert config.topics is None
