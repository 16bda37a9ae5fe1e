"""Push subscriptions on a store in this process: what ``hqueue server`` does
for its clients, run inside the process that opened the store.

The embedded default (and ``memory://``) serve subscriptions this way: the
same registrations (kept in the store), the same checkpoints and the same
delivery workers as a server, pushing to the subscriber's port on loopback.
They start with the first subscription call and stop when the store closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..coordination.local import LocalCoordinator
from .delivery import SubscriptionManager
from .service import Subscribers
from .store_registry import StoreRegistry

if TYPE_CHECKING:
    from ..engine import Engine


class LocalSubscriptions:
    """The registry, the admin calls and the delivery workers for one engine."""

    def __init__(self, engine: Engine) -> None:
        self.registry = StoreRegistry(engine.storage)
        self.subscribers = Subscribers(engine, self.registry)
        self.coordinator = LocalCoordinator("in-process")  # this process owns every partition
        self.coordinator.start(lambda: [(q.name, q.partitions) for q in engine.list_queues()])
        self.manager = SubscriptionManager(engine, self.coordinator, self.registry)
        self.manager.start()

    def describe(self, queue: str, name: str) -> dict[str, Any]:
        return self.subscribers.describe(queue, name)

    def stop(self) -> None:
        self.manager.stop()  # saves every checkpoint
        self.coordinator.stop()
