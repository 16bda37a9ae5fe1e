"""The push-subscription calls of HQueueService (SPEC C5-C7)."""

from __future__ import annotations

from ..auth import MANAGE, PushPolicy
from ..errors import HQueueError
from ..rpc import operations as op
from ..rpc.threaded import current_connection
from ..subscriptions.service import Subscribers
from .calls import Calls, handler, served


class SubscriptionCalls(Calls):
    """addSubscriber, deleteSubscriber, listSubscribers, describeSubscriber,
    setCheckpoint, getCoordination, subscriberHeartbeat, subscriberLeave."""

    #: Set by the server once its coordinator runs (registrations may live in ZooKeeper).
    service: Subscribers | None = None
    push_policy: PushPolicy = PushPolicy()

    @property
    def subscriptions(self) -> Subscribers:
        if self.service is None:
            raise HQueueError("the server is starting: subscriptions are not served yet")
        return self.service

    addSubscriber = handler(op.ADD_SUBSCRIBER)
    deleteSubscriber = handler(op.DELETE_SUBSCRIBER)
    listSubscribers = handler(op.LIST_SUBSCRIBERS)
    describeSubscriber = handler(op.DESCRIBE_SUBSCRIBER)
    setCheckpoint = handler(op.SET_CHECKPOINT)
    getCoordination = handler(op.GET_COORDINATION)
    subscriberLeave = handler(op.SUBSCRIBER_LEAVE)

    @served(MANAGE, named=(1, "subscriber"))
    def subscriberHeartbeat(self, queue: str, name: str, address: str, topics: list[bytes] | None) -> None:
        if not isinstance(address, str):
            raise TypeError("'address' must be a host:port string")
        connection = current_connection()
        self.push_policy.check(address, connection.peer[0] if connection else None)
        self.subscriptions.heartbeat(queue, name, address, frozenset(topics) if topics is not None else None)
