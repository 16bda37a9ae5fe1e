"""Timers on an embedded store fire on time when `hqueue server` serves it (docs/timers.md).

On a local:// store a timer fires only while a process has the store open;
the documented way to have them fire on time is a server on the store. Here
the server fires a timer while no client is attached.
"""

from __future__ import annotations

import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.ids import wall_clock_ms
from hqueue.rpc import packed
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from ..processes import ServerProcess, wait_for
from .test_hardening import raw_client


def test_a_server_on_a_local_store_fires_a_timer_with_no_client_attached(tmp_path):
    # Given a server on a local:// store, and a timer put through it by a client that then goes away
    store = f"local://{tmp_path / 'data'}"
    server = ServerProcess(store, tmp_path)
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("orders", 1)
        with HQueue("orders", url) as queue:
            (timer,) = queue.put(Message("cancel", b"o-17"), 0, delay=0.5)
        # When the timer falls due with no client attached (and well after)
        time.sleep(max(0.0, timer.due / 1000 - time.time()) + 3.0)
        stopped_ms = int(time.time() * 1000)
    finally:
        server.kill()  # -9: nothing can fire it after this but a process opening the store
    # Then it fired while the server alone had the store: its message was written before the kill
    with HQueue("orders", store) as queue:
        (message,) = list(queue.scan())
    assert message.value == b"o-17"
    assert timer.due <= message.id.timestamp < stopped_ms


def test_hostile_per_message_due_times_get_a_typed_error_and_write_nothing(tmp_path):
    # Given a server, and a raw Thrift client that can send any 'dues' blob
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            admin.create_queue("q", 1)
        client = raw_client(server.port)
        blob = packed.pack([b"t"] * 3, [b"a", b"b", b"c"])
        now = wall_clock_ms()
        # When the dues are too short, too long, not bytes' worth of whole due times, or negative
        # (empty dues are none: the due time is dueMillis, as a client that sends every argument sends it)
        for dues in (packed.pack_dues([now, now]), packed.pack_dues([now] * 4), b"\x00" * 23):
            with pytest.raises(T.TInvalidMessage, match="8 bytes for each of the 3 messages"):
                client.scheduleTimers("q", 0, blob, now, dues)
        with pytest.raises(T.TInvalidMessage, match="epoch ms >= 0"):
            client.scheduleTimers("q", 0, blob, now, packed.pack_dues([now, -1, now]))
        with pytest.raises(T.TInvalidMessage, match="epoch ms >= 0"):  # 2**64-1: a signed -1
            client.scheduleTimers("q", 0, blob, now, b"\xff" * 24)
        # Then the connection still serves, and well-formed dues are taken, each its own
        result = client.scheduleTimers("q", 0, blob, 0, packed.pack_dues([now + 200, now, now + 100]))
        assert result.count == 3
        with HQueue("q", f"hqueue://{server.address}") as queue:
            fired = wait_for(lambda: (ms := list(queue.scan())) and len(ms) == 3 and ms)
            time.sleep(0.3)
            assert [m.value for m in queue.scan()] == [b"b", b"c", b"a"]  # only these: nothing else was written
            assert all(m.id.timestamp >= now for m in fired)
    finally:
        server.stop()
