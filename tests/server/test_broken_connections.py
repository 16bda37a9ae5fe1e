"""A connection that breaks mid-call: reads go again, changes do not.

A server that is killed breaks its connections one after another while it
exits, and a client that reconnects at once may reach its listening socket
before that closes too (the shared embedded store's takeover saw two
resets in a row). A relay on loopback (tests/helpers/relay.py) stands for
it: it resets the first connections after reading their request, then
relays to a real server.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.aio import AsyncHQueueAdmin
from hqueue.client.engine import READ_TRIES
from hqueue.errors import ServerUnavailable
from hqueue.rpc.wire import call_frame
from hqueue.server import HQueueServer

from ..helpers.relay import Relay
from ..processes import server_certificate


def test_a_read_whose_connection_breaks_again_and_again_is_sent_again_until_it_is_answered(server):
    # Given a server whose connections break mid-call several times in a row
    front = Relay(("127.0.0.1", server.port), breaks=READ_TRIES - 1)
    try:
        with HQueueAdmin(f"hqueue://{front.address}?timeout=10") as admin:
            # When a client reads through it
            names = [info.name for info in admin.list_queues()]
        # Then the read went again on a new connection each time, and was answered
        assert names == ["q"]
        assert front.broken == READ_TRIES - 1
    finally:
        front.close()


def test_a_call_that_may_go_twice_goes_again_when_its_connection_breaks(server):
    # Given a server whose connections break mid-call several times in a row
    front = Relay(("127.0.0.1", server.port), breaks=READ_TRIES - 1, on=b"openGroup")
    try:
        with HQueue("q", f"hqueue://{front.address}?timeout=10") as queue:
            # When a consumer-group member opens its group through it (a group opened twice is opened once)
            with queue.consumer("g") as consumer:
                # Then the open went again each time, and the group is there
                assert front.broken == READ_TRIES - 1
                assert consumer.receive(1, wait=0) == []
    finally:
        front.close()


def test_a_change_whose_connection_breaks_is_not_sent_again(server):
    # Given a server whose connection breaks once the request came
    front = Relay(("127.0.0.1", server.port), breaks=1)
    try:
        with HQueueAdmin(f"hqueue://{front.address}?timeout=10") as admin:
            # When a client changes something through it
            with pytest.raises(ServerUnavailable) as raised:
                admin.create_queue("made-once", 1)
        # Then it is told the change may have been made, and it was sent once
        assert raised.value.maybe_sent
        assert front.broken == 1
    finally:
        front.close()


@pytest.mark.parametrize("io", ["loop", "threads", "tls"])
def test_a_receive_whose_client_closed_while_it_waited_leases_nothing(tmp_path, io):
    # Given a member's receive waiting for messages, whose client then closes its connection
    # (over TLS too: its server could not tell, and leased the batch to nobody there)
    tls = server_certificate(tmp_path) if io == "tls" else None
    options = {"ssl_context": tls[1]} if tls else {"io": io}
    server = HQueueServer(f"local://{tmp_path}/data", port=0, **options).start()
    url = f"hqueue://{server.address}" + (f"?tls=1&ca={tls[0]}" if tls else "")
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 2)
        with HQueue("q", url) as queue:
            with queue.consumer("g", member="first") as first:
                assert first.receive(1, wait=0) == []  # (the group is made)
            sock = socket.create_connection(("127.0.0.1", server.port))
            if tls:
                sock = ssl.create_default_context(cafile=str(tls[0])).wrap_socket(sock, server_hostname="127.0.0.1")
            sock.sendall(call_frame("groupReceive", 1, queue="q", group="g", member="gone", maxMessages=10,
                                    leaseMillis=60_000, waitMillis=3_000))  # fmt: skip
            time.sleep(0.3)
            sock.close()
            # When messages come while it still waits
            queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
            queue.put([Message("t", b"%d" % i) for i in range(5)], 1)
            time.sleep(0.5)
            # Then none went to the member that gave up: another gets them all, first time out
            assert queue.pending("g") == []
            got: list = []
            with queue.consumer("g", member="other") as other:  # (all partitions once "gone" is found gone)
                deadline = time.monotonic() + 10
                while len(got) < 10 and time.monotonic() < deadline:
                    got += other.receive(10, wait=1)
        assert len(got) == 10 and {d.attempt for d in got} == {1}
    finally:
        server.stop()


@pytest.mark.parametrize("front_end", ["blocking", "asyncio"])
def test_a_server_that_answered_in_plain_is_not_asked_if_it_speaks_tls_when_a_connection_breaks(
    server, monkeypatch, front_end
):
    """A plain client whose connection a server closed asked it, on a new connection, whether
    it speaks TLS (to say so if it did): each connection evicted from a server at its
    --max-connections cost it one more, logged as a bad frame. Not right after it answered
    in plain; again once it failed with no answer between (a server restarted with TLS)."""
    from hqueue.aio.client import engine as aio_engine
    from hqueue.rpc import failures

    probes: list = []
    asked = lambda host, port, seconds: probes.append(port) or False  # noqa: E731
    monkeypatch.setattr(failures, "speaks_tls", asked)
    monkeypatch.setattr(aio_engine, "speaks_tls", asked)
    front = Relay(("127.0.0.1", server.port), breaks=2, on=b"createQueue")
    url, broken = f"hqueue://{front.address}?timeout=10", "closed the connection|reset"
    probed: list[int] = []
    try:
        if front_end == "blocking":
            with HQueueAdmin(url) as admin:
                assert [info.name for info in admin.list_queues()] == ["q"]
                for _ in range(2):
                    with pytest.raises(ServerUnavailable, match=broken):
                        admin.create_queue("made-once", 1)
                    probed.append(len(probes))
        else:

            async def main() -> None:
                async with AsyncHQueueAdmin(url) as admin:
                    assert [info.name for info in await admin.list_queues()] == ["q"]
                    for _ in range(2):
                        with pytest.raises(ServerUnavailable, match=broken):
                            await admin.create_queue("made-once", 1)
                        probed.append(len(probes))

            asyncio.run(main())
    finally:
        front.close()
    # The failure right after an answer: no probe; the next, with no answer between: one
    assert probed == [0, 1]
