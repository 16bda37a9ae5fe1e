"""Answers a client or a server reads from a peer it does not trust: a hostile (or broken)
server's to a client, a subscriber's to the server that pushes to it. Each is walked before
thriftpy2 decodes it (rpc/frames.py ``check_answer``), and what it carries is checked."""

from __future__ import annotations

import asyncio
import struct

import pytest

from hqueue import HQueue, HQueueAdmin, Message, MessageID, MessageListener, ServerUnavailable, Subscription
from hqueue.rpc.frames import FrameError, check_answer
from hqueue.server import HQueueServer

from ..processes import wait_for
from .test_aio_remote import _scripted_server


def hostile_answer(seqid: int) -> bytes:
    """A reply to call ``seqid``: a field holding a list of 2**31-1 elements that take no
    bytes (thriftpy2's decoder looped over them for seconds, the GIL held), then an empty one."""
    reply = struct.pack(">Ii", 0x80010002, 10) + b"listQueues" + struct.pack(">i", seqid)
    reply += b"\x0f" + struct.pack(">h", 100) + struct.pack(">bi", 1, 2**31 - 1)
    reply += b"\x0f" + struct.pack(">h", 0) + struct.pack(">bi", 12, 0) + b"\x00"
    return struct.pack(">I", len(reply)) + reply


def test_an_answer_larger_than_its_frame_is_refused_before_decoding_by_every_client():
    """A 46-byte answer froze a client process for 3 s a field (13 s with 4, past a 2 s
    timeout; an attacker's pass): answers are walked as calls are, before thriftpy2 decodes them."""
    from hqueue.aio import AsyncHQueueAdmin

    with pytest.raises(FrameError, match="declares 2147483647 elements"):
        check_answer(hostile_answer(1)[4:])
    with _scripted_server(lambda n, seqid: hostile_answer(seqid)) as address:
        with HQueueAdmin(f"hqueue://{address}", timeout=5) as admin:
            with pytest.raises(ServerUnavailable, match="a malformed answer"):
                admin.list_queues()

        async def listed() -> None:
            async with AsyncHQueueAdmin(f"hqueue://{address}", timeout=5) as admin:
                await admin.list_queues()

        with pytest.raises(ServerUnavailable, match="a malformed answer"):
            asyncio.run(listed())


class Collect(MessageListener):
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def on_messages(self, messages) -> None:
        self.values += [m.value for m in messages]


def test_a_subscriber_answering_with_a_hostile_frame_holds_no_push_thread(tmp_path):
    """A subscriber's 46-byte answer to the server's challenge held a push thread for 3 s a
    field, and the whole server with it (the GIL): with 2 push threads and 2 such subscribers, a
    good one got nothing (an attacker's pass)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, push_threads=2).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 2)
        with _scripted_server(lambda n, seqid: hostile_answer(seqid)) as hostile, HQueue("q", url) as queue:
            hostiles = [queue.create_subscriber(Subscription(f"h{i}"), [Collect()], advertise=hostile) for i in (0, 1)]
            good = Collect()
            with hostiles[0], hostiles[1], queue.create_subscriber(Subscription("good"), [good]):
                for i in range(5):
                    queue.put(Message("t", b"%d" % i), partition_id=i % 2)
                wait_for(lambda: len(good.values) == 5, 10, "the good subscriber's messages")
    finally:
        server.stop()


def test_a_scan_or_receive_answer_that_is_not_messages_is_the_servers_fault_not_a_crash(server, monkeypatch):
    """A broken or hostile server's answer of cell keys shorter than a rowkey gave the scan a raw
    struct.error; a receive's of more messages than attempts a ValueError, of a bad blob the
    caller's InvalidArgument (an attacker's pass): ServerUnavailable, as a scan's bad blob was."""
    with HQueue("q", f"hqueue://{server.address}") as queue:
        queue.put(Message("t", b"x"), partition_id=0)
        monkeypatch.setattr(server.handler.queues.scanners, "take", lambda *args, **kwargs: ([b"abc"], [b"value"]))
        with pytest.raises(ServerUnavailable, match="a cell key of 3 bytes"):
            list(queue.scan())
        key = b"\x00\x00" + MessageID(1_700_000_000_000, 1).to_bytes() + b"t"
        for columns, error in [
            (([key, key], [b"a", b"b"], [1]), "2 messages with 1 attempts"),
            (([b"k"], [b"a"], [1]), "a cell key of 1 bytes"),
        ]:
            monkeypatch.setattr(server.groups, "receive_columns", lambda *args, c=columns, **kwargs: c)
            with queue.consumer("g") as consumer:
                with pytest.raises(ServerUnavailable, match=error):
                    consumer.receive(10, wait=0.5)
        monkeypatch.undo()
        # And a lease under a millisecond, which the client takes, is one of 1 ms at a server
        # (it sent 0, refused as "0.0" seconds, a value the caller never gave)
        with queue.consumer("g2") as consumer:
            received = consumer.receive(10, wait=1, lease=0.0004)
            assert [d.value for d in received] == [b"x"]
