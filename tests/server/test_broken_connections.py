"""A connection that breaks mid-call: reads go again, changes do not.

A server that is killed breaks its connections one after another while it
exits, and a client that reconnects at once may reach its listening socket
before that closes too (the shared embedded store's takeover saw two
resets in a row). A front on loopback stands for it: it resets the first
connections after reading their request, then relays to a real server.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from hqueue import HQueueAdmin
from hqueue.client.engine import READ_TRIES
from hqueue.errors import ServerUnavailable
from hqueue.server import HQueueServer


class BreakingFront:
    """Resets the first ``breaks`` connections once a request came, then relays."""

    def __init__(self, target: tuple[str, int], breaks: int) -> None:
        self.target, self.breaks, self.broken = target, breaks, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.broken < self.breaks:
                self.broken += 1
                client.recv(65536)  # the request came: it may have been acted on
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # RST: the peer reads "connection reset"
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                s.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server
    server.stop()


def test_a_read_whose_connection_breaks_again_and_again_is_sent_again_until_it_is_answered(server):
    # Given a server whose connections break mid-call several times in a row
    front = BreakingFront(("127.0.0.1", server.port), breaks=READ_TRIES - 1)
    try:
        with HQueueAdmin(f"hqueue://{front.address}?timeout=10") as admin:
            # When a client reads through it
            names = [info.name for info in admin.list_queues()]
        # Then the read went again on a new connection each time, and was answered
        assert names == ["q"]
        assert front.broken == READ_TRIES - 1
    finally:
        front.close()


def test_a_change_whose_connection_breaks_is_not_sent_again(server):
    # Given a server whose connection breaks once the request came
    front = BreakingFront(("127.0.0.1", server.port), breaks=1)
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
