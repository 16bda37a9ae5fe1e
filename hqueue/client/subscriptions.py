"""Push subscriptions over hqueue servers (the remote :class:`~hqueue.api.SubscriptionsAPI`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..message import MessageID
from ..rpc import wire


class RemoteSubscriptions:
    """``engine.subscriptions`` of a :class:`~hqueue.client.engine.RemoteEngine`."""

    def __init__(self, engine: Any) -> None:  # a RemoteEngine (which makes this: typed loosely, no cycle)
        self._engine = engine

    def add(
        self,
        queue: str,
        name: str,
        topics: Collection[bytes] | None,
        starts: dict[int, MessageID | None] | None,
        dead_letter_after: int | None = None,
    ) -> None:
        given = None
        if starts is not None:
            given = [
                wire.T.TPartitionStart(partitionID=pid, startID=wire.to_tid(start) if start else None)
                for pid, start in sorted(starts.items())
            ]
        topic_list = sorted(topics) if topics is not None else None
        self._engine._call("addSubscriber", queue, name, topic_list, given, dead_letter_after, queue=queue)

    def delete(self, queue: str, name: str) -> None:
        self._engine._call("deleteSubscriber", name, queue, queue=queue)

    def names(self, queue: str) -> list[str]:
        return list(self._engine._call("listSubscribers", queue, queue=queue))

    def describe(self, queue: str, name: str) -> dict[str, Any]:
        t = self._engine._call("describeSubscriber", name, queue, queue=queue)
        return {
            "name": name,
            "queue": queue,
            "address": t.address or None,
            "topics": frozenset(t.topics) if t.topics is not None else None,
            "partitions": frozenset(t.partitions) if t.partitions is not None else None,
            "checkpoints": {p: wire.from_tid(i) for p, i in (t.checkpoints or {}).items()},
            "lag_messages": dict(t.lagMessages or {}),
            "lag_millis": dict(t.lagMillis or {}),
        }

    def set_checkpoint(self, queue: str, name: str, partition_id: int | None, start: MessageID) -> None:
        self._engine._call(
            "setCheckpoint", queue, name, -1 if partition_id is None else partition_id, wire.to_tid(start), queue=queue
        )

    def coordination(self) -> str:
        return self._engine._call("getCoordination")

    def heartbeat(self, queue: str, name: str, address: str, topics: Collection[bytes] | None) -> None:
        self._engine._call("subscriberHeartbeat", queue, name, address, sorted(topics) if topics else None, queue=queue)

    def leave(self, queue: str, name: str) -> None:
        self._engine._call("subscriberLeave", queue, name, queue=queue)
