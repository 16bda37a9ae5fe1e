"""Timers on an embedded store fire on time when `hqueue server` serves it (docs/timers.md).

On a local:// store a timer fires only while a process has the store open;
the documented way to have them fire on time is a server on the store. Here
the server fires a timer while no client is attached.
"""

from __future__ import annotations

import time

from hqueue import HQueue, HQueueAdmin, Message

from ..processes import ServerProcess


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
