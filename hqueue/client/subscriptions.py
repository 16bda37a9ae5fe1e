"""Push subscriptions over hqueue servers (the remote :class:`~hqueue.api.SubscriptionsAPI`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..auth import PushCredentials
from ..rpc import operations as op
from ..rpc import wire
from .calls import remote


class RemoteSubscriptions:
    """``engine.subscriptions`` of a :class:`~hqueue.client.engine.RemoteEngine`: each
    call is a declared operation (``rpc/operations.py``), but the announcements (whose
    address the server checks against the calling host)."""

    def __init__(self, engine: Any) -> None:  # a RemoteEngine (which makes this: typed loosely, no cycle)
        self._engine = engine

    add = remote(op.ADD_SUBSCRIBER)
    delete = remote(op.DELETE_SUBSCRIBER)
    names = remote(op.LIST_SUBSCRIBERS)
    describe = remote(op.DESCRIBE_SUBSCRIBER)
    set_checkpoint = remote(op.SET_CHECKPOINT)
    coordination = remote(op.GET_COORDINATION)
    leave = remote(op.SUBSCRIBER_LEAVE)

    def heartbeat(
        self, queue: str, name: str, address: str, topics: Collection[bytes] | None, push: PushCredentials
    ) -> None:
        topics_out = sorted(topics) if topics else None
        self._engine._call(
            "subscriberHeartbeat", queue, name, address, topics_out, wire.to_tpush_key(push), queue=queue
        )

    def approve(self, queue: str, name: str, address: str, push: PushCredentials) -> None:
        self._engine._call("approveSubscriberAddress", queue, name, address, wire.to_tpush_key(push), queue=queue)
