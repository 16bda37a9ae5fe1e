"""The push-subscription calls of HQueueService (SPEC C5-C7)."""

from __future__ import annotations

from typing import Any

from ..auth import PushPolicy
from ..errors import HQueueError
from ..rpc import wire
from ..rpc.threaded import current_connection
from ..subscriptions.service import Subscribers
from .calls import Calls, served


class SubscriptionCalls(Calls):
    """addSubscriber, deleteSubscriber, listSubscribers, describeSubscriber,
    setCheckpoint, getCoordination, subscriberHeartbeat, subscriberLeave."""

    #: Set by the server once its coordinator runs (registrations may live in ZooKeeper).
    service: Subscribers | None = None
    push_policy: PushPolicy = PushPolicy()

    @property
    def subscribers(self) -> Subscribers:
        if self.service is None:
            raise HQueueError("the server is starting: subscriptions are not served yet")
        return self.service

    @served("consumer")
    def addSubscriber(
        self,
        queue: str,
        name: str,
        topics: list[bytes] | None,
        partitions: list[Any] | None,
        deadLetterAfter: int | None = None,
    ) -> None:
        starts = None
        if partitions is not None:
            starts = {p.partitionID: wire.from_tid(p.startID) if p.startID else None for p in partitions}
        self.subscribers.add(queue, name, frozenset(topics) if topics is not None else None, starts, deadLetterAfter)

    @served("consumer", 1)
    def deleteSubscriber(self, name: str, queue: str) -> None:
        self.subscribers.delete(queue, name)

    @served("consumer")
    def listSubscribers(self, queue: str) -> list[str]:
        self.engine.queue_info(queue)
        return self.subscribers.names(queue)

    @served("consumer", 1)
    def describeSubscriber(self, name: str, queue: str) -> Any:
        d = self.subscribers.describe(queue, name)
        return wire.T.TSubscriberInfo(
            name=name,
            queue=queue,
            topics=sorted(d["topics"]) if d["topics"] is not None else None,
            partitions=sorted(d["partitions"]) if d["partitions"] is not None else None,
            checkpoints={p: wire.to_tid(i) for p, i in d["checkpoints"].items()},
            address=d["address"] or "",
            lagMessages=d["lag_messages"],
            lagMillis=d["lag_millis"],
        )

    @served("consumer")
    def setCheckpoint(self, queue: str, name: str, partitionID: int, startID: Any) -> None:
        self.subscribers.set_checkpoint(queue, name, None if partitionID == -1 else partitionID, wire.from_tid(startID))

    @served("connected", None)
    def getCoordination(self) -> str:
        return self.subscribers.coordination()

    @served("consumer")
    def subscriberHeartbeat(self, queue: str, name: str, address: str, topics: list[bytes] | None) -> None:
        if not isinstance(address, str):
            raise TypeError("'address' must be a host:port string")
        connection = current_connection()
        self.push_policy.check(address, connection.peer[0] if connection else None)
        self.subscribers.heartbeat(queue, name, address, frozenset(topics) if topics is not None else None)

    @served("consumer")
    def subscriberLeave(self, queue: str, name: str) -> None:
        self.subscribers.leave(queue, name)
