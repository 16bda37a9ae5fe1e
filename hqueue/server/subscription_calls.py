"""The push-subscription calls of HQueueService (SPEC C5-C7)."""

from __future__ import annotations

from typing import Any

from ..auth import MANAGE, PushCredentials, PushPolicy
from ..errors import HQueueError, InvalidArgument
from ..rpc import operations as op
from ..rpc import wire
from ..rpc.connections import current_connection
from ..subscriptions.service import Subscribers
from .calls import Calls, handler, served


class SubscriptionCalls(Calls):
    """addSubscriber, deleteSubscriber, listSubscribers, describeSubscriber,
    setCheckpoint, getCoordination, subscriberHeartbeat, approveSubscriberAddress, subscriberLeave."""

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
    #: Whether this server serves TLS: then it pushes only to subscribers that listen with TLS.
    tls = False

    def _announced(self, address: object, push: Any) -> tuple[str, PushCredentials]:
        """Check an announced address (the push policy) and push key: the address to keep
        (the IP that was checked, never a name to look up again) and the credentials."""
        if not isinstance(address, str):
            raise InvalidArgument("'address' must be a host:port string")
        connection = current_connection()
        pinned = self.push_policy.check(address, connection.peer[0] if connection else None)
        credentials = wire.from_tpush_key(push)
        if self.tls and credentials.certificate is None:
            raise InvalidArgument(
                "this server serves TLS and pushes only over TLS: the subscriber must listen with TLS "
                "(create_subscriber(..., tls=True), the default over a tls=1 URL)"
            )
        return pinned, credentials

    @served(MANAGE, named=(1, "subscriber"))
    def subscriberHeartbeat(
        self, queue: str, name: str, address: str, topics: list[bytes] | None, push: Any = None
    ) -> None:
        self.subscriptions.registration(queue, name)  # first: an unknown name costs no lookup of its address
        pinned, credentials = self._announced(address, push)
        self.subscriptions.heartbeat(
            queue, name, pinned, frozenset(topics) if topics is not None else None, credentials
        )

    @served(MANAGE, named=(1, "subscriber"))
    def approveSubscriberAddress(self, queue: str, name: str, address: str, push: Any = None) -> None:
        self.subscriptions.registration(queue, name)
        self.subscriptions.approve(queue, name, *self._announced(address, push))
