"""Push-subscription administration over hqueue servers, awaitable: the declared
operations (``rpc/operations.py``). A subscriber itself (its push listener) is a
:class:`~hqueue.Subscriber`; :mod:`hqueue.aio.subscriber` hands its batches to async
listeners."""

from __future__ import annotations

from typing import Any

from ...rpc import operations as op
from .calls import aremote


class AsyncRemoteSubscriptions:
    def __init__(self, engine: Any) -> None:  # an AsyncRemoteEngine (typed loosely: no cycle)
        self._engine = engine

    add = aremote(op.ADD_SUBSCRIBER)
    delete = aremote(op.DELETE_SUBSCRIBER)
    names = aremote(op.LIST_SUBSCRIBERS)
    describe = aremote(op.DESCRIBE_SUBSCRIBER)
    set_checkpoint = aremote(op.SET_CHECKPOINT)
    leave = aremote(op.SUBSCRIBER_LEAVE)
