"""The hqueue server: Thrift over framed transport, binary protocol.

``HQueueServer`` wires an engine (storage + ID assignment), a coordinator
(partition ownership: local, or ZooKeeper) and the Thrift handler, and
serves them (rpc/loop.py: one event loop over the plain connections, whose
quick calls run on it, everything that waits on worker threads; or with
``io="threads"``, rpc/threaded.py: a thread per connection).

Shutdown (SIGTERM, SIGINT or :meth:`stop`): stop accepting connections;
refuse new puts with TNotPartitionOwner so clients move on; wait for calls
under way (every acknowledged put is already durable per its queue's
durability); give up partitions (ZooKeeper ephemeral nodes go at once, so
others take over without waiting for a session timeout); close the store.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import sharing
from ..admin import HQueueAdmin
from ..auth import AuthPolicy, MetricsAccess, PushPolicy, is_loopback, is_wildcard, joined
from ..coordination import Coordinator, LocalCoordinator
from ..coordination.zookeeper import ZooKeeperCoordinator
from ..engine import Engine
from ..errors import InvalidArgument
from ..groups.limits import GroupLimits
from ..groups.service import GroupService
from ..lag import LagBook
from ..metrics import ServerMetrics
from ..rpc import wire
from ..rpc.connections import Connection, ListeningSocket, ServerLimits, each_connection
from ..rpc.loop import LoopServer
from ..rpc.threaded import UNPROVEN_FRAME_BYTES, ThreadedServer
from ..services import serve_partitions, stop_serving
from ..subscriptions.loops import DEFAULT_PUSH_THREADS
from ..subscriptions.manager import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CHECKPOINT_MESSAGES,
    DEFAULT_MAX_SUBSCRIBERS,
    SubscriptionManager,
)
from ..subscriptions.registry import SubscriberRegistry
from ..subscriptions.service import Subscribers
from ..subscriptions.store_registry import StoreRegistry
from ..subscriptions.zk_registry import ZooKeeperRegistry
from .calls import thrift_error
from .gauges import server_gauges
from .handler import ANSWER_SLOTS, BIG_ANSWERS, DEFAULT_MAX_PARTITIONS, HQueueHandler
from .scanners import DEFAULT_IDLE_TIMEOUT, ScannerRegistry

if TYPE_CHECKING:
    from ..console import Console

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9700
#: How connections are served (``--io``): one event loop, or a thread each.
IO_MODELS = ("loop", "threads")
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_freed_memory() -> None:
    """Have this process give big freed buffers back to the system at once
    (``hqueue server`` calls it; a library should not change its host's malloc).

    glibc raises its mmap threshold each time it frees a big buffer (up to
    32 MiB), so later buffers of that size come from the heap of the
    calling thread's arena, and stay with the process once freed: after a
    few 16 MiB puts on different connections, hundreds of MB stayed held. A
    fixed threshold of 1 MiB gives each buffer that large its own mapping,
    unmapped when it is freed. Elsewhere than glibc this does nothing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 1 << 20)


#: Whose share the connections that have not authenticated count in, all together.
UNAUTHENTICATED = "connections not authenticated"


def _principal(connection: Connection) -> str:
    """Whose share of the in-flight budget a connection's calls and replies count in, with
    tokens: the principal it authenticated as (one token's clients share it wherever they
    connect from); a Unix socket's, which needs none, its own; and every connection that has
    not authenticated yet, one share for them all (each its own, 1,020 connections sending
    64 KiB calls a byte at a time held the whole budget)."""
    if connection.principal is not None:
        return f"principal {connection.principal.name}"
    return each_connection(connection) if connection.local else UNAUTHENTICATED


def _warn_if_puts_cannot_fit(limits: ServerLimits, max_put_messages: int, max_put_bytes: int) -> None:
    """Say so when a put at the put limits would not fit in a frame (clients then split smaller)."""
    needed = wire.put_frame_bytes(max_put_messages, max_put_bytes)
    if needed > limits.max_frame_bytes:
        logger.warning(
            "--max-frame-bytes %d is under the %d bytes a put of --max-put-messages %d and --max-put-bytes %d "
            "can take: raise it",
            limits.max_frame_bytes,
            needed,
            max_put_messages,
            max_put_bytes,
        )


def _foreign_owner(path: str) -> int | None:
    """A user other than this process's (or root) owning ``path`` (the store's, made absolute,
    links not followed) or a directory above it: one who may swap the store for another (as ssh checks a key's
    directories); None if none."""
    at = os.path.abspath(path)
    while True:
        try:
            uid = os.lstat(at).st_uid
        except OSError:
            return None
        if uid not in (os.geteuid(), 0):
            return uid
        parent = os.path.dirname(at)
        if parent == at:
            return None
        at = parent


def _warn_if_others_may_read(path: str | None) -> None:
    """Say so when every local user may read an embedded store's files (a directory made by
    hand keeps its mode), or when another user owns its directory (one made for this server
    by someone else): tokens keep roles apart over TCP, not in the files."""
    if path is None:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    owner = _foreign_owner(path)
    if owner is not None:
        logger.warning(
            "the store %s (or a directory above it) belongs to user %d, not to this server's "
            "(%d): that user may read and change every message in its files, whatever the tokens, and replace "
            "its socket; keep a store in a directory this user owns (docs/security.md)",
            path,
            owner,
            os.geteuid(),
        )
    if mode & 0o005:
        logger.warning(
            "the store %s is open to every local user (mode %o): they may read every message in its files, "
            "whatever their tokens; chmod o-rwx it (docs/security.md)",
            path,
            mode & 0o777,
        )


def _check_arguments(storage_url: str, host: str, advertise: str | None, coordinator_factory: object, io: str) -> None:
    """InvalidArgument for a server that could not serve as asked, before anything is opened."""
    if io not in IO_MODELS:
        raise InvalidArgument(f"'io' must be one of {', '.join(IO_MODELS)}, got {io!r}")
    if coordinator_factory is not None and not storage_url.startswith("hbase://"):
        raise InvalidArgument(
            f"ZooKeeper coordination needs a store every server shares (hbase://), not {storage_url!r}: "
            "servers with separate local stores would each answer differently"
        )
    if coordinator_factory is not None and advertise is None and is_wildcard(host):
        raise InvalidArgument(
            f"a server listening on every interface ({host}) in a cluster needs the address clients "
            "and other servers reach it at: pass advertise (--advertise host:port)"
        )


class HQueueServer:
    """One hqueue server.

    Args:
        storage_url: ``local:///path`` or ``hbase://…``.
        host, port: Where to listen; port 0 picks a free one.
        advertise: ``host:port`` clients should use (default: host:port).
        coordinator: Partition ownership; default: this server owns all.
        idle_timeout: Seconds after which an unused remote scanner is closed.
        auth: Tokens and roles (``--auth-file``); None: every client may do everything.
        push_policy: Where subscribers' messages may be pushed.
        limits: Connections, frame sizes, timeouts, and the memory of the calls under way.
        ssl_context: Serve TLS with this server-side context.
        max_partitions: The most partitions a queue created here may have.
        max_put_messages, max_put_bytes: The most messages, and bytes of
            topics and values, one put call may carry (``--max-put-messages``,
            ``--max-put-bytes``; a bigger put is refused whole, never split).
        metrics_port: Serve Prometheus metrics on this port (0: a free one; None: not at all).
        push_threads: Threads that push to subscribers, all of them together.
        max_subscribers: The most subscribers this server pushes to (the rest wait).
        checkpoint_messages: A push checkpoint is saved after at most this many messages
            delivered since the last save (per subscriber and partition): after a crash,
            at most that many come again.
        checkpoint_interval: ... or after this many seconds, whichever first (a target:
            on a loaded machine the count is what holds).
        group_limits: What one consumer-group member may take (the longest
            lease, messages held at once; ``--max-lease``, ``--max-member-in-flight``)
            and how many groups a queue may have (``--max-groups``).
        metrics_host: Where metrics listen (loopback unless told).
        metrics_token: A bearer token that may read metrics (the auth file's tokens
            with the metrics role may too). With neither a token nor ``auth``,
            anyone who reaches ``metrics_host`` may read them.
        unix_socket: Listen on this Unix socket instead of ``host:port``, its file made
            with ``unix_socket_access``'s mode and group (None: this process's); the file
            is removed when the server stops.
        local_socket: For a ``local://`` store this server opens, also serve it to the
            processes of this machine on the store's socket (``hqueue.sock`` in its
            directory), as any process that opens the store does: another process
            opening ``local://`` the same directory is then this server's client
            (hqueue/sharing.py). Connections there need no token, even with ``auth``:
            the socket file's permissions (the directory's owner, and its group where
            it may write there) decide who may connect, as they decide who may reach
            the store's files.
        engine: Serve this engine, which the caller acquired and releases (the
            store a process shares with local processes: server/shared.py),
            instead of acquiring ``storage_url``'s.
        console_port: Serve the web console (docs/console.md) on this port (0: a free
            one; None: not at all), with ``auth``'s tokens, or a one-time token
            (:attr:`console`'s ``login_token``) without them.
        console_host: Where the console listens (loopback unless told).
        console_trusted_proxy: The address of a TLS proxy in front of the console whose
            ``X-Forwarded-*`` headers count (as ``hqueue console --trusted-proxy``).
        io: ``"loop"``: plain TCP and Unix connections are served from one event loop,
            whose quick calls run on it when the store is in this process
            (rpc/loop.py; TLS connections keep a thread each); ``"threads"``: a thread
            per connection (``--io``).
    """

    def __init__(
        self,
        storage_url: str,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        advertise: str | None = None,
        coordinator_factory=None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        auth: AuthPolicy | None = None,
        push_policy: PushPolicy | None = None,
        limits: ServerLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        max_put_messages: int = wire.MAX_PUT_BATCH,
        max_put_bytes: int = wire.MAX_PUT_BYTES,
        metrics_port: int | None = None,
        push_threads: int = DEFAULT_PUSH_THREADS,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
        checkpoint_messages: int = DEFAULT_CHECKPOINT_MESSAGES,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        group_limits: GroupLimits | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_token: str | None = None,
        unix_socket: str | None = None,
        unix_socket_access: tuple[int, int | None] = (0o600, None),
        local_socket: bool = True,
        engine: Engine | None = None,
        console_port: int | None = None,
        console_host: str = "127.0.0.1",
        console_trusted_proxy: str | None = None,
        io: str = "loop",
    ) -> None:
        _check_arguments(storage_url, host, advertise, coordinator_factory, io)
        # What is opened here is closed again, in reverse, if a later step fails.
        with contextlib.ExitStack() as undo:
            if unix_socket is not None:
                socket = ListeningSocket.bound_unix(unix_socket, *unix_socket_access)
            else:
                socket = ListeningSocket.bound(host, port)  # before the store: a taken port fails first
            undo.callback(socket.close)
            self._owns_engine = engine is None
            if engine is None:  # (a process that opens the store meanwhile waits for its socket)
                with sharing.starting(storage_url) if local_socket else contextlib.nullcontext():
                    engine = Engine.acquire(storage_url)
            self.engine = engine
            if self._owns_engine:
                undo.callback(self.engine.release)
            #: The store's Unix socket this server serves it on to local processes (None: not served here).
            self.local_socket: str | None = None
            local = self._listen_locally() if local_socket and self._owns_engine else None
            if local is not None:
                undo.callback(self._drop_local_socket)
                undo.callback(local.close)
            self.port = socket.bound_port
            self.address = advertise or (f"unix:{unix_socket}" if unix_socket else joined(host, self.port))
            self.coordinator: Coordinator = (coordinator_factory or LocalCoordinator)(self.address)
            self.metrics = ServerMetrics()
            self.coordinator.add_listener(self._count_partition_changes)
            self.metrics_port: int | None = None
            #: Lag kept as things move, for metrics (None without them).
            self.lag: LagBook | None = None
            self.scanners = ScannerRegistry(idle_timeout)
            self.push_policy = push_policy or PushPolicy()
            self.handler = HQueueHandler(
                self.engine,
                self.coordinator,
                self.scanners,
                auth=auth,
                push_policy=self.push_policy,
                max_partitions=max_partitions,
                max_put_messages=max_put_messages,
                max_put_bytes=max_put_bytes,
                metrics=self.metrics,
            )
            self.handler.subscription_calls.tls = self._tls = ssl_context is not None
            self._push_threads, self._max_subscribers = push_threads, max_subscribers
            self._checkpoint_messages, self._checkpoint_interval = checkpoint_messages, checkpoint_interval
            self.subscriptions: SubscriptionManager | None = None
            self.groups: GroupService | None = None
            self.group_limits = group_limits
            self._server = self._connections(io, socket, local, limits, ssl_context, auth)
            _warn_if_puts_cannot_fit(self._server.limits, max_put_messages, max_put_bytes)
            if auth is not None:
                _warn_if_others_may_read(getattr(self.engine.storage, "path", None))
            if metrics_port is not None:  # here, so a taken port fails before anything starts
                self._serve_metrics(metrics_port, metrics_host, MetricsAccess(metrics_token, auth))
                undo.callback(self.metrics.close)
            #: The web console (None without ``console_port``): its port is bound here, so that a
            #: taken one fails first; it opens its admin handle at start, once services are attached.
            self.console: Console | None = None
            if console_port is not None:
                self.console = self._console(console_host, console_port, auth, console_trusted_proxy)
            undo.pop_all()  # all is open: stop() closes it from now on
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def _connections(
        self,
        io: str,
        socket: ListeningSocket,
        local: ListeningSocket | None,
        limits: ServerLimits | None,
        ssl_context: ssl.SSLContext | None,
        auth: AuthPolicy | None,
    ) -> ThreadedServer:
        """What serves the Thrift connections (``io``: one event loop, or a thread each)."""
        # With tokens, a connection that has not authenticated may be closed to make room.
        trusted_after = None if auth is None else (lambda c: c.principal is not None or c.local)
        # With tokens, a client's share of the in-flight budget is its principal's (else its connection's).
        owner_of = None if auth is None else _principal
        # Quick calls run on the event loop only when the store answers without a network round trip.
        inline = self._inline if self.engine.storage.in_process else None
        server = (
            functools.partial(LoopServer, inline=inline, syncs=self.engine.storage) if io == "loop" else ThreadedServer
        )
        return server(
            wire.T.HQueueService, self.handler, socket, limits=limits, ssl_context=ssl_context,
            refuse_with=thrift_error, also=local, trusted_after=trusted_after, big_answers=BIG_ANSWERS,
            answer_slots=ANSWER_SLOTS, owner_of=owner_of,
            unproven_bytes=None if auth is None else UNPROVEN_FRAME_BYTES,
        )  # fmt: skip

    def _inline(self, method: str) -> bool:
        """Whether ``method``'s handler may run on the event loop (``served(inline=True)``)."""
        return getattr(getattr(self.handler, method, None), "inline", False)

    def _listen_locally(self) -> ListeningSocket | None:
        """The store's Unix socket, listening, if this server is to serve it to local processes."""
        path = sharing.claim_socket(self.engine, self)
        if path is None:  # not local://, or served in this process already
            return None
        try:
            listener = ListeningSocket.bound_unix(path, *sharing.socket_access(os.path.dirname(path)))
        except BaseException:
            sharing.drop_socket(self.engine, self)
            raise
        self.local_socket = path
        return listener

    def _drop_local_socket(self, reshare: bool = False) -> None:
        if self.local_socket is not None:
            self.local_socket = None
            sharing.drop_socket(self.engine, self, reshare)

    def _serve_metrics(self, port: int, host: str, access: MetricsAccess) -> None:
        if access.open and not is_loopback(host):
            logger.warning("metrics on %s need no credential: give --metrics-token, or keep them on 127.0.0.1", host)
        self.lag = book = LagBook(self.engine)
        self.coordinator.add_listener(lambda gained, lost: book.forget(gained | lost))
        self.metrics.watch(server_gauges(self, book))
        self.metrics_port = self.metrics.serve(port, host, None if access.open else self._scrape_allowed(access))

    def _scrape_allowed(self, access: MetricsAccess) -> Callable[[str | None, str], int]:
        """Whether a scrape's bearer token may read (200; 401; 403, a right token without the
        metrics role, not a guess), wrong ones counted as log-ins on the Thrift
        port are, per host (it answered 700 guesses a second). A host past its free wrong
        tokens is answered 429 at once, unread, for as long as the Thrift port would hold
        its answer: nothing waits in the endpoint's few threads (guesses sleeping there kept
        the right scrape out), and guessing goes no faster than there."""
        logins = self.handler.queues.failed_logins
        held: OrderedDict[str, float] = OrderedDict()  # host -> until when it is answered 429
        lock = threading.Lock()

        def allowed(authorization: str | None, host: str) -> int:
            now = time.monotonic()
            with lock:
                if held.get(host, 0.0) > now:
                    return 429
            verdict = access.allows(authorization)
            if verdict != 401:
                return verdict
            if authorization:  # a token, and a wrong one
                delay, _ = logins.failed(Connection(0, (host, 0)))
                if delay:
                    with lock:
                        held[host] = now + delay
                        held.move_to_end(host)
                        while len(held) > logins.max_hosts:
                            held.popitem(last=False)
            return 401

        return allowed

    @property
    def connections(self) -> int:
        """Open client connections."""
        return self._server.connections

    @property
    def inflight_bytes(self) -> int:
        """Bytes of request frames under way and replies not yet taken (the ``--max-inflight-bytes`` budget)."""
        return self._server.budget.used

    def start(self) -> HQueueServer:
        """Join the coordinator and serve in a background thread."""
        # Timers and consumer groups follow ownership: attach them before ownership is given out.
        self.groups = self.handler.group_calls.service = serve_partitions(
            self.engine, self.coordinator, self.group_limits
        )
        self.metrics.groups_now = self.groups.held
        self.coordinator.start(lambda: [(q.name, q.partitions) for q in self.engine.list_queues()])
        registry = self._registry()
        self.engine.subscriptions = self.handler.subscription_calls.service = Subscribers(self.engine, registry)
        self.subscriptions = SubscriptionManager(
            self.engine,
            self.coordinator,
            registry,
            push_policy=self.push_policy,
            metrics=self.metrics,
            require_tls=self._tls,
            push_threads=self._push_threads,
            max_subscribers=self._max_subscribers,
            checkpoint_messages=self._checkpoint_messages,
            checkpoint_interval=self._checkpoint_interval,
        )
        self.subscriptions.start()
        if self.lag is not None:
            self.lag.on_refresh(self.groups.load_all)
            self.lag.start()
        self._thread = self._server.serve_in_thread("hqueue-accept")
        if self.console is not None:
            admin = HQueueAdmin(self.engine.url)  # this process's engine: the handle shares it
            try:
                self.console.start(admin)
            except BaseException:
                admin.close()
                raise
        logger.info("hqueue server %s serving %s", self.address, self.engine.storage.url)
        if self.local_socket is not None:
            logger.info("serving it to local processes on %s too (local:// that directory)", self.local_socket)
        return self

    def _console(self, host: str, port: int, auth: AuthPolicy | None, trusted_proxy: str | None) -> Console:
        # Imported here: Flask and waitress take about 0.1 s to import, which a server without
        # a console, and every local process serving its embedded store (server/shared.py), skip.
        from ..console import Console, server_counters

        if not is_loopback(host) and trusted_proxy is None:
            logger.warning("the console on %s speaks plain HTTP: put a TLS proxy in front of it", host)
        return Console(
            auth=auth,
            counters=server_counters(self.metrics, lambda: self.connections),
            locations=self.coordinator.locations,
            host=host,
            port=port,
            trusted_proxy=trusted_proxy,
        )

    def _registry(self) -> SubscriberRegistry:
        """Registrations in ZooKeeper with the coordinator's session, else in the store."""
        if isinstance(self.coordinator, ZooKeeperCoordinator):
            return ZooKeeperRegistry(self.coordinator.client, self.coordinator.hosts)
        return StoreRegistry(self.engine.storage)

    def _count_partition_changes(self, gained: set, lost: set) -> None:
        self.metrics.partition_changes.labels("gained").inc(len(gained))
        self.metrics.partition_changes.labels("lost").inc(len(lost))

    def serve_forever(self, on_start: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then shut down cleanly (``on_start``: called once serving)."""
        signalled = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Only a flag: the handler runs inside whatever the main thread is
            # doing, and setting an Event it waits on deadlocks on the Event's lock.
            signal.signal(sig, lambda number, frame: signalled.append(number))
        self.start()
        if on_start is not None:
            on_start()
        while not signalled and not self._stopped.is_set():
            time.sleep(0.2)
        self.stop()

    def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, drain calls under way, leave, close the store."""
        self._stopped.set()
        if self.console is not None:
            self.console.stop()
            if self.console.admin is not None:
                self.console.admin.close()
        self.handler.guard.draining = True
        if self.groups is not None:  # (members whose connections the stop closes are not gone: nothing failed)
            self.groups.draining = True
        self._server.close()
        deadline = time.monotonic() + grace
        while self.handler.guard.active and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.handler.guard.active:
            logger.warning("%d call(s) still running after %gs; closing anyway", self.handler.guard.active, grace)
        while self._server.connections and time.monotonic() < deadline:
            time.sleep(0.01)  # connections ending free what they hold (a member's leases) before the store closes
        if self.lag is not None:
            self.lag.stop()
        if self.subscriptions:
            self.subscriptions.stop()  # saves every checkpoint
        stop_serving(self.engine)  # the timers and groups of this server's coordinator
        self.coordinator.stop()
        self.scanners.stop()
        self.metrics.close()
        # An HQueue of this process still on the store: it serves the store to local processes on.
        self._drop_local_socket(reshare=self.engine._refs > 1)
        if self._owns_engine:
            self.engine.release()
        logger.info("hqueue server %s stopped", self.address)
