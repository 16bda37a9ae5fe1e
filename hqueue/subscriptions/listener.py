"""Push subscriptions, subscriber side (SPEC C7).

::

    class Printer(MessageListener):
        def on_messages(self, messages):      # raise to fail: redelivered later
            for m in messages:
                print(m.id, m.topic, m.value)

    queue = HQueue("orders", url="hqueue://127.0.0.1:9700")
    subscription = Subscription("printer", topics={"order"})
    subscriber = queue.create_subscriber(subscription, [Printer()])
    subscriber.start()
    ...
    subscriber.stop("deploy")

A subscriber serves ``HQueueSubscriberService.consumePacked`` (and ``consumeMessages``) on a Thrift
port of its own; servers push batches there, one worker per partition, and
each batch reaches the listeners in order. Batches of *different* partitions
may arrive concurrently, so listeners must be thread-safe; within a
partition, batches come one at a time, in MessageID order.

Delivery is at least once: a listener that raises makes the server send the
same batch again later (with backoff); after a crash, up to one checkpoint
interval (1 s) of messages per partition may come again.

Presence: the subscriber heartbeats a server every second (with ZooKeeper,
that server writes its presence there: the subscriber needs no ZooKeeper
access). A server older than this version names ZooKeeper instead
(``getCoordination``): then the subscriber creates its ephemeral presence
nodes there itself, with its own session.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..auth import PushCredentials, joined
from ..checks import check_name
from ..errors import HQueueError, InvalidArgument, SubscriberActive, SubscriberExists, SubscriberNotFound
from ..message import Message, MessageID, TimeLike, as_message_id, messages_from_columns, topic_filter
from .push import PushGuard, PushRefused, ephemeral_tls

if TYPE_CHECKING:  # Thrift and kazoo load when a subscriber starts, not with hqueue
    from ..api import SubscriptionsAPI
    from ..rpc.connections import ServerLimits
    from ..rpc.threaded import ThreadedServer
    from .zk_registry import ZooKeeperPresence

logger = logging.getLogger(__name__)


#: Status codes returned to the server by consumeMessages: processed; a listener
#: failed (counts toward dead_letter_after); stopping (try again later, never counts).
OK, FAILED, STOPPING = 0, 1, 2
#: The largest call of a connection to the push listener that has not proven the push key:
#: its challenge and its proof (a push of no messages) take a few hundred bytes. (64 KiB, the
#: token servers' bound, let 1,024 strangers' half-sent frames hold the whole budget.)
UNPROVEN_PUSH_BYTES = 4096
#: What a connection to the push listener does before it may send more.
PROVE_PUSH = "a server proves its push key first (pushChallenge, then a proven push of no messages)"


class ListenerStopped(Exception):
    """Raised by a listener its subscriber's stop ended (an async one, cancelled): the batch
    is not taken, and comes again, without counting as a failure."""


class MessageListener:
    """Receives batches of messages; subclass and override :meth:`on_messages`."""

    def on_messages(self, messages: list[Message]) -> None:
        """Process a batch. Raise to have the whole batch delivered again later."""
        raise NotImplementedError


class Subscription:
    """What a subscriber takes: a name, topics, partitions and where to start.

    Args:
        name: The subscriber's name on the queue (its checkpoints go by it).
        topics: Topics to take; none means all.
        dead_letter_after: How many times the subscriber may refuse a message
            (a listener raised) on its own before the server puts it on the queue
            ``<queue>.dlq`` (same partition, topic and value) and goes on. A
            batch refused that many times is retried message by message, so only
            the poison message goes. A subscriber that cannot be reached never
            counts. None (the default): retry forever, in order.
    """

    def __init__(
        self, name: str, topics: Iterable[str | bytes] | None = None, *, dead_letter_after: int | None = None
    ) -> None:
        check_name("subscriber", name)
        if isinstance(topics, (str, bytes)):
            raise TypeError("'topics' must be a collection of topics, not one topic")
        if topics is not None and not isinstance(topics, Iterable):
            raise TypeError(f"'topics' must be a collection of topics, not {type(topics).__name__}")
        self.name = name
        self.topics: set[bytes] | None = {topic_filter(t) for t in topics} if topics else None
        self.partitions: dict[int, MessageID | None] | None = None
        if dead_letter_after is not None and (
            not isinstance(dead_letter_after, int) or isinstance(dead_letter_after, bool) or dead_letter_after < 1
        ):
            raise InvalidArgument(f"'dead_letter_after' must be an int >= 1 or None, got {dead_letter_after!r}")
        self.dead_letter_after = dead_letter_after

    def add_topic(self, topic: str | bytes) -> Subscription:
        self.topics = (self.topics or set()) | {topic_filter(topic)}
        return self

    def add_partitions(self, partitions: Iterable[int | tuple[int, TimeLike]] | Mapping[int, TimeLike]) -> Subscription:
        """Take these partitions, each from a start (a MessageID, datetime or epoch ms) or (None)
        its checkpoint: ``{pid: start}``, ``(pid, start)`` pairs, or partition ids (each from
        None), as ``add_subscriber`` takes.

        None means: from the subscriber's checkpoint, or from now for a new
        subscriber. Without any partitions added, it takes all of them.
        """
        if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Iterable):
            raise TypeError(f"'partitions' must be partition ids or {{pid: start}}, not {type(partitions).__name__}")
        items = partitions.items() if isinstance(partitions, Mapping) else partitions
        for item in items:
            if isinstance(item, tuple) and len(item) == 2:
                pid, start = item
            elif isinstance(item, int):
                pid, start = item, None
            else:
                raise TypeError(f"a partition must be an id or a (pid, start) pair, got {item!r}")
            if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
                raise InvalidArgument(f"a partition id must be an int >= 0, got {pid!r}")
            self.partitions = {**(self.partitions or {}), pid: as_message_id(start, "partitions")}
        return self


class SubscriberState:
    NEW = "NEW"
    STARTED = "STARTED"
    STOPPED = "STOPPED"


class _ConsumeHandler:
    def __init__(self, subscriber: Subscriber, guard: PushGuard) -> None:
        from ..rpc.connections import RateLimitedLog

        self.subscriber, self.guard = subscriber, guard
        self.refusals = RateLimitedLog(log=logger)  # a flood of forged pushes writes a line per 10 s

    def pushChallenge(self) -> bytes:
        from ..rpc.connections import current_connection

        connection = current_connection()
        if connection is None:
            raise RuntimeError("pushChallenge outside a connection")
        return self.guard.challenge(connection)

    def consumeMessages(self, messages: list[Any], proof: Any = None) -> int:
        from ..rpc import wire
        from ..rpc.connections import current_connection

        with self._refusing():
            self.guard.check(current_connection(), messages or [], proof)
        if not messages:  # the server proved the key
            return OK
        return self._deliver(lambda: [wire.from_stored_tmessage(t) for t in messages], len(messages))

    def consumePacked(self, messages: bytes, proof: Any = None) -> int:
        """consumeMessages, the batch as one packed blob (the server's first choice)."""
        from ..rpc.connections import current_connection

        with self._refusing():
            keys, values = self.guard.check_packed(current_connection(), messages, proof)
        if not keys:  # the server proved the key: the connection may send big pushes now
            return OK
        return self._deliver(lambda: messages_from_columns(keys, values), len(keys))

    @contextlib.contextmanager
    def _refusing(self) -> Iterator[None]:
        """A push the guard refuses never reaches a listener: TPushRefused, logged."""
        from ..rpc import wire

        try:
            yield
        except PushRefused as e:
            self.refusals.warning("refused", "subscriber %s refused a push: %s", self.subscriber.name, e)
            raise wire.T.TPushRefused(message=str(e)) from None

    def _deliver(self, batch: Callable[[], list[Message]], count: int) -> int:
        """Hand a proven push's messages (``batch()`` makes them) to the listeners; the status."""
        if not self.subscriber.started:
            # Stopped: connections opened before stop() may still deliver; refuse,
            # so the batch stays undelivered and comes to the next instance.
            return STOPPING
        try:
            messages = batch()
            for listener in self.subscriber.listeners:
                listener.on_messages(messages)
        except ListenerStopped:  # an async listener ended by the stop: no failure
            return STOPPING
        except Exception:  # one bad batch never kills the subscriber: it comes again
            logger.warning("%s: a listener failed on %d message(s)", self.subscriber.name, count, exc_info=True)
            return FAILED
        self.subscriber.received += count
        return OK


class Subscriber:
    """A running subscription; made by :meth:`HQueue.create_subscriber`."""

    #: The push listener's connection limits (None: ServerLimits' defaults, 1,024 connections).
    limits: ServerLimits | None = None

    def __init__(
        self,
        service: SubscriptionsAPI,
        queue: str,
        subscription: Subscription,
        listeners: Sequence[MessageListener],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        takeover_timeout: float = 15.0,
        partitions: int,
        tls: bool = False,
        zk_auth: str | None = None,
    ) -> None:
        if not listeners or not all(isinstance(listener, MessageListener) for listener in listeners):
            raise TypeError("'listeners' must be a non-empty sequence of MessageListener")
        self.service, self.queue, self.subscription = service, queue, subscription
        self.name, self.listeners = subscription.name, list(listeners)
        self.host, self.port, self.advertise = host, port, advertise
        self.takeover_timeout = takeover_timeout
        self.partition_ids = sorted(subscription.partitions) if subscription.partitions else range(partitions)
        self._partitions = partitions
        self.tls = tls
        self.zk_auth = zk_auth
        #: This run's push key (and certificate fingerprint), made by start().
        self.credentials: PushCredentials | None = None
        self.guard: PushGuard | None = None
        self.state = SubscriberState.NEW
        self.received = 0
        self._server: ThreadedServer | None = None
        self._presence: ZooKeeperPresence | None = None
        self._stop_heartbeat = threading.Event()

    @property
    def started(self) -> bool:
        return self.state == SubscriberState.STARTED

    @property
    def address(self) -> str:
        return self.advertise or joined(self.host, self.port)

    def start(self) -> Subscriber:
        """Listen, register (or resume the registration) and announce presence."""
        if self.started:
            return self
        self.state = SubscriberState.STARTED  # before the port opens: batches may come at once
        from ..rpc import wire
        from ..rpc.connections import ListeningSocket
        from ..rpc.threaded import ThreadedServer

        context, certificate = ephemeral_tls() if self.tls else (None, None)
        push = self.credentials = PushCredentials.new(certificate)
        # Any partition of the queue: the registration says which are pushed, and an admin may
        # widen it while this runs (add_subscriber); a proof covers the partition, so only a
        # server holding this run's key can push one (the subscription's partitions alone
        # refused the widened ones for ever, the others' pushes slowed by each refusal).
        self.guard = PushGuard(push, self.queue, self.name, range(self._partitions))
        socket = ListeningSocket.bound(self.host, self.port)
        self.port = socket.bound_port
        self._server = ThreadedServer(
            wire.T.HQueueSubscriberService, _ConsumeHandler(self, self.guard), socket, ssl_context=context,
            limits=self.limits,
            # Only a connection that pushed with a valid proof (a server) keeps its place when all
            # are taken, and sends calls over 4 KiB (a stranger's big frames, sent slowly, held
            # the budget: pushes stalled).
            trusted_after=lambda connection: connection.push is not None and connection.push.sequence > 0,
            unproven_bytes=UNPROVEN_PUSH_BYTES, prove_how=PROVE_PUSH,
            refuse_with=lambda method, error: wire.T.TPushRefused(message=f"{type(error).__name__}: {error}"),
        )  # fmt: skip
        self._server.serve_in_thread(f"hqueue-subscriber-{self.name}")
        try:
            topics = frozenset(self.subscription.topics) if self.subscription.topics else None

            def register(create_only: bool = False) -> None:
                self.service.add(
                    self.queue, self.name, topics, self.subscription.partitions, self.subscription.dead_letter_after,
                    create_only,
                )  # fmt: skip

            coordination = self.service.coordination(self.queue)
            if not coordination.startswith("zk:"):
                # Present first, then registered: a second instance refused (SubscriberActive)
                # must change nothing of the live one's registration (its partitions, starts and
                # dead-letter limit replaced the live one's). One not registered yet is first.
                heartbeat = functools.partial(self.service.heartbeat, self.queue, self.name, self.address, topics, push)
                # Not registered yet: made only if no other instance made it meanwhile (two new
                # instances at once both registered, the second's partitions, topics and
                # dead-letter limit over the first's, and the second was then refused as active).
                try:
                    self._take_over(heartbeat)
                except SubscriberNotFound:
                    try:
                        register(create_only=True)
                        made = True
                    except SubscriberExists:  # another made it: present first, as for any registered one
                        made = False
                    self._take_over(heartbeat)  # (SubscriberActive: the other runs; nothing changed)
                else:
                    made = False
                if not made:
                    try:
                        register()
                    except BaseException:  # (refused: its presence goes at once, not in 3 s)
                        with contextlib.suppress(HQueueError):
                            self.service.leave(self.queue, self.name, push)
                        raise
                self._stop_heartbeat.clear()
                threading.Thread(target=self._heartbeat, args=(topics,), daemon=True).start()
            else:  # (a server older than this version: registered first, as it expects)
                register()
                from ..coordination.zookeeper import AUTH_ENV
                from .zk_registry import ZooKeeperPresence

                # The server checks the address (as for a heartbeat) and records it: servers
                # push only to addresses announced through one of them.
                self.service.approve(self.queue, self.name, self.address, push)
                auth = self.zk_auth or os.environ.get(AUTH_ENV)
                self._presence = ZooKeeperPresence(
                    coordination[3:], self.queue, self.name, self.address, topics, push, auth
                )
                self._take_over(self._presence.start)
        except BaseException:
            self.state = SubscriberState.STOPPED
            self._server.close()
            raise
        logger.info("subscriber %s on %s listening at %s (%s)", self.name, self.queue, self.address, coordination)
        return self

    def _take_over(self, announce: Callable[[], None]) -> None:
        """Announce, waiting up to ``takeover_timeout`` while an earlier instance's presence lapses.

        A live instance of the same subscriber keeps its place: after the
        wait this one gives up with SubscriberActive. One that crashed is
        taken over once its presence expires (3 s of missed heartbeats
        without ZooKeeper, 10 s with it).
        """
        deadline = time.monotonic() + self.takeover_timeout
        while True:
            try:
                return announce()
            except SubscriberActive:
                if time.monotonic() >= deadline:
                    if self._presence is not None:
                        self._presence.stop()
                        self._presence = None
                    raise
            time.sleep(0.25)

    def _heartbeat(self, topics: frozenset[bytes] | None) -> None:
        assert self.credentials is not None
        while not self._stop_heartbeat.wait(1.0):
            try:
                self.service.heartbeat(self.queue, self.name, self.address, topics, self.credentials)
            except HQueueError:
                logger.warning("%s: heartbeat failed; retrying", self.name, exc_info=True)

    def stop(self, reason: str = "") -> None:
        """Leave (the registration and its checkpoints stay) and stop listening."""
        if not self.started:
            return
        logger.info("subscriber %s on %s stopping: %s", self.name, self.queue, reason or "stop()")
        self.state = SubscriberState.STOPPED
        if self._presence is not None:
            self._presence.stop()
        else:
            self._stop_heartbeat.set()
            try:
                self.service.leave(self.queue, self.name, self.credentials)
            except HQueueError:
                logger.warning("%s: could not tell the server it leaves", self.name, exc_info=True)
        if self._server is not None:
            self._server.close()

    def __enter__(self) -> Subscriber:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop("context exit")
