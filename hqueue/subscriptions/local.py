"""Push subscriptions on a store in this process: what ``hqueue server`` does
for its clients, run inside the process that opened the store.

The embedded default (and ``memory://``) serve subscriptions this way: the
same registrations (kept in the store), the same checkpoints and the same
delivery workers as a server, pushing to the subscriber's port on loopback.
They start with the first subscription call and stop when the store closes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..coordination.local import LocalCoordinator
from .manager import SubscriptionManager
from .service import Subscribers
from .store_registry import StoreRegistry

if TYPE_CHECKING:
    from ..engine import Engine


def local_subscriptions(engine: Engine) -> Subscribers:
    """The subscription service of a store in this process: registrations in the
    store, delivery started by the first registration or heartbeat and stopped
    (saving every checkpoint) when the engine closes."""
    registry = StoreRegistry(engine.storage)
    lock = threading.Lock()
    started: list[tuple[SubscriptionManager, LocalCoordinator]] = []

    def start() -> None:
        with lock:
            if started:
                return
            coordinator = LocalCoordinator("in-process")  # this process owns every partition
            coordinator.start(lambda: [(q.name, q.partitions) for q in engine.list_queues()])
            manager = SubscriptionManager(engine, coordinator, registry, push_threads=2)
            manager.start()
            started.append((manager, coordinator))

    def stop() -> None:
        with lock:
            for manager, coordinator in started:
                manager.stop()  # saves every checkpoint
                coordinator.stop()
            started.clear()

    engine.on_close(stop)
    return Subscribers(engine, registry, in_use=start)
