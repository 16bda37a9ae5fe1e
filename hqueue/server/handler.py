"""The HQueueService calls (``thrift/hqueue.thrift``), over an engine: the queue calls, and the handler.

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
import time
from typing import Any

from ..auth import OPEN, AuthPolicy, PushPolicy
from ..checks import check_partition
from ..config import QueueState
from ..coordination import Coordinator
from ..engine import Engine
from ..errors import InvalidArgument, LimitExceeded, NotAuthorized, NotPartitionOwner
from ..groups.handout import RECEIVE_BYTES
from ..groups.limits import MAX_PENDING, check_pending_limit
from ..keys.requests import Request
from ..message import Message, MessageID, messages_from_columns
from ..metrics import ServerMetrics
from ..rpc import packed, wire
from ..rpc.connections import current_connection
from ..rpc.loop import may_block, on_loop
from .calls import CallGuard, Calls, ThriftService, served
from .group_calls import GroupCalls
from .logins import FailedLogins
from .scanners import ColumnScanner, ScannerRegistry
from .subscription_calls import SubscriptionCalls

logger = logging.getLogger(__name__)

#: The most partitions a queue may have on a server (``--max-partitions``).
DEFAULT_MAX_PARTITIONS = 1024


class QueueCalls(Calls):
    """authenticate; the queues' admin calls; puts; scanners; partition locations; timers."""

    def __init__(
        self,
        engine: Engine,
        coordinator: Coordinator,
        guard: CallGuard,
        metrics: ServerMetrics,
        scanners: ScannerRegistry,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        max_put_messages: int = wire.MAX_PUT_BATCH,
        max_put_bytes: int = wire.MAX_PUT_BYTES,
    ) -> None:
        super().__init__(engine, coordinator, guard, metrics)
        self.scanners, self.max_partitions = scanners, max_partitions
        self.failed_logins = FailedLogins()
        self.max_put_messages, self.max_put_bytes = max_put_messages, max_put_bytes

    @served(None)
    def authenticate(self, token: str) -> None:
        """A wrong token is answered late after a few, and ends its connection after
        more (:mod:`hqueue.server.logins`)."""
        connection = current_connection()
        if self.guard.auth is None:
            principal = OPEN
        else:
            try:
                principal = self.guard.auth.authenticate(token)
            except NotAuthorized as e:
                delay, close = self.failed_logins.failed(connection)
                time.sleep(delay)  # a thread of this connection's own (never the loop's): only the guesser waits
                if close and connection is not None:
                    connection.close_after_reply = True
                    raise NotAuthorized(f"{e}; too many failed attempts: the connection is closed") from None
                raise
            if not principal.may_call():  # (a metrics token): it would only hold a place here
                raise NotAuthorized(f"token {principal.name!r} holds no role on any queue: nothing to call here")
        if connection is not None:
            connection.principal = principal

    def _scanner_owner(self) -> tuple[int, str | None]:
        """Whose scanners a call may use: its connection's (by ID), as the token it is
        authenticated as now (None: no connection, or a server without tokens)."""
        connection = current_connection()
        if connection is None:
            return 0, None
        principal = connection.principal if self.guard.auth is not None else None
        return connection.id, principal.name if principal is not None else None

    # -- scanners ----------------------------------------------------------------

    @served("consumer", inline=True)
    def messageScannerOpen(self, queue: str, partitionID: int, scan: Any) -> int:
        info = self.engine.enabled_queue(queue)
        check_partition(info, partitionID)
        scanner = ColumnScanner(self.engine, queue, partitionID, wire.from_tscan(scan))
        connection = current_connection()
        if connection is not None:  # its scanners all freed when it ends (once per connection)
            connection.when_closed("scanners", functools.partial(self.scanners.close_owned, connection.id))
        return self.scanners.open(scanner, *self._scanner_owner())

    @served("connected", None, inline=True)
    def messageScannerGet(self, scannerID: int) -> Any:
        messages = messages_from_columns(
            *self.scanners.take(scannerID, 1, *self._scanner_owner(), room=wire.STRUCT_REPLY_BYTES)
        )
        return wire.to_tmessages(messages)[0] if messages else wire.T.TMessage()

    @served("connected", None, inline=True)
    def messageScannerGetList(self, scannerID: int, nbMessages: int) -> list[Any]:
        columns = self.scanners.take(scannerID, nbMessages, *self._scanner_owner(), room=wire.STRUCT_REPLY_BYTES)
        return wire.to_tmessages(messages_from_columns(*columns))

    @served("connected", None, inline=True)
    def messageScannerGetPacked(self, scannerID: int, nbMessages: int) -> bytes:
        return packed.pack(*self.scanners.take(scannerID, nbMessages, *self._scanner_owner()))

    @served("connected", None, inline=True)
    def messageScannerClose(self, scannerID: int) -> None:
        self.scanners.close(scannerID, *self._scanner_owner())

    # -- puts ---------------------------------------------------------------------

    def _put(self, queue: str, partition_id: int | None, tmessages: list[Any]) -> list[MessageID]:
        if not isinstance(tmessages, list):
            raise TypeError("'messages' must be a list of TMessage")
        self._check_put(len(tmessages), 0)
        messages = [wire.from_tmessage(t, i) for i, t in enumerate(tmessages)]
        self._check_put(len(messages), sum(len(m.topic) + len(m.value) for m in messages))
        partition_id = self._writable_partition(queue, partition_id)
        self._before_put(queue, partition_id)
        started = time.perf_counter()
        ids = self.engine.put(queue, messages, partition_id)
        self.metrics.puts(queue).observe(time.perf_counter() - started, len(messages))
        return ids

    def _unpack_put(self, blob: bytes) -> tuple[list[bytes], list[bytes]]:
        """A put's packed batch, checked against the put limits from its head before it is unpacked."""
        self._check_put(*packed.measure(blob))
        return packed.unpack(blob)

    def _check_put(self, count: int, payload: int) -> None:
        """Refuse a put of more messages, or more bytes of topics and values, than one call may carry."""
        if count > self.max_put_messages:
            raise LimitExceeded(
                "max_put_messages",
                self.max_put_messages,
                f"a put carries at most {self.max_put_messages} messages on this server (--max-put-messages); "
                f"this one has {count}",
            )
        if payload > self.max_put_bytes:
            raise LimitExceeded(
                "max_put_bytes",
                self.max_put_bytes,
                f"a put carries at most {self.max_put_bytes} bytes of topics and values on this server "
                f"(--max-put-bytes); this one has {payload}",
            )

    def _writable_partition(
        self, queue: str, partition_id: int | None, sent: Request | None = None, count: int = 0
    ) -> int:
        """The partition to write to (a random owned one for None), if this server owns it now.
        Shutting down, only a put sent again (``sent`` marked resent) whose first try was
        written here goes on, to be answered from its record: refused, its client could not
        tell whether the first was written (OutcomeUnknown), and sending it elsewhere would
        store it twice.

        Raises:
            QueueNotFound: ``sent`` says the client checked and routed the put by another
                queue of the name (deleted and made again since): nothing is written (a key's
                partition may differ in the new one), and the client reads it again.
        """
        info = self.engine.routed_queue(queue, sent.created if sent is not None else None, may_block)
        if partition_id is None:
            owned = self.coordinator.owned(queue, info.partitions)
            if not owned:
                raise NotPartitionOwner(queue, -1, None)
            partition_id = random.choice(owned)
        check_partition(info, partition_id)
        self.coordinator.require_owner(queue, partition_id)
        if self.guard.draining and not self._written(info, partition_id, sent, count):
            raise NotPartitionOwner(queue, partition_id, None)  # shutting down: the client retries on the next owner
        return partition_id

    def _written(self, info: Any, partition_id: int, sent: Request | None, count: int) -> bool:
        """Whether ``sent``'s put, marked resent, was written here already."""
        if sent is None or not sent.resent:
            return False
        may_block()  # (its record may be read from the store: on a worker)
        with self.engine.writers.lock(info.name, partition_id):
            return self.engine.writers.answered(info, partition_id, sent, count) is not None

    def _before_put(self, queue: str, partition_id: int) -> None:
        """On the event loop, before a put writes: a put behind another call writing the
        partition (a batch put on a worker) goes to a worker rather than hold the loop."""
        if on_loop() and self.engine.writers.lock(queue, partition_id).locked():
            may_block()

    @served("producer", inline=True)
    def putPacked(self, queue: str, partitionID: int, messages: bytes, request: Any = None) -> Any:
        topics, values = self._unpack_put(messages)
        sent = wire.from_trequest(request)
        partition_id = self._writable_partition(queue, partitionID, sent, len(topics))
        self._before_put(queue, partition_id)
        started = time.perf_counter()
        first = self.engine.put_columns(queue, topics, values, partition_id, sent)
        self.metrics.puts(queue).observe(time.perf_counter() - started, len(topics))
        return wire.T.TPutResult(firstID=wire.to_tid(first), count=len(topics))

    @served("producer", inline=True)
    def putMessage(self, queue: str, message: Any) -> Any:
        return wire.to_tid(self._put(queue, None, [message])[0])

    @served("producer", inline=True)
    def putMessages(self, queue: str, messages: list[Any]) -> list[Any]:
        return [wire.to_tid(i) for i in self._put(queue, None, messages)]

    @served("producer", inline=True)
    def putMessageWithPid(self, queue: str, partitionID: int, message: Any) -> Any:
        return wire.to_tid(self._put(queue, partitionID, [message])[0])

    @served("producer", inline=True)
    def putMessagesWithPid(self, queue: str, partitionID: int, messages: list[Any]) -> list[Any]:
        return [wire.to_tid(i) for i in self._put(queue, partitionID, messages)]

    @served("member", inline=True)
    def getQueueLocations(self, queue: str) -> list[str]:
        info = self.engine.queue_info(queue, fresh=True)
        return self.coordinator.locations(queue, info.partitions)

    # -- admin ---------------------------------------------------------------------

    @served("connected", None)
    def createQueue(self, info: Any) -> None:
        if info is None:
            raise TypeError("'info' is required")
        queue = wire.from_tinfo(info)
        self.guard.principal().require("admin", queue.name, "create")
        if queue.partitions > self.max_partitions:
            raise InvalidArgument(
                f"'partitions' must be at most {self.max_partitions} on this server, got {queue.partitions}"
            )
        self.engine.create_queue(queue)
        self.coordinator.queues_changed()

    @served("member")
    def describeQueue(self, queue: str) -> Any:
        description = self.engine.describe_queue(queue)
        estimate = description["message_count_estimate"]
        return wire.T.TQueueDescription(
            info=wire.to_tinfo(self.engine.queue_info(queue)),
            messageCountEstimate=-1 if estimate is None else estimate,
            lastIDs={pid: wire.to_tid(i) for pid, i in description["last_ids"].items() if i},
        )

    @served("member")
    def getQueue(self, queue: str) -> Any:
        return wire.to_tinfo(self.engine.queue_info(queue, fresh=True))

    @served("connected", None)
    def listQueues(self) -> list[Any]:
        principal = self.guard.principal()
        return [wire.to_tinfo(info) for info in self.engine.list_queues() if principal.may_see(info.name)]

    @served("admin")
    def truncateQueue(self, queue: str) -> None:
        self.engine.truncate_queue(queue)

    @served("admin")
    def disableQueue(self, queue: str) -> None:
        self.engine.set_state(queue, QueueState.DISABLED)

    @served("admin")
    def enableQueue(self, queue: str) -> None:
        self.engine.set_state(queue, QueueState.ENABLED)

    @served("admin")
    def dropQueue(self, queue: str) -> None:
        self.engine.delete_queue(queue)
        self.metrics.forget_queue(queue)
        self.coordinator.queues_changed()

    # -- timers (SPEC X1) -------------------------------------------------------------------

    @served("producer")
    def scheduleTimers(
        self,
        queue: str,
        partitionID: int,
        messages: bytes,
        dueMillis: int,
        dues: bytes | None = None,
        request: Any = None,
    ) -> Any:
        topics, values = self._unpack_put(messages)
        sent = wire.from_trequest(request)
        partition_id = self._writable_partition(queue, partitionID, sent, len(topics))
        due: int | list[int] = dueMillis
        if dues:  # (empty: unset, as a client that sends every argument sends it)
            due = packed.unpack_dues(dues, len(topics))
        elif not isinstance(dueMillis, int) or not 0 <= dueMillis < 2**63:
            raise InvalidArgument(f"'dueMillis' must be epoch ms >= 0, got {dueMillis!r}")
        started = time.perf_counter()
        batch = list(map(Message, topics, values))
        timers = self.engine.schedule(queue, batch, partition_id, due, sent)
        self.metrics.puts(queue).observe(time.perf_counter() - started, len(topics))
        return wire.T.TPutResult(firstID=wire.to_tid(timers[0].id), count=len(timers))

    @served("producer")
    def cancelTimer(self, queue: str, timer: Any) -> bool:
        handle = wire.from_ttimer(timer)
        self.coordinator.require_owner(queue, handle.partition_id)
        return self.engine.cancel_timer(queue, handle)

    # Pending timers are read from the store: any server of it answers (they hold messages: consumers'),
    # each answer bounded as a scan chunk is.

    @served("consumer")
    def pendingTimers(self, queue: str, partitionID: int, limit: int, after: Any = None) -> list[Any]:
        pid = check_partition(self.engine.queue_info(queue), partitionID)
        start = None if after is None else wire.from_ttimer(after)
        if start is not None and start.partition_id != pid:
            raise InvalidArgument(f"'after' is a timer of partition {start.partition_id}, not of {pid}")
        found = self.engine.pending_timers(queue, pid, check_pending_limit(limit), wire.STRUCT_REPLY_BYTES, start)
        return [wire.to_tpending(timer, message) for timer, message in found]

    @served("consumer")
    def countTimers(self, queue: str, partitionID: int, limit: int) -> int:
        pid = check_partition(self.engine.queue_info(queue), partitionID)
        return self.engine.count_timers(queue, pid, check_pending_limit(limit, MAX_PENDING + 1))

    @served("consumer")
    def nextTimer(self, queue: str, partitionID: int) -> int:
        due = self.engine.next_timer(queue, check_partition(self.engine.queue_info(queue), partitionID))
        return -1 if due is None else due

    @served("consumer")
    def findTimer(self, queue: str, timer: Any) -> list[Any]:
        handle = wire.from_ttimer(timer)
        message = self.engine.find_timer(queue, handle)
        return [] if message is None else [wire.to_tpending(handle, message)]


#: The pending-timer reads: each holds up to a chunk of timers' messages while it runs.
TIMER_READS = ("pendingTimers", "countTimers", "nextTimer", "findTimer")
#: The calls whose answer may be big (up to 10,000 messages): refused while the server's
#: in-flight budget is full (rpc/loop.py), so that peers that do not read cannot hold more.
BIG_ANSWERS = frozenset(
    {
        "messageScannerGet",
        "messageScannerGetList",
        "messageScannerGetPacked",
        "groupReceive",
        "groupAckReceive",
        *TIMER_READS,
    }
)
#: The bytes an answer may take (its reply's limit; the one message that passes it aside),
#: held from the budget while the call runs on a connection's thread. A group receive
#: gives them back while it waits for messages (rpc.connections.answer_slot_aside).
ANSWER_SLOTS = {
    **dict.fromkeys(["messageScannerGet", "messageScannerGetList"], wire.STRUCT_REPLY_BYTES),
    # a timer read holds a chunk of cells (a count's: TIMER_COUNT_BYTES and the one over it), or one message
    **dict.fromkeys(TIMER_READS, wire.STRUCT_REPLY_BYTES),
    "messageScannerGetPacked": wire.SCAN_REPLY_BYTES,
    **dict.fromkeys(["groupReceive", "groupAckReceive"], RECEIVE_BYTES),
}


class HQueueHandler(ThriftService):
    """Implements HQueueService: the queue calls here, group_calls.py and subscription_calls.py beside.

    Args:
        engine, coordinator, scanners: What the calls run on.
        auth: Tokens and roles; None: every client may do everything.
        push_policy: Where subscribers' messages may be pushed.
        max_partitions: The most partitions a queue created here may have.
        max_put_messages, max_put_bytes: The most messages, and bytes of
            topics and values, one put call may carry (a bigger put is
            refused whole, never split).
        metrics: The server's Prometheus series.
    """

    def __init__(
        self,
        engine: Engine,
        coordinator: Coordinator,
        scanners: ScannerRegistry,
        *,
        auth: AuthPolicy | None = None,
        push_policy: PushPolicy | None = None,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        max_put_messages: int = wire.MAX_PUT_BATCH,
        max_put_bytes: int = wire.MAX_PUT_BYTES,
        metrics: ServerMetrics | None = None,
    ) -> None:
        metrics = metrics or ServerMetrics()
        self.guard = CallGuard(auth)
        self.queues = QueueCalls(
            engine, coordinator, self.guard, metrics, scanners, max_partitions, max_put_messages, max_put_bytes
        )
        self.group_calls = GroupCalls(engine, coordinator, self.guard, metrics)
        self.subscription_calls = SubscriptionCalls(engine, coordinator, self.guard, metrics)
        self.subscription_calls.push_policy = push_policy or PushPolicy()
        super().__init__(self.queues, self.group_calls, self.subscription_calls)
