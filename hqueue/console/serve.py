"""The console's HTTP server: the Flask application (app.py) served by waitress.

Waitress bounds what any client may cost: a few threads answer
(:data:`THREADS`), at most :data:`CONNECTION_LIMIT` connections are open at
once (and :data:`CONNECTIONS_PER_HOST` from one address, here; when either is
taken, a new one closes the connection waiting longest with no request being
answered, as the Thrift port closes unproven ones: idle connections from a
few addresses kept every user out until they timed out, and half-sent ones
from the user's own address kept the user out), a request
must arrive whole within :data:`REQUEST_DEADLINE` seconds of its first
byte (here), a connection silent for :data:`CHANNEL_TIMEOUT` seconds is closed
(a slow client holds no thread: waitress reads a request whole before a
thread takes it), and a request body over :data:`MAX_BODY` bytes is refused
(413) without being kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from flask import request
from flask.sessions import SecureCookieSessionInterface
from waitress.channel import HTTPChannel
from waitress.server import create_server

from .. import forks
from ..admin import HQueueAdmin
from ..auth import AuthPolicy
from ..rpc.connections import RateLimitedLog
from .access import Access
from .actions import DryRuns
from .app import create_app
from .audit import AuditLog
from .series import INTERVAL, Counters, Sampler

logger = logging.getLogger(__name__)

THREADS = 4
CONNECTION_LIMIT = 100
#: Connections one client address may hold (not the trusted proxy's: it speaks for many).
CONNECTIONS_PER_HOST = 20
CHANNEL_TIMEOUT = 30
#: Connections past CONNECTION_LIMIT waitress accepts, each of which closes one (the
#: longest waiting) to make room: at most this many are being closed at once.
EVICTING = 16
#: Seconds a request (its head and body) may take to arrive once begun: a client that
#: sends a byte now and then is never idle, and held its connections for ever.
REQUEST_DEADLINE = 10.0
MAX_BODY = 64 * 1024
#: Seconds a group's description is reused (under the 5 s sample), and how many are kept.
DESCRIBE_FOR = 4.0
DESCRIBED_KEPT = 100
#: Seconds an older description is shown while another request counts the group again.
DESCRIBED_STALE = 120.0


class _SessionCookies(SecureCookieSessionInterface):
    """Flask's signed cookie, marked Secure whenever the request came over HTTPS (a TLS proxy
    in front: ``X-Forwarded-Proto`` from ``--trusted-proxy``, ``--console-trusted-proxy``)."""

    def get_cookie_secure(self, app: Any) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"] or request.is_secure)


class Console:
    """The web console over ``admin``'s store.

    Args:
        admin: The handle every page reads through (the calls the CLI makes); or
            None, and given to :meth:`start`.
        auth: The auth file's tokens (the Thrift port's); None: a one-time token,
            :attr:`login_token`, logs in as admin.
        counters: What the charts sample (a server's metrics counters).
        locations: Who serves each partition of a queue (``(queue, partitions)``
            -> one address per partition, "" for this process).
        host, port: Where to listen (port 0: a free one).
        trusted_proxy: The address of a TLS proxy whose ``X-Forwarded-*`` headers count.
    """

    def __init__(
        self,
        admin: HQueueAdmin | None = None,
        *,
        auth: AuthPolicy | None = None,
        counters: Counters | None = None,
        locations: Callable[[str, int], list[str]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        trusted_proxy: str | None = None,
        sample_interval: float | None = None,
        channel_timeout: float = CHANNEL_TIMEOUT,
        max_body: int = MAX_BODY,
    ) -> None:
        self.admin: HQueueAdmin = admin  # type: ignore[assignment]  # set by start() when None here
        self.store = admin.url if admin is not None else ""
        self.access = Access(auth)
        self.audit = AuditLog(admin) if admin is not None else None
        self.locations = locations or (lambda queue, partitions: self.admin.engine.partition_locations(queue))
        self.sampler = Sampler(counters or Counters(), sample_interval or INTERVAL)
        self.tls, self.max_body = False, max_body
        #: Replays of dead letters under way, by queue (one at a time per queue).
        self.replays: dict[str, threading.Thread] = {}
        self.replays_lock = threading.Lock()
        self.dry_runs = DryRuns()
        self._described: OrderedDict[tuple[str, str], tuple[float, dict[str, Any]]] = OrderedDict()
        self._described_lock = threading.Lock()
        self._counting: dict[tuple[str, str], threading.Event] = {}
        self.app = create_app(self)
        self.app.session_interface = _SessionCookies()
        self._server: Any = create_server(
            self.app,
            host=host,
            port=port,
            threads=THREADS,
            connection_limit=CONNECTION_LIMIT + EVICTING,
            channel_timeout=channel_timeout,
            cleanup_interval=min(5, max(1, int(channel_timeout))),
            max_request_body_size=max_body,
            max_request_header_size=32 * 1024,
            clear_untrusted_proxy_headers=True,
            asyncore_use_poll=True,  # (select() refuses descriptors past 1,023: the console's thread died)
            **(
                # The client's address as the proxy saw it: log-ins are throttled per client,
                # not all at once as the proxy's (a wrong token from one held back everyone's).
                {
                    "trusted_proxy": trusted_proxy,
                    "trusted_proxy_count": 1,
                    "trusted_proxy_headers": {"x-forwarded-proto", "x-forwarded-for"},
                }
                if trusted_proxy
                else {}
            ),
            ident="hqueue-console",
        )
        _bound_clients(self._server, trusted_proxy)
        self.port: int = self._server.effective_port
        self.host, self.trusted_proxy = host, trusted_proxy
        self._thread: threading.Thread | None = None
        forks.closed_in_child(self)

    def sockets(self) -> list[Any]:
        """Its listening socket and its connections' (waitress's channels)."""
        channels = list(self._server._map.values())
        return [self._server.socket] + [getattr(c, "socket", None) for c in channels if c is not self._server]

    def describe_group(self, queue: str, group: str) -> dict[str, Any]:
        """``admin.describe_group``, kept :data:`DESCRIBE_FOR` seconds: a group's page, its
        live refresh and its chart, for every viewer, count its lag once per sample (a count
        reads the rows behind, as ``hqueue describe-group`` does), and the chart gets the point.

        One request at a time counts a group: others meanwhile get the last description (up
        to :data:`DESCRIBED_STALE` old), or wait for that count if there is none. (Each
        counted it again: a Groups page of 50 groups over 400,000 messages took 4.8 s, more
        than the 4 s a count was kept and than its 5 s refresh, and refreshes piled up in the
        console's 4 threads until a log-in waited a minute: a helper's pass.)"""
        key = (queue, group)
        while True:
            now = time.monotonic()
            with self._described_lock:
                kept = self._described.get(key)
                if kept is not None and now - kept[0] < DESCRIBE_FOR:
                    return kept[1]
                counting = self._counting.get(key)
                if counting is None:
                    counting = self._counting[key] = threading.Event()
                    break
                if kept is not None and now - kept[0] < DESCRIBED_STALE:
                    return kept[1]
            counting.wait(DESCRIBED_STALE)  # (none to show: this one's count, once it is through)
        try:
            described = self.admin.describe_group(queue, group)
            self.sampler.record_lag(queue, group, described["partitions"])
            with self._described_lock:
                self._described[key] = (time.monotonic(), described)
                self._described.move_to_end(key)
                while len(self._described) > DESCRIBED_KEPT:
                    self._described.popitem(last=False)
        finally:
            with self._described_lock:
                del self._counting[key]
            counting.set()
        return described

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def login_token(self) -> str | None:
        """The one-time token that logs in when there is no auth file."""
        return self.access.one_time_token

    def start(self, admin: HQueueAdmin | None = None) -> Console:
        """Serve in a thread; ``admin``: the handle pages read through, when the console was
        made before it could be opened (a server binds the port first, then attaches its services)."""
        if admin is not None:
            self.admin, self.store, self.audit = admin, admin.url, AuditLog(admin)
        if self.admin is None:
            raise ValueError("the console needs an admin handle: give it to Console() or start()")
        self.sampler.start()
        self._thread = threading.Thread(target=self._server.run, name="hqueue-console", daemon=True)
        self._thread.start()
        logger.info("console on %s", self.url)
        return self

    def stop(self) -> None:
        self.sampler.stop()
        server = self._server

        def close_all() -> None:  # in the loop's thread: an empty map ends its loop
            for channel in list(server._map.values()):
                channel.close()

        if self._thread is not None and self._thread.is_alive():
            server.trigger.pull_trigger(close_all)
            self._thread.join(timeout=5)
        else:
            close_all()
        server.task_dispatcher.shutdown()


#: One line per 10 s for connections refused past their address's share (a flood writes few).
_refusals = RateLimitedLog(10.0, logger)


class _Channel(HTTPChannel):
    """A connection that makes room past its address's CONNECTIONS_PER_HOST, or past
    CONNECTION_LIMIT, by closing the longest waiting, and notes when its request began to
    arrive (REQUEST_DEADLINE)."""

    #: When the request being read began (None: none is under way).
    begun: float | None = None
    #: The address whose connections are not counted (the trusted proxy's).
    proxy: str | None = None

    def __init__(self, server: Any, sock: Any, addr: Any, adj: Any, map: Any = None) -> None:
        super().__init__(server, sock, addr, adj, map)
        open_ = [c for c in server.active_channels.values() if not c.will_close]
        host = addr[0] if isinstance(addr, tuple) and addr else None
        if host is not None and host != self.proxy:
            mine = [c for c in open_ if c.addr and c.addr[0] == host]
            if len(mine) > CONNECTIONS_PER_HOST:  # (a user beside silent ones from its address: theirs go)
                _refusals.warning(
                    "hosts", "console: %s holds %d connections; closing its longest waiting", host, len(mine) - 1
                )
                if self._make_room(server, mine) is self:
                    return
                open_ = [c for c in open_ if not c.will_close]
        if len(open_) > CONNECTION_LIMIT:
            _refusals.warning(
                "full", "console: %d connections open (the limit); closing the longest waiting", CONNECTION_LIMIT
            )
            self._make_room(server, open_)

    def _make_room(self, server: Any, among: list[Any]) -> Any:
        """Close the connection of ``among`` waiting longest (for its next request, or for the
        rest of one) with none being answered, or else this one; which it closed."""
        waiting = [c for c in among if c is not self and not c.requests and not c.total_outbufs_len]
        victim = min(waiting, key=_waiting_since, default=self)
        victim.will_close = True
        if victim is not self:
            server.pull_trigger()  # (its close is seen by the loop's next turn)
        return victim

    def received(self, data: bytes) -> bool:
        if data and self.request is None:
            self.begun = time.time()
        result = super().received(data)
        if self.request is None:  # every request begun was read whole
            self.begun = None
        return result


def _waiting_since(channel: Any) -> float:
    """Since when a connection has waited: for the rest of its request (when one began), or
    since it last did anything."""
    begun = getattr(channel, "begun", None)
    return begun if begun is not None else channel.last_activity


def _bound_clients(server: Any, trusted_proxy: str | None) -> None:
    """What waitress does not bound: connections per client address, and how long a
    request may take to arrive (a slow loris on 110 connections kept every user out)."""
    server.channel_class = type("Channel", (_Channel,), {"proxy": trusted_proxy})
    idle = server.maintenance

    def maintenance(now: float) -> None:
        idle(now)  # waitress's: connections idle past channel_timeout
        for channel in list(server.active_channels.values()):
            begun = getattr(channel, "begun", None)
            if begun is not None and now - begun > REQUEST_DEADLINE:
                channel.will_close = True

    server.maintenance = maintenance


def server_counters(metrics: Any, connections: Callable[[], int]) -> Counters:
    """The charts' counters of an hqueue server (its :class:`~hqueue.metrics.ServerMetrics`)."""
    return Counters(
        puts=metrics.put_counts,
        delivered=metrics.delivered_total,
        acked=metrics.group_acked.total,
        connections=connections,
    )


class AppendCounts:
    """Messages written per queue through an engine in this process (its append events):
    the charts' put counts of ``hqueue console`` over an embedded store it opened."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def appended(self, queue: str, partition_id: int, first: Any, topics: Any) -> None:
        self._counts[queue] = self._counts.get(queue, 0) + len(topics)

    def counts(self) -> Mapping[str, float]:
        return dict(self._counts)
