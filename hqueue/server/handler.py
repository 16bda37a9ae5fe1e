"""The HQueueService calls (``thrift/hqueue.thrift``), over an engine.

This is the coprocessor's role served over the wire: the owner of a
partition assigns IDs and writes; any server answers scans and admin calls
(the store is shared). hqueue errors become the IDL's typed exceptions; an
unexpected error is logged and reported as TIOError, and never takes the
server down.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..auth import OPEN, AuthPolicy, Principal, PushPolicy
from ..checks import check_partition
from ..config import QueueState
from ..coordination import Coordinator
from ..engine import Engine
from ..errors import HQueueError, InvalidArgument, NotAuthorized, NotPartitionOwner
from ..groups.service import GroupService
from ..message import Message, MessageID, cell_keys_of, values_of
from ..metrics import ServerMetrics
from ..rpc import packed, wire
from ..rpc.threaded import current_connection
from ..scanner import PartitionScanner
from ..subscriptions.service import Subscribers
from .scanners import ScannerRegistry

logger = logging.getLogger(__name__)

#: The most partitions a queue may have on a server (``--max-partitions``).
DEFAULT_MAX_PARTITIONS = 1024


@functools.cache
def _declared(method: str) -> tuple[type, ...]:
    """The exception classes the IDL declares for ``method``."""
    spec = getattr(wire.T.HQueueService, method + "_result").thrift_spec
    return tuple(field[2] for key, field in spec.items() if key != 0 and len(field) > 2 and isinstance(field[2], type))


def _served(role: str | None, queue_arg: int | None = 0):
    """A Thrift call: authorized, counted, and with only IDL exceptions out.

    ``role`` is what the connection's token must hold on the queue given as
    argument ``queue_arg`` (``"member"``: any role; ``"connected"``: an
    authenticated connection, no queue); None for ``authenticate`` itself.

    An exception the IDL does not declare for a call would make thriftpy2
    drop the connection; it is sent as TIOError instead.
    """

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args):
            with self._active_lock:
                self.active += 1
            try:
                if role is not None:
                    self._authorize(role, method.__name__, args[queue_arg] if queue_arg is not None else None)
                return method(self, *args)
            except Exception as e:
                if isinstance(e, (HQueueError, ValueError, TypeError)):
                    error = wire.to_thrift_error(e)
                else:
                    logger.exception("%s%r failed", method.__name__, args[:2])
                    error = wire.T.TIOError(message=f"internal error: {type(e).__name__}: {e}")
                if not isinstance(error, _declared(method.__name__)):
                    error = wire.T.TIOError(message=error.message)
                raise error from e
            finally:
                with self._active_lock:
                    self.active -= 1

        return call

    return wrap


class HQueueHandler:
    """Implements HQueueService."""

    def __init__(
        self,
        engine: Engine,
        coordinator: Coordinator,
        scanners: ScannerRegistry,
        *,
        auth: AuthPolicy | None = None,
        push_policy: PushPolicy | None = None,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.engine, self.coordinator, self.scanners = engine, coordinator, scanners
        self.metrics = metrics or ServerMetrics()
        self.auth, self.push_policy = auth, push_policy or PushPolicy()
        self.max_partitions = max_partitions
        #: Set by the server once its coordinator runs (registrations may live in ZooKeeper).
        self._subscribers: Subscribers | None = None
        self._groups: GroupService | None = None
        #: Calls under way (read by shutdown to drain), and whether puts are refused.
        self.active = 0
        self.draining = False
        self._active_lock = threading.Lock()

    # -- authorization -------------------------------------------------------------

    def _principal(self) -> Principal:
        connection = current_connection()
        if connection is not None and connection.principal is not None:
            return connection.principal
        if self.auth is None:
            return OPEN
        raise NotAuthorized("this server needs a token: connect with hqueue://TOKEN@host:port (or token=)")

    def _authorize(self, role: str, action: str, queue: Any) -> None:
        principal = self._principal()
        if role == "connected":
            return
        if not isinstance(queue, str):
            raise TypeError(f"'queue' must be a string, got {type(queue).__name__}")
        if role == "member":
            if not principal.may_see(queue):
                raise NotAuthorized(f"token {principal.name!r} has no role on queue {queue!r}")
        else:
            principal.require(role, queue, action)

    @_served(None)
    def authenticate(self, token: str) -> None:
        connection = current_connection()
        if self.auth is None:
            principal = OPEN
        else:
            try:
                principal = self.auth.authenticate(token)
            except NotAuthorized:
                peer = connection.peer[0] if connection else "?"
                logger.warning("refused a token from %s", peer)
                raise
        if connection is not None:
            connection.principal = principal

    def _connection_id(self) -> int:
        connection = current_connection()
        return connection.id if connection is not None else 0

    # -- scanners ----------------------------------------------------------------

    @_served("consumer")
    def messageScannerOpen(self, queue: str, partitionID: int, scan: Any) -> int:
        info = self.engine.enabled_queue(queue)
        check_partition(info, partitionID)
        scanner = PartitionScanner(self.engine, queue, partitionID, wire.from_tscan(scan))
        connection = current_connection()
        if connection is None:  # called in process (tests): no connection to bind to
            return self.scanners.open(scanner)
        if not connection.on_close:  # the connection's first scanner: free them all when it ends
            connection.on_close.append(functools.partial(self.scanners.close_owned, connection.id))
        return self.scanners.open(scanner, owner=connection.id)

    @_served("connected", None)
    def messageScannerGet(self, scannerID: int) -> Any:
        messages = self.scanners.take(scannerID, 1, owner=self._connection_id())
        return wire.to_tmessages(messages)[0] if messages else wire.T.TMessage()

    @_served("connected", None)
    def messageScannerGetList(self, scannerID: int, nbMessages: int) -> list[Any]:
        return wire.to_tmessages(self.scanners.take(scannerID, nbMessages, owner=self._connection_id()))

    @_served("connected", None)
    def messageScannerGetPacked(self, scannerID: int, nbMessages: int) -> bytes:
        messages = self.scanners.take(scannerID, nbMessages, owner=self._connection_id())
        return packed.pack(cell_keys_of(messages), values_of(messages))

    @_served("connected", None)
    def messageScannerClose(self, scannerID: int) -> None:
        self.scanners.close(scannerID, owner=self._connection_id())

    # -- puts ---------------------------------------------------------------------

    def _put(self, queue: str, partition_id: int | None, tmessages: list[Any]) -> list[MessageID]:
        if not isinstance(tmessages, list):
            raise TypeError("'messages' must be a list of TMessage")
        messages = [wire.from_tmessage(t, i) for i, t in enumerate(tmessages)]
        partition_id = self._writable_partition(queue, partition_id)
        with self._counted_put(queue, len(messages)):
            return self.engine.put(queue, messages, partition_id)

    @contextmanager
    def _counted_put(self, queue: str, count: int) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.metrics.put_seconds.labels(queue).observe(time.perf_counter() - started)
        self.metrics.put_messages.labels(queue).inc(count)

    def _writable_partition(self, queue: str, partition_id: int | None) -> int:
        """The partition to write to (a random owned one for None), if this server owns it now."""
        info = self.engine.enabled_queue(queue)
        if partition_id is None:
            owned = self.coordinator.owned(queue, info.partitions)
            if not owned:
                raise NotPartitionOwner(queue, -1, None)
            partition_id = random.choice(owned)
        check_partition(info, partition_id)
        if self.draining:  # shutting down: the client retries on the next owner
            raise NotPartitionOwner(queue, partition_id, None)
        self.coordinator.require_owner(queue, partition_id)
        return partition_id

    @_served("producer")
    def putPacked(self, queue: str, partitionID: int, messages: bytes) -> Any:
        topics, values = packed.unpack(messages)
        partition_id = self._writable_partition(queue, partitionID)
        with self._counted_put(queue, len(topics)):
            first = self.engine.put_columns(queue, topics, values, partition_id)
        return wire.T.TPutResult(firstID=wire.to_tid(first), count=len(topics))

    @_served("producer")
    def putMessage(self, queue: str, message: Any) -> Any:
        return wire.to_tid(self._put(queue, None, [message])[0])

    @_served("producer")
    def putMessages(self, queue: str, messages: list[Any]) -> list[Any]:
        return [wire.to_tid(i) for i in self._put(queue, None, messages)]

    @_served("producer")
    def putMessageWithPid(self, queue: str, partitionID: int, message: Any) -> Any:
        return wire.to_tid(self._put(queue, partitionID, [message])[0])

    @_served("producer")
    def putMessagesWithPid(self, queue: str, partitionID: int, messages: list[Any]) -> list[Any]:
        return [wire.to_tid(i) for i in self._put(queue, partitionID, messages)]

    @_served("member")
    def getQueueLocations(self, queue: str) -> list[str]:
        info = self.engine.queue_info(queue, fresh=True)
        return self.coordinator.locations(queue, info.partitions)

    # -- admin ---------------------------------------------------------------------

    @_served("connected", None)
    def createQueue(self, info: Any) -> None:
        if info is None:
            raise TypeError("'info' is required")
        queue = wire.from_tinfo(info)
        self._principal().require("admin", queue.name, "create")
        if queue.partitions > self.max_partitions:
            raise InvalidArgument(
                f"'partitions' must be at most {self.max_partitions} on this server, got {queue.partitions}"
            )
        self.engine.create_queue(queue)
        self.coordinator.queues_changed()

    @_served("member")
    def describeQueue(self, queue: str) -> Any:
        description = self.engine.describe_queue(queue)
        estimate = description["message_count_estimate"]
        return wire.T.TQueueDescription(
            info=wire.to_tinfo(self.engine.queue_info(queue)),
            messageCountEstimate=-1 if estimate is None else estimate,
            lastIDs={pid: wire.to_tid(i) for pid, i in description["last_ids"].items() if i},
        )

    @_served("member")
    def getQueue(self, queue: str) -> Any:
        return wire.to_tinfo(self.engine.queue_info(queue, fresh=True))

    @_served("connected", None)
    def listQueues(self) -> list[Any]:
        principal = self._principal()
        return [wire.to_tinfo(info) for info in self.engine.list_queues() if principal.may_see(info.name)]

    @_served("admin")
    def truncateQueue(self, queue: str) -> None:
        self.engine.truncate_queue(queue)

    @_served("admin")
    def disableQueue(self, queue: str) -> None:
        self.engine.set_state(queue, QueueState.DISABLED)

    @_served("admin")
    def enableQueue(self, queue: str) -> None:
        self.engine.set_state(queue, QueueState.ENABLED)

    @_served("admin")
    def dropQueue(self, queue: str) -> None:
        self.engine.delete_queue(queue)
        self.coordinator.queues_changed()

    # -- subscriptions -------------------------------------------------------------------

    @property
    def subscribers(self) -> Subscribers:
        if self._subscribers is None:
            raise HQueueError("the server is starting: subscriptions are not served yet")
        return self._subscribers

    @subscribers.setter
    def subscribers(self, subscribers: Subscribers) -> None:
        self._subscribers = subscribers

    @property
    def groups(self) -> GroupService:
        if self._groups is None:
            raise HQueueError("the server is starting: consumer groups are not served yet")
        return self._groups

    @groups.setter
    def groups(self, groups: GroupService) -> None:
        self._groups = groups

    @_served("consumer")
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

    @_served("consumer", 1)
    def deleteSubscriber(self, name: str, queue: str) -> None:
        self.subscribers.delete(queue, name)

    @_served("consumer")
    def listSubscribers(self, queue: str) -> list[str]:
        self.engine.queue_info(queue)
        return self.subscribers.names(queue)

    @_served("consumer", 1)
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

    @_served("consumer")
    def setCheckpoint(self, queue: str, name: str, partitionID: int, startID: Any) -> None:
        self.subscribers.set_checkpoint(queue, name, None if partitionID == -1 else partitionID, wire.from_tid(startID))

    @_served("connected", None)
    def getCoordination(self) -> str:
        return self.subscribers.coordination()

    @_served("consumer")
    def subscriberHeartbeat(self, queue: str, name: str, address: str, topics: list[bytes] | None) -> None:
        if not isinstance(address, str):
            raise TypeError("'address' must be a host:port string")
        connection = current_connection()
        self.push_policy.check(address, connection.peer[0] if connection else None)
        self.subscribers.heartbeat(queue, name, address, frozenset(topics) if topics is not None else None)

    @_served("consumer")
    def subscriberLeave(self, queue: str, name: str) -> None:
        self.subscribers.leave(queue, name)

    # -- timers (SPEC X1) -------------------------------------------------------------------

    @_served("producer")
    def scheduleTimers(self, queue: str, partitionID: int, messages: bytes, dueMillis: int) -> Any:
        topics, values = packed.unpack(messages)
        partition_id = self._writable_partition(queue, partitionID)
        if not isinstance(dueMillis, int) or not 0 <= dueMillis < 2**63:
            raise InvalidArgument(f"'dueMillis' must be epoch ms >= 0, got {dueMillis!r}")
        with self._counted_put(queue, len(topics)):
            timers = self.engine.schedule(queue, list(map(Message, topics, values)), partition_id, dueMillis)
        return wire.T.TPutResult(firstID=wire.to_tid(timers[0].id), count=len(timers))

    @_served("producer")
    def cancelTimer(self, queue: str, timer: Any) -> bool:
        handle = wire.from_ttimer(timer)
        self.coordinator.require_owner(queue, handle.partition_id)
        return self.engine.cancel_timer(queue, handle)

    # -- consumer groups (SPEC X2, X3) --------------------------------------------------------

    @_served("consumer")
    def openGroup(self, queue: str, group: str, topics: list[bytes] | None, startMillis: int, maxRetries: int) -> None:
        self.groups.open(queue, group, frozenset(topics) if topics is not None else None, startMillis, maxRetries)

    @_served("consumer")
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

    @_served("consumer")
    def groupAck(self, queue: str, group: str, rowkeys: bytes) -> int:
        count = self.groups.ack(queue, group, wire.unpack_rowkeys(rowkeys))
        self.metrics.group_acked.labels(queue, group).inc(count)
        return count

    @_served("consumer")
    def groupNack(self, queue: str, group: str, member: str, rowkeys: bytes, delayMillis: int) -> int:
        if not isinstance(delayMillis, int):
            raise TypeError("'delayMillis' must be an int (-1: the backoff)")
        delay = None if delayMillis < 0 else delayMillis / 1000
        count = self.groups.nack(queue, group, member, wire.unpack_rowkeys(rowkeys), delay)
        self.metrics.group_nacked.labels(queue, group).inc(count)
        return count

    @_served("consumer")
    def groupDeadLetter(self, queue: str, group: str, member: str, rowkeys: bytes) -> int:
        return self.groups.dead_letter(queue, group, member, wire.unpack_rowkeys(rowkeys))

    @_served("consumer")
    def groupLeave(self, queue: str, group: str, member: str) -> None:
        self.groups.leave(queue, group, member)

    @_served("consumer")
    def listGroups(self, queue: str) -> list[str]:
        return self.groups.names(queue)

    @_served("consumer")
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

    @_served("consumer")
    def setGroupPosition(self, queue: str, group: str, partitionID: int, startID: Any) -> None:
        if startID is None:
            raise InvalidArgument("'startID' is required")
        self.groups.set_position(queue, group, partitionID, wire.from_tid(startID))

    @_served("admin")
    def deleteGroup(self, queue: str, group: str) -> None:
        self.groups.delete(queue, group)
