"""A connection that breaks mid-call: reads go again, changes do not.

A server that is killed breaks its connections one after another while it
exits, and a client that reconnects at once may reach its listening socket
before that closes too (the shared embedded store's takeover saw two
resets in a row). A relay on loopback (tests/helpers/relay.py) stands for
it: it resets the first connections after reading their request, then
relays to a real server.
"""

from __future__ import annotations

import pytest

from hqueue import HQueue, HQueueAdmin
from hqueue.client.engine import READ_TRIES
from hqueue.errors import ServerUnavailable

from ..helpers.relay import Relay


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
