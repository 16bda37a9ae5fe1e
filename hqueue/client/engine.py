"""The remote client: the engine's API, served by hqueue servers over Thrift.

``HQueue("q", url="hqueue://h1:9700,h2:9700")`` uses a :class:`RemoteEngine`
in place of the in-process engine, so the whole Python API works the same.

* **Deadlines.** Each call (a put, an admin call, opening a scanner, one
  fetch of a scan, a group call) has one deadline, ``timeout`` seconds
  after it starts, that holds across every retry and every server it
  tries: every wait on a socket (connect, handshake, send, each read) ends
  by then. A call that gets no answer in time raises
  :class:`~hqueue.errors.DeadlineExceeded` (a ``ServerUnavailable`` and a
  ``TimeoutError``), or :class:`~hqueue.errors.OutcomeUnknown` for a put
  whose request was sent. A group receive's deadline is ``timeout`` plus
  its ``wait``.
* Puts go to the partition's owner (from ``getQueueLocations``, cached).
  ``TNotPartitionOwner`` or a server that cannot be reached makes the client
  refresh the locations and retry with backoff, for up to ``owner_timeout``
  seconds within the call's deadline; after that it raises
  :class:`~hqueue.errors.NoPartitionOwner`.
* A batch is one call: atomic, with consecutive IDs. One put holds at most
  10,000 messages and 16 MiB (``hqueue.config.MAX_BATCH_MESSAGES``/
  ``MAX_BATCH_BYTES``, the servers' per-call cap); a larger batch is
  refused with :class:`~hqueue.errors.BatchTooLarge` before anything is sent.
* A put is acknowledged when its IDs come back. A put whose connection
  broke after it was sent (the server died or closed it) is sent again to
  the partition's owner, within the deadline, and written once: every try
  carries the put's lane and sequence (:mod:`hqueue.requests`), and the
  owner answers a put it recorded with the IDs it was written under.
  A put whose owner gives no answer within an eighth of its deadline asks the
  other servers who owns the partition now (:func:`silent_owner_at`): the same
  owner gets it again, written once the same way; a new one does not (it may
  be half written at the silent one): OutcomeUnknown at once.
  A put that was sent and got no answer by its deadline is never sent again:
  :class:`~hqueue.errors.OutcomeUnknown` (it may be stored, or be stored
  later by a stalled server that resumes). Admin calls that change
  something are not sent to a second server once one may have received them.
* A pooled connection is checked before each use, so the first call after
  a server restart (or after the server closed an idle connection) does not
  fail; a read that fails mid-call is retried once.
* URL: ``hqueue://[TOKEN@]host:port[,host:port…][?timeout=S&tls=1&ca=FILE]``.
  With a token (or ``token=``, or ``$HQUEUE_TOKEN``) every connection
  authenticates first; ``tls=1`` (or ``ca=``) speaks TLS.
* Timer puts and cancels go to the partition's owner, as puts do.
* A consumer-group member asks every partition owner for work
  (``groupReceive``: each owner serves its own partitions' share; one long
  poll at a time), and sends acks and nacks to each message's owner. Owners
  are cached for :data:`LOCATION_REFRESH` seconds, or until a call fails:
  an owner that cannot be reached (it died) or is no longer the owner
  makes the member read the owners again and go on at the new ones, with
  backoff, until ``owner_timeout`` within the call's deadline, as puts do.
  A receive skips an owner it cannot reach while others answer. While an
  owner gives no answer, the owners are read again at each share of the
  deadline (:func:`~hqueue.client.silent.owner_try`, after a receive's
  wait): one that owns none of the partitions any more counts as one that
  cannot be reached (RemoteGroups._at).
* Scanners are server-side (``messageScannerOpen``/``GetList``/``Close``),
  ``caching`` messages a round trip, freed by close or the server's idle
  timeout (:mod:`hqueue.client.cursor`).
"""

from __future__ import annotations

import contextvars
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ..api import GroupsAPI, SubscriptionsAPI
from ..auth import is_wildcard, split_credentials
from ..checks import check_timeout, message_columns, partition_of
from ..config import InfoCache, QueueInfo, QueueState
from ..errors import (
    DeadlineExceeded,
    HQueueError,
    InvalidArgument,
    NoPartitionOwner,
    NotPartitionOwner,
    OutcomeUnknown,
    ServerBusy,
    ServerUnavailable,
)
from ..ids import consecutive
from ..keys.timers import Timer, check_dues, kept_dues, timer_handles
from ..message import Message, MessageID
from ..requests import Lane, Lanes
from ..rpc import packed, wire
from ..rpc.failures import PROBE_SECONDS, explain, spoke_plain
from ..rpc.spin import DEFAULT_CLIENT_POLL_US, env_poll_us, parse_poll_us
from ..scanner import Scan
from .cursor import RemoteCursor
from .groups import RemoteGroups
from .pool import NotSent, Pool
from .silent import (
    SilentServers,
    maybe_went,
    next_share,
    owner_gone,
    owner_moved,
    server_share,
    silent_owner_at,
    still_owner,
)
from .subscriptions import RemoteSubscriptions

logger = logging.getLogger(__name__)


def parse_url(url: str) -> tuple[list[str], str | None, dict[str, str]]:
    """``hqueue://[TOKEN@]h1:9700,h2:9700[?k=v…]`` -> (servers, token, options)."""
    if not isinstance(url, str) or not url.startswith("hqueue://"):
        raise InvalidArgument("an hqueue server URL starts with hqueue://")
    bare, token = split_credentials(url)
    hosts, _, query = bare[len("hqueue://") :].partition("?")
    servers = [s.strip() for s in hosts.strip("/").split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("an hqueue:// URL lists host:port servers: hqueue://[TOKEN@]host:port[,host:port]")
        if not 1 <= int(port) <= 65535:
            raise InvalidArgument(f"the port of {server!r} in an hqueue:// URL must be in 1..65535")
    if not servers:
        raise InvalidArgument("an hqueue:// URL needs at least one host:port (hqueue://[TOKEN@]host:port)")
    options = dict(urllib.parse.parse_qsl(query))
    unknown = set(options) - {"timeout", "tls", "ca", "poll_us"}
    if unknown:
        raise InvalidArgument(f"unknown hqueue:// URL options {sorted(unknown)} (known: timeout, tls, ca, poll_us)")
    return servers, token, options


def poll_us_of(url: str) -> int:
    """Microseconds a blocking client of ``url`` polls for each answer before it blocks:
    ``poll_us=`` in an hqueue:// URL (rpc/spin.py), else ``$HQUEUE_POLL_US``, else the default."""
    given = parse_url(url)[2].get("poll_us") if url.startswith("hqueue://") else None
    try:
        if given is None:
            return env_poll_us("HQUEUE_POLL_US", DEFAULT_CLIENT_POLL_US)
        return parse_poll_us(given, "poll_us")
    except ValueError as e:
        raise InvalidArgument(f"poll_us= in an hqueue:// URL: {e}" if given is not None else str(e)) from None


def client_options(
    url: str, timeout: float | None, token: str | None, unix_socket: str | None = None
) -> tuple[list[str], str, float, str | None, ssl.SSLContext | None]:
    """(servers, the URL without its token, the call timeout, the token, the TLS context)
    of a client of ``url`` (the blocking and the asyncio clients read it alike); with
    ``unix_socket``, of the ``local://`` store ``url`` another local process serves on it
    (one server, no token, no TLS)."""
    if unix_socket is not None:
        return [f"unix:{unix_socket}"], url, check_timeout(30.0 if timeout is None else timeout), None, None
    seeds, url_token, options = parse_url(url)
    bare = split_credentials(url)[0].partition("?")[0]  # never the token
    if timeout is None:
        try:
            timeout = float(options.get("timeout", 30.0))
        except ValueError:
            raise InvalidArgument(f"timeout= in an hqueue:// URL is seconds, got {options['timeout']!r}") from None
    timeout = check_timeout(timeout)
    context = None
    if options.get("tls", "0") not in ("0", "") or "ca" in options:
        try:
            context = ssl.create_default_context(cafile=options.get("ca"))
        except (OSError, ssl.SSLError) as e:
            raise InvalidArgument(f"ca={options.get('ca')} in an hqueue:// URL: cannot load it ({e})") from None
    return seeds, bare, timeout, token or url_token or os.environ.get("HQUEUE_TOKEN") or None, context


def owner_addresses(locations: Any, seeds: list[str]) -> list[str]:
    """The partitions' owners from a ``getQueueLocations`` reply, each one a client can dial.

    A server listening on every interface (``--host 0.0.0.0``, no ``--advertise``) names
    itself by that wildcard, which on a client's host would mean the client's own host
    (perhaps another hqueue server there). With one server in the URL, that owner is the
    server the URL names, as the URL names it (a forwarded port, a container's published
    one); a cluster's servers advertise an address (ZooKeeper servers refuse to start
    without one)."""
    owners = []
    for address in locations:
        address = str(address)
        if address and len(seeds) == 1 and is_wildcard(address.rpartition(":")[0]):
            address = seeds[0]
        owners.append(address)
    return owners


def owner_failure(
    failure: HQueueError, problem: HQueueError | None, unsure: HQueueError | None, looking: bool, idempotent: bool
) -> tuple[HQueueError, HQueueError | None]:
    """A try at a partition's owner failed: (the problem to give up on, the failure after
    which the request may have been sent). ``looking``: the try was a look for the owner,
    not the call: a deadline that kept it from going leaves the owner the problem (an owner
    is still the want: NoPartitionOwner), and it sent no call (a put is not unsure)."""
    if not (isinstance(problem, NotPartitionOwner) and isinstance(failure, DeadlineExceeded) and looking):
        problem = failure
    if unsure is None and not looking and getattr(failure, "maybe_sent", False) and not idempotent:
        unsure = failure
    return problem, unsure


def owner_error(
    name: str,
    partition_id: int,
    what: str,
    problem: HQueueError,
    unsure: HQueueError | None,
    timeout: float,
    owner_timeout: float,
) -> HQueueError:
    """What a call at a partition's owner raises when it gives up on ``problem`` (its last
    failure): OutcomeUnknown if a try may have been sent (``unsure``, the failure that left it
    so, is the one named: the last may be a later try that never went), else the problem, or
    NoPartitionOwner."""
    if unsure is not None:
        later = "" if problem is unsure else f"; then: {problem}"
        error: HQueueError = OutcomeUnknown(
            f"{what} to {name!r} partition {partition_id}: the request was sent but its answer never came; "
            "it may have taken effect (a put's messages may have been written, or be written later by a "
            f"stalled server): {unsure}{later}",
            name,
            partition_id,
        )
    elif isinstance(problem, (DeadlineExceeded, ServerBusy)):  # ServerBusy: the owner is there, but full
        error = problem
    else:
        error = NoPartitionOwner(name, partition_id, min(owner_timeout, timeout), problem)
    if error is not problem:
        error.__cause__ = unsure or problem
    return error


def past_deadline(address: str, method: str, timeout: float, sent: bool) -> str:
    """What a DeadlineExceeded says: the call went and got no answer, or never went."""
    if sent:
        return f"hqueue server {address}: {method}: no answer within the call's {timeout:g}s timeout"
    return f"hqueue server {address}: {method}: not sent: the call's {timeout:g}s timeout passed first"


def queue_description(description: Any) -> dict[str, Any]:
    """``describe_queue``'s answer from a ``describeQueue`` reply."""
    info = wire.from_tinfo(description.info)
    result = asdict(info)
    estimate = description.messageCountEstimate
    result["message_count_estimate"] = None if estimate is None or estimate < 0 else estimate
    last = {pid: wire.from_tid(t) for pid, t in (description.lastIDs or {}).items()}
    result["last_ids"] = {pid: last.get(pid) for pid in range(info.partitions)}
    return result


#: Seconds group calls trust the partitions' owners they read.
LOCATION_REFRESH = 2.0

#: Calls that change nothing, so a retry after a failure mid-call is safe.
_READS = frozenset(
    {"getQueue", "describeQueue", "listQueues", "getQueueLocations", "listSubscribers", "describeSubscriber",
     "pendingTimers", "countTimers", "nextTimer", "findTimer"}
)  # fmt: skip
#: Tries of a read (or another call that may go twice: _IDEMPOTENT) whose connection broke
#: mid-call (a server killed: its last connections may break one after another while it
#: exits; a shared store's next holder answers on the same socket), a short sleep between each.
READ_TRIES = 4
#: Seconds before the next try of a read whose connection broke, times the tries so far.
READ_RETRY_DELAY = 0.02

#: Calls that may be sent again to another server once one may have received them:
#: the reads, and calls whose second run changes nothing more than the first.
_IDEMPOTENT = _READS | {
    "listGroups", "describeGroup", "groupPending", "getCoordination", "subscriberHeartbeat", "setGroupPosition",
    "openGroup",  # a group made already is opened as it is
}  # fmt: skip


#: (the client, the deadline of its call under way in this thread or task): see CallDeadline.
_deadline: contextvars.ContextVar[tuple[int, float] | None] = contextvars.ContextVar("hqueue_deadline", default=None)


class CallDeadline:
    """``with client.deadline() as at:`` the deadline of ``owner``'s call under way in this
    thread (or asyncio task), or a new one ``seconds`` from now (on ``clock``) for the
    calls inside the block: one deadline across every retry and server of a call. Given
    ``at``, the calls inside end by then (one server's share of the call's deadline).

    A plain context manager, not a generator: a call enters a few of them.
    """

    __slots__ = ("var", "owner", "seconds", "clock", "at", "token")

    def __init__(
        self,
        var: contextvars.ContextVar[tuple[int, float] | None],
        owner: int,
        seconds: float,
        clock: Callable[[], float],
        at: float | None = None,
    ) -> None:
        self.var, self.owner, self.seconds, self.clock, self.at = var, owner, seconds, clock, at
        self.token: contextvars.Token[tuple[int, float] | None] | None = None

    def __enter__(self) -> float:
        at = self.at
        if at is None:
            outer = self.var.get()
            if outer is not None and outer[0] == self.owner:
                return outer[1]
            at = self.clock() + self.seconds
        self.token = self.var.set((self.owner, at))
        return at

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            self.var.reset(self.token)
            self.token = None


class RemoteEngine:
    """The engine API (:class:`~hqueue.engine.EngineAPI`) over hqueue servers.

    Args:
        url: ``hqueue://[TOKEN@]host:port[,host:port…][?timeout=S&tls=1&ca=FILE]``.
        timeout: The deadline of one call, in seconds (default 30, or the URL's):
            across every retry and every server tried, it returns or raises by then.
        owner_timeout: How long a put retries while its partition has no
            owner (failover, rebalance), within the call's ``timeout``.
        token: The token to authenticate with (default: the URL's, or ``$HQUEUE_TOKEN``).
        unix_socket: Call the server on this Unix socket: ``url`` is then the
            ``local://`` store another local process serves there (server/shared.py),
            with no token and no TLS (the socket file's permissions decide who may).
    """

    #: Tries of a call that may go twice whose connection broke (READ_TRIES).
    read_tries = READ_TRIES

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None = None,
        owner_timeout: float = 30.0,
        token: str | None = None,
        unix_socket: str | None = None,
    ) -> None:
        self.unix_socket = unix_socket
        options = client_options(url, timeout, token, unix_socket)
        self._seeds, self.url, self.timeout, self._token, self._ssl_context = options
        self._poll_us = poll_us_of(url)
        #: Whether this client speaks TLS (its subscribers then listen with TLS too).
        self.tls = self._ssl_context is not None
        self.owner_timeout = owner_timeout
        self._pools: dict[str, Pool] = {}
        #: Released: calls still under way fail because of it, not because of a server.
        self.closed = False
        self._lock = threading.Lock()
        self._locations: dict[str, list[str]] = {}
        self._infos = InfoCache(self._describe_info, stale_on=(ServerUnavailable,))
        self._lanes = Lanes()  # puts' lanes: a put sent again is written once (requests.py)
        self._silent = SilentServers()
        #: The services, over the same servers (kazoo-style: bound to this client).
        self.groups: GroupsAPI | None = RemoteGroups(self)
        self.subscriptions: SubscriptionsAPI | None = RemoteSubscriptions(self)

    # -- deadlines ------------------------------------------------------------------

    def deadline(self, extra: float = 0.0) -> CallDeadline:
        """The deadline of the call under way in this thread, or a new one
        (``timeout`` + ``extra`` seconds from now) for the calls inside the block."""
        return CallDeadline(_deadline, id(self), self.timeout + extra, time.monotonic)

    def deadline_at(self, at: float) -> CallDeadline:
        """``with engine.deadline_at(at):`` the calls inside end by ``at`` (a share of the call's deadline)."""
        return CallDeadline(_deadline, id(self), 0.0, time.monotonic, at)

    def current_deadline(self) -> float | None:
        outer = _deadline.get()
        return outer[1] if outer is not None and outer[0] == id(self) else None

    def _unavailable(
        self, address: str, method: str, cause: BaseException, deadline: float, sent: bool = False
    ) -> ServerUnavailable:
        """The error for a call that got no answer: DeadlineExceeded once the deadline passed."""
        if isinstance(cause, TimeoutError) or time.monotonic() >= deadline:
            error: ServerUnavailable = DeadlineExceeded(past_deadline(address, method, self.timeout, sent))
        elif self.unix_socket is not None:
            error = ServerUnavailable(f"the process serving {self.url} (on {self.unix_socket}): {cause}")
        else:
            host, _, port = address.rpartition(":")
            # (a TLS probe within the call's time; none once this client closed, which made the failure, nor
            # once the server answered in plain: a probe per evicted connection loaded a server at its limit)
            spoke = spoke_plain(self._pools.get(address))
            left = 0.0 if self.closed or spoke else min(PROBE_SECONDS, deadline - time.monotonic())
            why = explain(host, int(port), cause, self.tls, probe_seconds=left)
            error = ServerUnavailable(f"hqueue server {address}: {why}")
        error.maybe_sent = sent
        return error

    # -- calls ----------------------------------------------------------------------

    def _pool(self, address: str) -> Pool:
        if self.unix_socket is not None:
            address = self._seeds[0]  # the one server, whatever it calls itself
        with self._lock:
            pool = self._pools.get(address)
            if pool is None:
                pool = self._pools[address] = self._new_pool(address)
            return pool

    def _new_pool(self, address: str) -> Pool:
        return Pool(address, int(self.timeout * 1000), self._token, self._ssl_context, self.unix_socket, self._poll_us)

    def _call_at(
        self,
        address: str,
        method: str,
        *args,
        queue: str | None = None,
        pid: int = -1,
        share: float | None = None,
        at_share: Callable[[], float | None] | None = None,
    ):
        """One call at one server, by the deadline; IDL exceptions become hqueue errors.

        A ServerUnavailable's ``maybe_sent`` tells whether the request may
        have reached the server (False: no connection could be made). While no
        answer comes, ``at_share()`` is called at ``share`` (and then when it says):
        see :class:`~hqueue.client.pool.Pool`'s ``client``.
        """
        with self.deadline() as deadline:
            for attempt in range(1, self.read_tries + 1):
                if time.monotonic() >= deadline:
                    raise self._unavailable(address, method, TimeoutError(), deadline, sent=attempt > 1)
                try:
                    with self._pool(address).client(deadline, share, at_share) as client:
                        return getattr(client, method)(*args)
                except NotSent as e:
                    raise self._unavailable(address, method, e.cause, deadline) from e.cause
                except (TTransportException, OSError) as e:
                    if attempt < self.read_tries and method in _IDEMPOTENT and not isinstance(e, TimeoutError):
                        time.sleep(min(READ_RETRY_DELAY * attempt, max(0.0, deadline - time.monotonic())))
                        continue  # the connection broke under us: a call that may go twice goes again
                    raise self._unavailable(address, method, e, deadline, sent=True) from e
                except TException as e:
                    raise wire.from_thrift_error(e, queue, pid) from e
        raise AssertionError("unreachable")

    def _owns(self, owner: str, name: str, partition_id: int) -> bool:
        """Whether ``owner`` owns the partition, read afresh."""
        locations = self.locations(name, fresh=True)
        return partition_id < len(locations) and locations[partition_id] == owner

    def _call_watched(
        self,
        owner: str,
        method: str,
        *args: Any,
        queue: str,
        pid: int = -1,
        wait: float = 0.0,
        named: Callable[[], bool],
        gone: Callable[[float], HQueueError],
    ) -> Any:
        """``method`` at a partition's ``owner``. While no answer comes, ``named()`` (does it
        own what the call is about, read afresh from the other servers first?) is asked at
        each share of the deadline (:func:`~hqueue.client.silent.next_share`, after the
        ``wait`` the call asks for): named no more (paused past its session: its partitions
        moved), the call is given up with ``gone(seconds waited)``; still named (slow, not
        paused), it is waited for to the deadline, and not sent again."""
        with self.deadline() as deadline:
            share, at_share = self._watch(owner, deadline, wait, named, gone)
            return self._call_at(owner, method, *args, queue=queue, pid=pid, share=share, at_share=at_share)

    def _watch(
        self,
        owner: str,
        deadline: float,
        wait: float,
        named: Callable[[], bool],
        gone: Callable[[float], HQueueError],
    ) -> tuple[float, Callable[[], float | None]]:
        """The first share and the ``at_share`` of :meth:`_call_watched`'s wait for an answer
        from ``owner``, from now (a batch asked for ahead reads its answer so:
        :mod:`hqueue.client.ahead`)."""
        started = time.monotonic()

        def at_share() -> float | None:
            self._silent.mark(owner)  # (the reads ask it last)
            now = time.monotonic()
            try:
                with self.deadline_at(silent_owner_at(deadline, now)):  # (the answer may come meanwhile)
                    still = named()
            except HQueueError:  # (none could say: wait on)
                still = True
            if not still:
                raise gone(time.monotonic() - started)
            return next_share(deadline, time.monotonic())

        return next_share(deadline - wait, started) + wait, at_share

    def _call(self, method: str, *args, queue: str | None = None):
        """A call any server can answer: try each, in random order (those lately silent
        last), until the deadline. A call that changes something goes to a second server
        only if the first cannot have received it."""
        servers = self._silent.order(self._seeds)
        failures: list[ServerUnavailable] = []
        with self.deadline() as deadline:
            for tried, address in enumerate(servers):
                left = len(servers) - tried  # (servers still to try, this one too)
                mine = deadline if method not in _READS else server_share(deadline, time.monotonic(), left)
                try:
                    with self.deadline_at(mine):
                        return self._call_at(address, method, *args, queue=queue)
                except ServerUnavailable as e:
                    failures.append(e)
                    if isinstance(e, DeadlineExceeded) and mine < deadline:  # its share ran out: silent
                        self._silent.mark(address)
                    if (e.maybe_sent and method not in _IDEMPOTENT) or time.monotonic() >= deadline:
                        break
        error = (DeadlineExceeded if isinstance(failures[-1], DeadlineExceeded) else ServerUnavailable)(
            "no hqueue server answered: " + "; ".join(map(str, failures))
        )
        error.maybe_sent = any(e.maybe_sent for e in failures)
        raise error from failures[-1]

    # -- queue metadata -------------------------------------------------------------

    def queue_info(self, name: str, *, fresh: bool = False) -> QueueInfo:
        # While no server answers, serve what we knew: puts then retry until owner_timeout.
        return self._infos.get(name, fresh=fresh)

    def enabled_queue(self, name: str) -> QueueInfo:
        return self._infos.enabled(name)

    def _describe_info(self, name: str) -> QueueInfo:
        return wire.from_tinfo(self._call("getQueue", name, queue=name))

    def create_queue(self, info: QueueInfo) -> None:
        self._call("createQueue", wire.to_tinfo(info), queue=info.name)

    def set_state(self, name: str, state: str) -> QueueInfo:
        with self.deadline():
            self._call("disableQueue" if state == QueueState.DISABLED else "enableQueue", name, queue=name)
            self._infos.forget(name)
            return self.queue_info(name, fresh=True)

    def truncate_queue(self, name: str) -> None:
        self._call("truncateQueue", name, queue=name)

    def delete_queue(self, name: str) -> None:
        self._call("dropQueue", name, queue=name)
        self._infos.forget(name)
        self._locations.pop(name, None)

    def list_queues(self) -> list[QueueInfo]:
        return [wire.from_tinfo(t) for t in self._call("listQueues")]

    def describe_queue(self, name: str) -> dict[str, Any]:
        return queue_description(self._call("describeQueue", name, queue=name))

    def partition_locations(self, name: str) -> list[str]:
        """``host:port`` of each partition's owner now (``""`` where none)."""
        return self.locations(name, fresh=True)

    def locations(self, name: str, *, fresh: bool = False) -> list[str]:
        """``host:port`` of each partition's owner (``""`` where none)."""
        if fresh or name not in self._locations:
            self._locations[name] = owner_addresses(self._call("getQueueLocations", name, queue=name), self._seeds)
        return self._locations[name]

    # -- puts -----------------------------------------------------------------------

    def put(
        self, name: str, messages: Sequence[Message], partition_id: int, *, routed_by: str | None = None
    ) -> list[MessageID]:
        """Write the batch in one call to the partition's owner, following moves until
        ``owner_timeout``, by the call's deadline. ``routed_by`` goes with it, for the
        owner to check (EngineAPI.put).

        Raises:
            BatchTooLarge: over one call's cap; nothing was sent.
            OutcomeUnknown: sent, and no answer came by the deadline.
            NoPartitionOwner, DeadlineExceeded: nothing was written.
        """
        with self.deadline():
            # Check here too, so a bad batch fails at once, with the argument named.
            topics, values = message_columns(self.enabled_queue(name), messages)
            blob = packed.pack(topics, values)
            what = f"put of {len(topics)} message(s)"
            result = self._owner_put(name, partition_id, what, routed_by, "putPacked", partition_id, blob)
        return consecutive(wire.from_tid(result.firstID), result.count)

    def _owner_put(
        self, name: str, partition_id: int, what: str, routed_by: str | None, method: str, *args: Any
    ) -> Any:
        """:meth:`_owner_call` for a put, on a lane (requests.py): sent again, it is written
        once; its request says ``routed_by``."""
        with self._lanes.lane() as lane:
            lane.created = routed_by
            return self._owner_call(name, partition_id, what, method, *args, lane=lane)

    def _owner_call(
        self,
        name: str,
        partition_id: int,
        what: str,
        method: str,
        *args: Any,
        idempotent: bool = False,
        lane: Lane | None = None,
    ) -> Any:
        """Call ``method(name, *args)`` at ``partition_id``'s owner, following moves
        until ``owner_timeout``, by the call's deadline.

        A request that may have been sent is sent again only while the
        deadline holds and its connection broke (the server went away); once
        the deadline passed with no answer, a call that is not ``idempotent``
        raises OutcomeUnknown. A put's ``lane`` request goes as its last
        argument, marked resent once a try may have been sent.
        """
        with self.deadline() as deadline:
            give_up = min(deadline, time.monotonic() + self.owner_timeout)
            delay, fresh = 0.02, False
            unsure: HQueueError | None = None  # the failure after which the request may have been sent
            problem: HQueueError | None = None
            pinned: str | None = None  # the owner a put's silent first try may have reached: none other gets it
            started = time.monotonic()
            while True:
                looking = True  # (until the call goes to a named owner)
                try:
                    locations = self.locations(name, fresh=fresh)
                    owner = locations[partition_id] if partition_id < len(locations) else ""
                    if not owner and fresh:  # (read afresh: a partition the queue does not have)
                        partition_of(name, len(locations), partition_id)
                    if owner:
                        looking = False
                        if pinned is not None and owner != pinned:  # (moved since: see _put_at_owner)
                            raise owner_moved(name, partition_id, what, pinned, owner, time.monotonic() - started)
                        resent = unsure is not None
                        if lane is None:
                            return self._call_watched(
                                owner, method, name, *args, queue=name, pid=partition_id,
                                named=partial(self._owns, owner, name, partition_id),
                                gone=partial(owner_gone, name, partition_id, what, owner, idempotent),
                            )  # fmt: skip
                        return self._put_at_owner(name, partition_id, what, owner, deadline, method, args, lane, resent)
                    problem = NotPartitionOwner(name, partition_id, None)
                except (NotPartitionOwner, ServerUnavailable) as e:
                    pinned = getattr(e, "silent_owner", pinned)
                    problem, unsure = owner_failure(e, problem, unsure, looking, idempotent)
                now = time.monotonic()
                if now >= give_up or isinstance(problem, DeadlineExceeded):
                    assert problem is not None
                    raise owner_error(name, partition_id, what, problem, unsure, self.timeout, self.owner_timeout)
                logger.info("%s to %s/%d: %s; retrying in %.2fs", what, name, partition_id, problem, delay)
                time.sleep(min(delay, give_up - now))
                delay, fresh = min(delay * 2, 1.0), True

    def _put_at_owner(
        self,
        name: str,
        pid: int,
        what: str,
        owner: str,
        deadline: float,
        method: str,
        args: tuple,
        lane: Lane,
        resent: bool,
    ) -> Any:
        """A put at ``owner``, which goes silent (see :func:`silent_owner_at`) or answers."""
        started = time.monotonic()
        until = silent_owner_at(deadline, started)
        try:
            with self.deadline_at(until):
                return self._call_at(
                    owner, method, name, *args, wire.to_trequest(lane.request(resent)), queue=name, pid=pid
                )
        except DeadlineExceeded as e:
            self._silent.put_unanswered(owner, e, until, deadline)
        with maybe_went(name, pid, what, owner, started):
            still_owner(name, pid, what, owner, self._owner_now(name, pid, deadline), time.monotonic() - started)
            request = wire.to_trequest(lane.request(True))
            try:
                return self._call_at(owner, method, name, *args, request, queue=name, pid=pid)
            except ServerUnavailable:  # (moved meanwhile: not sent to the new owner, as above)
                still_owner(name, pid, what, owner, self._owner_now(name, pid, deadline), time.monotonic() - started)
                raise

    def _owner_now(self, name: str, pid: int, deadline: float) -> str | None:
        """The partition's owner, read afresh by the next share of ``deadline`` (the rest is
        the call's); None if none could say."""
        try:
            with self.deadline_at(silent_owner_at(deadline, time.monotonic())):
                return self.locations(name, fresh=True)[pid]
        except (HQueueError, IndexError):
            return None

    # -- timers (SPEC X1) ------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        messages: Sequence[Message],
        partition_id: int,
        due: int | Sequence[int],
        *,
        routed_by: str | None = None,
    ) -> list[Timer]:
        with self.deadline():
            info = self.enabled_queue(name)
            topics, values = message_columns(info, messages)
            blob, due = packed.pack(topics, values), check_dues(due, len(topics))
            what = f"timer put of {len(topics)} message(s)"
            args = packed.timer_call_args(partition_id, blob, due)
            result = self._owner_put(name, partition_id, what, routed_by, "scheduleTimers", *args)
        ids = consecutive(wire.from_tid(result.firstID), result.count)
        return timer_handles(name, partition_id, kept_dues(due, ids, info.ttl), ids)  # as Engine.schedule keeps them

    def cancel_timer(self, name: str, timer: Timer) -> bool:
        return self._owner_call(name, timer.partition_id, "cancel", "cancelTimer", wire.to_ttimer(timer))

    # Pending timers are read from the store: any server answers.

    def pending_timers(self, name: str, partition_id: int, limit: int = 1000) -> list[tuple[Timer, Message]]:
        """The partition's pending timers, earliest first, at most ``limit`` (the server's
        answers are bounded in bytes: more are asked from after the last one until ``limit``)."""
        found: list[tuple[Timer, Message]] = []
        after = None
        with self.deadline():
            while len(found) < limit:
                answer = self._call("pendingTimers", name, partition_id, limit - len(found), after, queue=name)
                if not answer:
                    break
                found += [wire.from_tpending(name, t) for t in answer]
                after = answer[-1].timer
        return found

    def count_timers(self, name: str, partition_id: int, limit: int) -> int:
        return self._call("countTimers", name, partition_id, limit, queue=name)

    def next_timer(self, name: str, partition_id: int) -> int | None:
        due = self._call("nextTimer", name, partition_id, queue=name)
        return None if due < 0 else due

    def find_timer(self, name: str, timer: Timer) -> Message | None:
        found = self._call("findTimer", name, wire.to_ttimer(timer), queue=name)
        return wire.from_tpending(name, found[0])[1] if found else None

    # -- scans ----------------------------------------------------------------------

    def open_cursor(self, queue: str, partition_id: int, scan: Scan, caching: int) -> RemoteCursor:
        return RemoteCursor(self, queue, partition_id, scan, caching)

    # -- lifetime -------------------------------------------------------------------

    def release(self) -> None:
        self.closed = True
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.release()
