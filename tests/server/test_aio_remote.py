"""hqueue.aio over hqueue servers: deadlines, tokens and TLS, as the blocking client.

Given a server that never answers, an async call ends by its deadline with
DeadlineExceeded; given a server with tokens and TLS, the async client
authenticates and speaks TLS the same way (and a wrong token is NotAuthorized).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable

import pytest
from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TMemoryBuffer, TTransportException

from hqueue import DeadlineExceeded, HQueue, HQueueAdmin, Message, NotAuthorized, QueueNotFound, ServerUnavailable
from hqueue.aio import AsyncHQueue, AsyncHQueueAdmin
from hqueue.auth import AuthPolicy
from hqueue.rpc import wire
from hqueue.server import HQueueServer

from ..api.test_aio import client_sockets
from ..processes import ServerProcess, server_certificate
from .test_hardening import ADMIN, AUTH_FILE, CRAWLER

TIMEOUT = 1.0


@pytest.fixture
def black_hole():
    """A listening socket that never accepts: connections open, nothing ever answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_call_to_a_server_that_never_answers_ends_by_its_deadline(black_hole):
    async def main():
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            async with AsyncHQueueAdmin(f"hqueue://{black_hole}?timeout={TIMEOUT}") as admin:
                await admin.list_queues()
        return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert elapsed < TIMEOUT * 3  # a correctness bound (no call waits forever), not a measurement


def test_an_awaited_receive_has_the_timeout_plus_its_wait(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 2)

        async def main():
            async with AsyncHQueue("q", f"hqueue://{server.address}?timeout={TIMEOUT}") as queue:
                async with queue.consumer("g") as consumer:
                    return await consumer.receive(wait=TIMEOUT * 2)  # longer than the timeout: no error

        assert asyncio.run(main()) == []
    finally:
        server.stop()


def test_tokens_and_tls_as_the_blocking_client(tmp_path):
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(AUTH_FILE)
    cert, context = server_certificate(tmp_path)
    server = HQueueServer(
        f"local://{tmp_path}/data", port=0, auth=AuthPolicy.load(auth_file), ssl_context=context
    ).start()
    url = f"hqueue://{server.address}?tls=1&ca={cert}"
    try:

        async def main():
            async with AsyncHQueueAdmin(url, token=ADMIN) as admin:
                await admin.create_queue("crawl.pages", 2)
            async with AsyncHQueue("crawl.pages", url, token=CRAWLER) as queue:
                await queue.put(Message("t", b"over tls"))
                assert [m.value async for m in queue.scan()] == [b"over tls"]
                async with queue.consumer("crawler-1") as consumer:
                    got = await consumer.receive(wait=2)
                    assert await consumer.ack(got) == 1
            with pytest.raises(NotAuthorized):
                async with AsyncHQueue("crawl.pages", url, token="wrong-token-0123456789") as queue:
                    await queue.put(Message("t", b"x"))

        asyncio.run(main())
    finally:
        server.stop()


@pytest.fixture
def probes(monkeypatch):
    """The TLS probes the asyncio client makes: (host, port, thread name) of each."""
    from hqueue.aio.client import engine

    made: list[tuple[str, int, str]] = []
    real = engine.speaks_tls

    def recorded(host: str, port: int, seconds: float) -> bool:
        made.append((host, port, threading.current_thread().name))
        return real(host, port, seconds)

    monkeypatch.setattr(engine, "speaks_tls", recorded)
    return made


def test_a_plain_client_is_told_a_tls_server_speaks_tls_without_blocking_its_loop(tmp_path, probes):
    _, context = server_certificate(tmp_path)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, ssl_context=context).start()
    try:

        async def main():
            loop_thread = threading.current_thread().name
            async with AsyncHQueueAdmin(f"hqueue://{server.address}?timeout=5") as admin:
                with pytest.raises(ServerUnavailable, match=r"the server speaks TLS: connect with hqueue://…\?tls=1"):
                    await admin.list_queues()
            return loop_thread

        loop_thread = asyncio.run(main())
        # The handshake that asks blocks: it ran on a thread, never on the event loop's.
        assert probes and all(thread != loop_thread for *_, thread in probes), (loop_thread, probes)
    finally:
        server.stop()


def test_calls_ended_by_closing_the_client_probe_no_server(probes):
    """A call that fails because its own client closed says nothing of the server: no
    handshake is sent to it (a healthy server logged each as a bad frame)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        address = f"127.0.0.1:{listening.getsockname()[1]}"

        async def main():
            admin = AsyncHQueueAdmin(f"hqueue://{address}?timeout=5")
            calls = [asyncio.ensure_future(admin.list_queues()) for _ in range(4)]
            await asyncio.sleep(0.3)  # connected and sent; the server reads, and never answers
            await admin.close()
            return await asyncio.gather(*calls, return_exceptions=True)

        outcomes = asyncio.run(main())
    assert all(isinstance(o, Exception) for o in outcomes), outcomes
    assert probes == []


def test_an_awaited_scan_goes_on_through_a_server_restart(server_process):
    url = f"hqueue://{server_process.address}"

    async def main():
        async with AsyncHQueue("q", url) as queue:
            put = [(p, i) for p in (0, 1) for i in await queue.put([Message("t", b"x")] * 50, partition_id=p)]
            # Given a scan of both partitions, part read
            scanner = queue.scan(caching=7)
            first = [await scanner.__anext__() for _ in range(20)]
            # When the server is killed and comes back on its port
            await asyncio.to_thread(server_process.kill)
            await asyncio.to_thread(server_process.start)
            rest = [m async for m in scanner]
        return put, first + rest

    put, read = asyncio.run(main())
    # Then the scan went on from where each partition was: every message once, in ID order
    pairs = [(m.partition_id, m.id) for m in read]
    assert len(pairs) == len(put) and set(pairs) == set(put)
    assert [i for _, i in pairs] == sorted(i for _, i in pairs)


def test_an_awaited_scan_reopened_after_a_restart_on_a_queue_made_again_says_so(server_process, tmp_path):
    """As the blocking scan's (test_server.py): none of the new queue's messages."""
    from .test_server import remade_while_down

    async def main() -> tuple[list, set]:
        async with AsyncHQueue("q", f"hqueue://{server_process.address}") as queue:
            await queue.put([Message("t", b"old")] * 50, partition_id=0)
            scanner = queue.scan(partition_id=0, caching=7)
            read = [await scanner.__anext__() for _ in range(3)]
            new = await asyncio.to_thread(remade_while_down, server_process, f"{tmp_path}/data")
            with pytest.raises(QueueNotFound, match="deleted and created again"):
                read += [m async for m in scanner]
        return read, new

    read, new = asyncio.run(main())
    assert {m.value for m in read} == {b"old"} and not {(m.partition_id, m.id) for m in read} & new


def test_a_cancelled_call_of_a_member_leaves_its_other_leases_alone(tmp_path):
    """A call cancelled while at the server closed its connection, and the server then
    ended every lease of the member tied to it: another member got them (attempt 2) while
    the first still worked within its 60 s lease (an acceptance probe: 17-28 of 300
    messages done twice in a cancellation storm). Its answer is read in the background now."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"

    async def main() -> tuple[list, list, int]:
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 1)
        async with AsyncHQueue("q", url) as queue:
            first = queue.consumer("g", member="A", lease=60)
            await queue.put([Message("t", b"%d" % n) for n in range(10)], partition_id=0)
            held = await first.receive(5, wait=2)
            for n in range(40):  # cancelled at each of its first waits: before sending, and for the answer
                call = asyncio.ensure_future(first.extend(held))
                for _ in range(n % 4):
                    await asyncio.sleep(0)
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
            await asyncio.sleep(0.3)
            pending = [(p.member, p.attempt) for p in await queue.pending("g")]
            second = queue.consumer("g", member="B", lease=60)
            others = [d.value for d in await second.receive(10, wait=1)]
            acked = await first.ack(held)
            await second.ack(await second.receive(10, wait=0) or [])
            await first.close()
            await second.close()
            return pending, others, acked

    try:
        pending, others, acked = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.stop()
    assert sorted(pending) == [("A", 1)] * 5  # still A's, first attempt
    assert sorted(others) == [b"5", b"6", b"7", b"8", b"9"]  # B gets only the rest
    assert acked == 5


def test_cancelled_scans_leave_no_connection_behind(tmp_path):
    """A scan cancelled while its partitions' cursors opened kept the cursors that had opened
    (and their connections) for as long as the handle lived: one connection a scan, about
    (an acceptance probe: 100 cancelled scans, 97 more connections)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 8)

        async def main() -> tuple[int, int]:
            async with AsyncHQueue("q", f"hqueue://{server.address}") as queue:
                for pid in range(8):
                    await queue.put([Message("t", b"x" * 100) for _ in range(2000)], partition_id=pid)
                engine = await queue.async_engine()
                for round in range(80):

                    async def scan() -> None:
                        async for _ in queue.scan():
                            await asyncio.sleep(0.0005)

                    task = asyncio.ensure_future(scan())
                    for _ in range(round % 8):  # cancelled at every step of opening and reading
                        await asyncio.sleep(0)
                    await asyncio.sleep(0.001 * (round % 3))
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await asyncio.sleep(0.5)
                count = len([m async for m in queue.scan()])
                return engine.connections, count

        connections, count = asyncio.run(main())
        assert count == 16_000
        assert connections <= 16  # the scans' 8 (kept idle for reuse), and a few calls'
    finally:
        server.stop()


def test_a_burst_of_awaited_calls_shares_a_bounded_number_of_connections(tmp_path):
    """A gather of 2,000 puts opened 2,000 connections and kept them all, idle, for the
    handle's life: the process then could not open a file, and a server sharing its limit
    failed to accept (an acceptance probe)."""
    from hqueue.aio.client.transport import MAX_CALLS, MAX_IDLE

    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 4)

        async def main() -> tuple[int, int, int]:
            async with AsyncHQueue("q", f"hqueue://{server.address}") as queue:
                engine = await queue.async_engine()
                most = 0

                async def put(i: int) -> None:
                    nonlocal most
                    await queue.put(Message("t", b"%d" % i), partition_id=i % 4)
                    most = max(most, engine.connections)

                await asyncio.gather(*[put(i) for i in range(2000)])
                count = len([m async for m in queue.scan()])
                return most, engine.connections, count

        most, after, count = asyncio.run(main())
        assert count == 2000
        assert most <= MAX_CALLS + 2 and after <= MAX_IDLE
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["server", "embedded"])
def test_receives_timed_out_in_a_loop_spend_no_retry_on_messages_nobody_saw(tmp_path, where):
    """``await asyncio.wait_for(consumer.receive(wait=5), 0.2)`` in a loop: each cancelled
    long poll took the new messages and handed them back as a nack, which counted an
    attempt; with max_retries=0 every message went to the dead-letter queue and the
    application saw none (an acceptance probe)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start() if where == "server" else None
    url = f"hqueue://{server.address}" if server else f"local://{tmp_path}/embedded"

    async def main() -> tuple[list[int], dict]:
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("w", 1)
        attempts: list[int] = []
        async with AsyncHQueue("w", url) as queue, queue.consumer("g", max_retries=0) as consumer:

            async def poll() -> None:
                while len(attempts) < 20:
                    try:
                        got = await asyncio.wait_for(consumer.receive(10, wait=5), 0.2)
                    except TimeoutError:
                        continue
                    attempts.extend(d.attempt for d in got)
                    await consumer.ack(got)

            polling = asyncio.ensure_future(poll())
            await asyncio.sleep(0.5)
            await queue.put([Message("t", b"job-%d" % n) for n in range(20)], partition_id=0)
            await asyncio.wait_for(polling, 60)
        async with AsyncHQueueAdmin(url) as admin:
            described = await admin.describe_group("w", "g")
        return attempts, described["partitions"][0]

    try:
        attempts, partition = asyncio.run(main())
        assert sorted(attempts) == [1] * 20
        assert partition["dead_lettered"] == 0
    finally:
        if server is not None:
            server.stop()


def test_calls_waiting_for_a_connection_are_served_in_turn(tmp_path):
    """With more tasks calling in a loop than connections lent for calls, a task that gave
    one back took it again at once: the same waiters waited until their deadline, again
    and again (72 of 200 tasks, DeadlineExceeded; a review)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 4, durability="ASYNC_WAL")

        async def main() -> tuple[int, list[str]]:
            done, failed = 0, []
            async with AsyncHQueue("q", f"hqueue://{server.address}?timeout=2") as queue:
                until = asyncio.get_running_loop().time() + 4

                async def putter(i: int) -> None:
                    nonlocal done
                    while asyncio.get_running_loop().time() < until:
                        try:
                            await queue.put(Message("t", b"%d" % i), partition_id=i % 4)
                            done += 1
                        except DeadlineExceeded as e:
                            failed.append(str(e))

                await asyncio.gather(*[putter(i) for i in range(200)])
            return done, failed

        done, failed = asyncio.run(main())
        assert done > 200 and failed == []
    finally:
        server.stop()


def test_a_member_closed_right_after_its_receive_is_cancelled_is_out_of_the_group(tmp_path):
    """docs/asyncio.md's cancellation example printed [] on hqueue:// (an acceptance probe):
    close() right after task.cancel() left the group while the cancelled receive's long
    poll went on at the server, which counted the member in again for 10 s, so the
    other member got half the partitions' messages only then."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"

    async def main() -> tuple[list[str], list[int]]:
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 4)
        async with AsyncHQueue("q", url) as queue:
            async with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
                await b.receive(wait=0)
                waiting = asyncio.ensure_future(a.receive(wait=20))
                await asyncio.sleep(0.2)  # its long poll is at the server
                waiting.cancel()
                await a.close()
                async with AsyncHQueueAdmin(url) as admin:
                    members = (await admin.describe_group("q", "g"))["members"]
                for partition in range(4):
                    await queue.put(Message("t", b"%d" % partition), partition)
                got = await b.receive(10, wait=5)
                return members, sorted(d.partition_id for d in got)

    try:
        members, partitions = asyncio.run(asyncio.wait_for(main(), 60))
        assert members == ["b"]
        assert partitions == [0, 1, 2, 3]  # all of them, to the one member left, in one receive
    finally:
        server.stop()


@pytest.mark.parametrize("cancelled_too", [False, True], ids=["by close", "by its caller too"])
def test_a_receive_ended_by_close_from_another_task_returns_nothing(tmp_path, cancelled_too):
    """A long poll went on after its consumer's close, as long as its wait. close() ends it by
    cancelling its task, which then returns []: one its own caller cancelled too stays cancelled."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"

    async def main() -> list | str:
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 2)
        async with AsyncHQueue("q", url) as queue:
            consumer = queue.consumer("g")
            await consumer.open()
            receiving = asyncio.ensure_future(consumer.receive(wait=120))  # ended by the close, not by its wait
            await asyncio.sleep(0.2)
            if cancelled_too:
                receiving.cancel()
            await consumer.close()
            try:
                return await receiving
            except asyncio.CancelledError:
                return "cancelled"

    try:
        assert asyncio.run(asyncio.wait_for(main(), 60)) == ("cancelled" if cancelled_too else [])
    finally:
        server.stop()


def test_a_put_after_its_server_was_killed_is_known_not_sent(tmp_path):
    """The pooled connection's end was not seen yet (no turn of the loop since the kill): the
    put was written to it and counted as maybe sent, OutcomeUnknown, whose text ended in
    "not sent". The blocking client checks the socket before reusing it, and so does this one."""
    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{proc.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)

        async def main() -> BaseException:
            async with AsyncHQueue("q", url, timeout=2) as queue:
                await queue.put(Message("t", b"warm"))
                proc.kill()  # (blocking: no turn of the loop between the kill and the put)
                try:
                    await queue.put(Message("t", b"x"))
                except Exception as e:
                    return e
            raise AssertionError("a put to a killed server succeeded")

        error = asyncio.run(main())
        assert isinstance(error, DeadlineExceeded), error
        assert "not sent" in str(error)
    finally:
        proc.kill()


def _listing_answer(*names: str, seqid: int = 1) -> bytes:
    """A whole listQueues answer frame to call number ``seqid``, as a server writes it."""
    out = TMemoryBuffer()
    protocol = TBinaryProtocol(out)
    protocol.write_message_begin("listQueues", TMessageType.REPLY, seqid)
    infos = [wire.T.TQueueInfo(name=name, partitions=1, config={}) for name in names]
    wire.T.HQueueService.listQueues_result(success=infos).write(protocol)
    protocol.write_message_end()
    payload = out.getvalue()
    return struct.pack("!i", len(payload)) + payload


@contextlib.contextmanager
def _scripted_server(answer: Callable[[int, int], bytes]):
    """A peer that reads each request frame and writes ``answer(n, seqid)`` (n: the requests
    it read, all connections counted; seqid: the request's call number): an attacker's
    server, or a broken one."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests = itertools.count()

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as incoming:
            while head := incoming.read(4):
                request = TBinaryProtocol(TMemoryBuffer(incoming.read(struct.unpack("!i", head)[0])))
                conn.sendall(answer(next(requests), request.read_message_begin()[2]))

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize("stray", [_listing_answer("stray", seqid=2), b"\x01"], ids=["a frame", "a byte"])
def test_an_answer_nobody_asked_for_is_never_taken_for_the_next_call_s(stray):
    """thriftpy2 does not match an answer to its call (no sequence number check): a frame
    sent after an answer, kept on the pooled connection, would be the next call's answer
    (a byte, the start of its head). It ends the connection instead; the next call goes on
    a new one."""

    def answer(n: int, seqid: int) -> bytes:
        return _listing_answer("a", seqid=seqid) + (stray if n == 0 else b"")

    async def main() -> list[list[str]]:
        async with AsyncHQueueAdmin(f"hqueue://{address}?timeout={TIMEOUT}") as admin:
            return [[info.name for info in await admin.list_queues()] for _ in range(3)]

    with _scripted_server(answer) as address:
        assert asyncio.run(main()) == [["a"], ["a"], ["a"]]


@pytest.mark.parametrize("client", ["asyncio", "blocking"])
def test_an_answer_to_another_call_is_never_taken_for_this_one_s(client):
    """An answer that comes when one is owed but names another call (its number, or its
    method) ends the connection instead of being read as this call's: a stray answer that
    came late, once the next call was sent. (listQueues may go again: the retry takes a
    new connection, whose answer is right.)"""

    def answer(n: int, seqid: int) -> bytes:
        return _listing_answer("stale", seqid=seqid + 7) if n == 0 else _listing_answer("a", seqid=seqid)

    async def main() -> list[str]:
        async with AsyncHQueueAdmin(f"hqueue://{address}?timeout={TIMEOUT}") as admin:
            return [info.name for info in await admin.list_queues()]

    with _scripted_server(answer) as address:
        if client == "asyncio":
            listed = asyncio.run(asyncio.wait_for(main(), 30))
        else:
            with HQueueAdmin(f"hqueue://{address}?timeout={TIMEOUT}") as admin:
                listed = [info.name for info in admin.list_queues()]
        assert listed == ["a"]


@pytest.mark.parametrize("client", ["asyncio", "blocking"])
@pytest.mark.parametrize("size", [0x7FFFFFFF, wire.MAX_ANSWER_BYTES + 1, 0])
def test_an_answer_frame_out_of_bounds_ends_its_connection_before_it_is_read(size, client):
    """A head announcing 2 GiB (or 0 bytes) is refused when read: nothing of it is buffered
    (thriftpy2's framed transport would allocate what the head says before reading it)."""

    async def main() -> BaseException:
        async with AsyncHQueueAdmin(f"hqueue://{address}?timeout={TIMEOUT}") as admin:
            with pytest.raises(ServerUnavailable) as caught:
                await admin.list_queues()
            return caught.value

    with _scripted_server(lambda n, seqid: struct.pack("!i", size) + b"x" * 64) as address:
        if client == "asyncio":
            error = asyncio.run(asyncio.wait_for(main(), 30))
        else:
            with HQueueAdmin(f"hqueue://{address}?timeout={TIMEOUT}") as admin:
                tracemalloc.start()
                with pytest.raises(ServerUnavailable) as caught:
                    admin.list_queues()
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            error = caught.value
            assert peak < 16 * 1024 * 1024
    assert f"an answer frame of {size} bytes" in str(error)


def test_answer_frames_cut_anywhere_are_read_whole_by_the_blocking_client():
    """The blocking client's check of each answer's head follows frames however the
    socket's reads cut them: a head in two reads, two answers in one read, a body split."""
    from hqueue.rpc.bounded import Bounded

    class Source:
        chunks: list[bytes]

        def read(self, sz: int) -> bytes:
            return self.chunks.pop(0)

    class Stream(Bounded, Source):
        sock = object()  # (open)

        def _arm(self, reading: bool) -> None:
            pass

    answers = _listing_answer("a", seqid=1) + _listing_answer("b", seqid=2)
    for cuts in ([1, 2, 3], [5], [4, 40], [len(answers) - 1], [2, len(answers) - 3], [len(answers) + 2]):
        frames = answers + struct.pack("!i", 0)
        edges = [0, *itertools.accumulate(cuts), len(frames)]
        stream = Stream()
        stream.chunks = [frames[a:b] for a, b in itertools.pairwise(edges) if b > a]
        read = b""
        with pytest.raises(TTransportException, match="an answer frame of 0 bytes"):
            while stream.chunks:
                read += stream.read(1 << 16)
        assert not stream.chunks and frames.startswith(read), cuts  # refused on the zero head, not before


def test_answers_not_taken_past_their_bound_leave_the_socket_unread():
    """Answers pipelined ahead of a reader that does not take them stay in the kernel and
    the server (reading stops), not in this process: at most HELD_BYTES and one answer."""
    from hqueue.aio.client.frames import HELD_BYTES, Frames

    class Transport(asyncio.Transport):
        reading = True

        def pause_reading(self) -> None:
            self.reading = False

        def resume_reading(self) -> None:
            self.reading = True

    async def main() -> None:
        frames, transport = Frames(), Transport()
        frames.connection_made(transport)
        body = struct.pack("!Ii", 0x80010002, 16) + b"scannerGetPacked" + struct.pack("!i", 0)
        body += b"\x0b\x00\x00" + struct.pack("!i", 1024 * 1024) + b"x" * (1024 * 1024) + b"\x00"
        answer = struct.pack("!i", len(body)) + body  # (a well-formed answer: malformed ones end the connection)
        for number in range(8):
            frames.sent("scannerGetPacked", number)
        for _ in range(8):
            frames.data_received(answer)
            if not transport.reading:
                break
        assert not transport.reading and HELD_BYTES < frames._held <= HELD_BYTES + len(answer)
        await frames.answer()
        assert transport.reading  # taken: read again

    asyncio.run(main())


def test_call_numbers_wrap_within_an_i32_on_a_long_lived_connection(tmp_path):
    """Calls are numbered per connection, and the number is an i32 on the wire: at 100,000
    calls a second a pooled connection reaches 2**31 in 6 hours, where writing it failed."""
    from hqueue.aio.client.transport import AsyncPool
    from hqueue.client.pool import NumberedProtocol

    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:

        async def main() -> list[int]:
            pool = AsyncPool(server.address, None, None)
            connection = await pool.take()
            try:
                connection._seqids = itertools.count(2**31 - 2)
                return [len(await connection.call("listQueues")) for _ in range(4)]
            finally:
                pool.give_back(connection)
                pool.close()

        assert asyncio.run(main()) == [0, 0, 0, 0]
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.list_queues()
            connection = admin.engine._pools[server.address]._idle.get_nowait()
            protocol = connection.client._iprot
            assert isinstance(protocol, NumberedProtocol)
            protocol._numbers = itertools.count(2**31 - 2)
            assert [len(connection.client.listQueues()) for _ in range(4)] == [0, 0, 0, 0]
    finally:
        server.stop()


@pytest.fixture
def served(tmp_path):
    """An in-process server on an embedded store: (the server, its URL, a function making a queue)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"

    def queue(partitions: int) -> None:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", partitions)

    try:
        yield server, url, queue
    finally:
        server.stop()


def test_a_scan_left_by_break_lets_its_connections_go_without_the_garbage_collector(served):
    """The scanner and its generator held each other: each scan left by ``break`` kept its
    cursors' connections and server-side scanners until a collection (44 connections
    after 300 such scans over 4 partitions, an attacker's pass)."""
    import gc

    server, url, make_queue = served
    make_queue(4)

    async def main() -> int:
        async with AsyncHQueue("q", url) as queue:
            for p in range(4):
                await queue.put([Message("t", b"%d" % i) for i in range(50)], partition_id=p)
            gc.disable()
            try:
                for _ in range(60):
                    async for _message in queue.scan(caching=7):
                        break
                await asyncio.sleep(0.2)  # the generators' ends (scheduled by the loop) run
                return client_sockets(url)
            finally:
                gc.enable()

    assert asyncio.run(main()) <= 4  # a scan's four cursors at most, not one set per scan
    # The blocking client's scans held their cursors the same way
    with HQueue("q", url) as queue:
        gc.disable()
        try:
            for _ in range(60):
                for _message in queue.get_queue_scanner(caching=7):
                    break
            assert len(server.scanners) <= 4  # a scan's four at most, closed as it is let go
        finally:
            gc.enable()


def test_cancelled_long_polls_cost_one_call_under_way_not_one_each(served):
    """``wait_for(receive(wait=30), 0.01)`` in a loop left each cancelled long poll holding a
    connection for its wait: past 128 the handle had none left (puts, receives and the
    consumer's close all failed "not sent" for 30 s). The member's next receive now waits
    for the poll already under way, and gets what it is handed."""
    _, url, make_queue = served
    make_queue(1)

    async def main() -> None:
        async with AsyncHQueue("q", url + "?timeout=3") as queue:
            async with queue.consumer("g") as consumer:
                for _ in range(150):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(consumer.receive(wait=30), 0.01)
                assert queue.connections <= 3  # (the poll under way, and one or two to spare)
                ids = await queue.put(Message("t", b"x"))
                got = await consumer.receive(wait=5)
                assert [d.message.id for d in got] == ids and got[0].attempt == 1
                assert await consumer.ack(got) == 1

    asyncio.run(main())


def test_a_receive_takes_a_cancelled_ones_poll_only_with_the_same_lease(served):
    """The member's next receive took what the cancelled one's poll was handed with that
    poll's lease (1 s where 60 were asked): another member got the message 1 s later,
    while the first still worked on it (a review of the change)."""
    _, url, make_queue = served
    make_queue(1)

    async def main() -> None:
        async with AsyncHQueue("q", url) as queue:
            async with queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(a.receive(wait=20, lease=1), 0.05)
                ids = await queue.put(Message("t", b"x"))
                got = await a.receive(wait=5, lease=60)
                assert [d.message.id for d in got] == ids
                await asyncio.sleep(2.5)  # past the cancelled receive's lease
                assert await b.receive(wait=0) == []  # a still holds it, for its 60 s
                assert await a.ack(got) == 1

    asyncio.run(main())


@pytest.mark.parametrize("client", ["asyncio", "blocking"])
def test_a_partition_the_queue_does_not_have_is_refused_at_once_as_in_process(served, client):
    """A timer handle or a receipt naming a partition past the queue's waited for its
    owner until the call's deadline (30 s), then blamed the servers (OutcomeUnknown for
    the asyncio cancel): it is the caller's error, as in process."""
    from hqueue import InvalidArgument, InvalidPartition, MessageID

    _, url, make = served
    make(4)
    stray = Message("t", b"x", id=MessageID(1, 0), partition_id=4)
    calls = {
        "cancel": (InvalidPartition, "must be in 0..3"),
        "ack": (InvalidArgument, "a receipt names partition 4; queue 'q' has 4"),
        "nack": (InvalidArgument, "a receipt names partition 4"),
        "extend": (InvalidArgument, "a receipt names partition 4"),
        "dead_letter": (InvalidArgument, "a receipt names partition 4"),
    }

    async def in_asyncio() -> dict[str, BaseException]:
        errors: dict[str, BaseException] = {}
        async with AsyncHQueue("q", url, timeout=20) as queue, queue.consumer("g") as member:
            for name in calls:
                with pytest.raises(Exception) as caught:
                    if name == "cancel":
                        await queue.cancel("4/1/2:0")
                    else:
                        await getattr(member, name)([stray])
                errors[name] = caught.value
        return errors

    started = time.monotonic()
    if client == "asyncio":
        errors = asyncio.run(in_asyncio())
    else:
        errors = {}
        with HQueue("q", url, timeout=20) as queue, queue.consumer("g") as member:
            for name in calls:
                with pytest.raises(Exception) as caught:
                    queue.cancel("4/1/2:0") if name == "cancel" else getattr(member, name)([stray])
                errors[name] = caught.value
    for name, (kind, text) in calls.items():
        assert isinstance(errors[name], kind) and text in str(errors[name]), (name, errors[name])
    assert time.monotonic() - started < 10  # (not a deadline's wait each)


@pytest.mark.parametrize("client", ["asyncio", "blocking"])
def test_a_name_the_wire_cannot_carry_is_the_callers_error_not_the_stores(served, client):
    """A name that is not UTF-8 text (a surrogate from os.fsdecode) was a StorageError
    naming thriftpy2's TDecodeException; in process a group's was a UnicodeEncodeError."""
    from hqueue import InvalidArgument

    _, url, make = served
    make(1)
    bad = b"g\xff".decode("utf-8", "surrogateescape")

    async def in_asyncio() -> list[BaseException]:
        errors = []
        async with AsyncHQueueAdmin(url) as admin:
            for call in (lambda: admin.describe_queue(bad), lambda: admin.describe_group("q", bad)):
                with pytest.raises(InvalidArgument) as caught:
                    await call()
                errors.append(caught.value)
        return errors

    if client == "asyncio":
        errors = asyncio.run(in_asyncio())
    else:
        errors = []
        with HQueueAdmin(url) as admin:
            for call in (lambda: admin.describe_queue(bad), lambda: admin.describe_group("q", bad)):
                with pytest.raises(InvalidArgument) as caught:
                    call()
                errors.append(caught.value)
            assert [info.name for info in admin.list_queues()] == ["q"]  # the connection goes on
    assert all("valid UTF-8" in str(e) for e in errors), errors
    with HQueueAdmin(f"local://{served[0].engine.storage.path}-alone") as admin:  # in process too
        admin.create_queue("q", 1)
        with pytest.raises(InvalidArgument, match="group name"):
            admin.describe_group("q", bad)


def test_closing_a_queue_whose_server_does_not_answer_ends_its_consumers_within_a_second(tmp_path):
    """A queue's close makes its open consumers leave (their messages back, no failure
    counted); a server that does not answer (SIGSTOP) holds that for LEAVE_AT_CLOSE, not the
    calls' 30 s timeout, in both APIs."""

    from hqueue.queue import LEAVE_AT_CLOSE

    proc = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{proc.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        queue = HQueue("q", url)
        queue.put([Message("t", b"a"), Message("t", b"b")], partition_id=0)
        blocking = queue.consumer("g")
        assert len(blocking.receive(1, wait=2)) == 1

        async def aio_member() -> tuple[object, AsyncHQueue]:
            handle = await AsyncHQueue("q", url).open()
            member = handle.consumer("g")
            assert len(await member.receive(1, wait=2)) == 1
            return member, handle

        async def close_it(handle: AsyncHQueue) -> float:
            started = time.monotonic()
            await handle.close()
            return time.monotonic() - started

        async def main() -> tuple[float, float]:
            member, handle = await aio_member()
            assert proc.proc is not None
            proc.pause()
            try:
                started = time.monotonic()
                await asyncio.to_thread(queue.close)
                blocking_took = time.monotonic() - started
                return blocking_took, await close_it(handle)
            finally:
                proc.resume()

        blocking_took, aio_took = asyncio.run(main())
        assert blocking_took < LEAVE_AT_CLOSE + 2 and aio_took < LEAVE_AT_CLOSE + 2, (blocking_took, aio_took)
    finally:
        proc.kill()


def test_an_app_ending_its_loop_with_a_consumer_long_polling_leaves_no_task_to_warn_of(served):
    """An application returning from asyncio.run without closing its queue, a consumer's
    receive waiting at the server: the task that reads the cancelled poll's late answer
    was destroyed pending, and Python said so ("Task was destroyed but it is pending!";
    an attacker's pass). The connection ends with the loop, and the leases with it."""
    import subprocess
    import sys

    from ..processes import python_env

    server, url, queue = served
    queue(4)
    app = (
        "import asyncio\nfrom hqueue.aio import AsyncHQueue\n"
        "async def main():\n"
        f"    queue = AsyncHQueue('q', {url!r})\n"
        "    consumer = queue.consumer('g')\n"
        "    await consumer.receive(wait=0)\n"
        "    asyncio.ensure_future(consumer.receive(wait=3))\n"
        "    await asyncio.sleep(0.3)\n"
        "asyncio.run(main())\nprint('ended', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", app], env=python_env(), capture_output=True, text=True, timeout=60
    )
    assert "ended" in done.stdout, done.stderr
    assert "destroyed but it is pending" not in done.stderr, done.stderr
