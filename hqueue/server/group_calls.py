"""The consumer-group calls of HQueueService (SPEC X2, X3), served by each partition's owner."""

from __future__ import annotations

from typing import Any

from ..errors import HQueueError, InvalidArgument
from ..groups.service import GroupService
from ..rpc import packed, wire
from .calls import Calls, served


class GroupCalls(Calls):
    """openGroup, groupReceive, groupAck, groupNack, groupDeadLetter, groupLeave,
    listGroups, describeGroup, setGroupPosition, deleteGroup."""

    #: Set by the server once its coordinator runs.
    service: GroupService | None = None

    @property
    def groups(self) -> GroupService:
        if self.service is None:
            raise HQueueError("the server is starting: consumer groups are not served yet")
        return self.service

    @served("consumer")
    def openGroup(self, queue: str, group: str, topics: list[bytes] | None, startMillis: int, maxRetries: int) -> None:
        self.groups.open(queue, group, frozenset(topics) if topics is not None else None, startMillis, maxRetries)

    @served("consumer")
    def groupReceive(
        self, queue: str, group: str, member: str, maxMessages: int, leaseMillis: int, waitMillis: int
    ) -> Any:
        if not all(isinstance(v, int) for v in (maxMessages, leaseMillis, waitMillis)):
            raise TypeError("'maxMessages', 'leaseMillis' and 'waitMillis' must be ints")
        keys, values, attempts = self.groups.receive_columns(
            queue, group, member, maxMessages, leaseMillis / 1000, waitMillis / 1000
        )
        if keys:
            self.metrics.group_received.labels(queue, group).inc(len(keys))
        return wire.T.TDeliveries(messages=packed.pack(keys, values), attempts=attempts)

    @served("consumer")
    def groupAck(self, queue: str, group: str, rowkeys: bytes) -> int:
        count = self.groups.ack(queue, group, wire.unpack_rowkeys(rowkeys))
        self.metrics.group_acked.labels(queue, group).inc(count)
        return count

    @served("consumer")
    def groupNack(self, queue: str, group: str, member: str, rowkeys: bytes, delayMillis: int) -> int:
        if not isinstance(delayMillis, int):
            raise TypeError("'delayMillis' must be an int (-1: the backoff)")
        delay = None if delayMillis < 0 else delayMillis / 1000
        count = self.groups.nack(queue, group, member, wire.unpack_rowkeys(rowkeys), delay)
        self.metrics.group_nacked.labels(queue, group).inc(count)
        return count

    @served("consumer")
    def groupDeadLetter(self, queue: str, group: str, member: str, rowkeys: bytes) -> int:
        return self.groups.dead_letter(queue, group, member, wire.unpack_rowkeys(rowkeys))

    @served("consumer")
    def groupLeave(self, queue: str, group: str, member: str) -> None:
        self.groups.leave(queue, group, member)

    @served("consumer")
    def listGroups(self, queue: str) -> list[str]:
        return self.groups.names(queue)

    @served("consumer")
    def groupPending(self, queue: str, group: str, limit: int) -> list[Any]:
        return [
            wire.T.TPending(
                partitionID=p["partition"],
                id=wire.to_tid(p["id"]),
                member=p["member"] or "",
                attempt=p["attempt"],
                leaseLeftMillis=-1 if p["lease_left"] is None else int(p["lease_left"] * 1000),
                retryInMillis=-1 if p["retry_in"] is None else int(p["retry_in"] * 1000),
            )
            for p in self.groups.pending(queue, group, limit)
        ]

    @served("consumer")
    def describeGroup(self, queue: str, group: str) -> Any:
        d = self.groups.describe(queue, group)
        partitions = {
            pid: wire.T.TGroupPartition(
                done=wire.to_tid(p["done"]),
                scan=wire.to_tid(p["scan"]),
                inFlight=p["in_flight"],
                retrying=p["retrying"],
                ackedAhead=p["acked_ahead"],
                retries=p["retries"],
                lagMessages=p["lag_messages"],
                lagMillis=p["lag_millis"],
            )
            for pid, p in d["partitions"].items()
        }
        return wire.T.TGroupInfo(
            queue=queue,
            group=group,
            topics=sorted(d["topics"]) if d["topics"] is not None else None,
            startMillis=d["start"],
            maxRetries=d["max_retries"],
            members=d["members"],
            partitions=partitions,
            deadLetters=d["dead_letters"],
        )

    @served("consumer")
    def setGroupPosition(self, queue: str, group: str, partitionID: int, startID: Any) -> None:
        if startID is None:
            raise InvalidArgument("'startID' is required")
        self.groups.set_position(queue, group, partitionID, wire.from_tid(startID))

    @served("admin")
    def deleteGroup(self, queue: str, group: str) -> None:
        self.groups.delete(queue, group)
