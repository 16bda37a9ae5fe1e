"""AsyncRemoteEngine: the engine's calls over hqueue servers, on the event loop.

The asyncio twin of :class:`~hqueue.client.engine.RemoteEngine`, with the
same rules (read its docstring): the same URL, token and TLS; one deadline
per call (``timeout`` seconds, ``asyncio.timeout_at``) across every retry
and every server; puts to the partition's owner, following moves until
``owner_timeout``; a put that was sent and got no answer by its deadline is
:class:`~hqueue.errors.OutcomeUnknown`, never sent again. Connections come
from an :class:`~hqueue.aio.client.transport.AsyncPool` per server: no thread
per call, and ``release()`` closes every socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ...checks import message_columns, partition_of
from ...client.engine import (
    _IDEMPOTENT,
    _READS,
    READ_RETRY_DELAY,
    READ_TRIES,
    CallDeadline,
    client_options,
    owner_addresses,
    owner_error,
    owner_failure,
    past_deadline,
    poll_us_of,
    queue_description,
)
from ...client.silent import (
    SilentServers,
    maybe_went,
    next_share,
    owner_gone,
    owner_moved,
    server_share,
    silent_owner_at,
    still_owner,
)
from ...config import INFO_CACHE_SECONDS, QueueInfo, QueueState
from ...errors import (
    DeadlineExceeded,
    HQueueError,
    NotPartitionOwner,
    ServerUnavailable,
)
from ...ids import consecutive
from ...keys.timers import Timer, check_dues, kept_dues, timer_handles
from ...message import Message, MessageID
from ...requests import Lane, Lanes
from ...rpc import packed, wire
from ...rpc.failures import PROBE_SECONDS, explain, speaks_tls, spoke_plain, would_probe
from ...scanner import Scan
from .cursor import AsyncRemoteCursor
from .groups import AsyncRemoteGroups
from .subscriptions import AsyncRemoteSubscriptions
from .transport import AsyncPool, NotSentError

#: (engine, the loop-time deadline of the call under way in this task).
_deadline: contextvars.ContextVar[tuple[int, float] | None] = contextvars.ContextVar(
    "hqueue_aio_deadline", default=None
)

logger = logging.getLogger(__name__)


class AsyncRemoteEngine:
    """The engine's calls over hqueue servers, awaitable (see the module's docstring).

    Args:
        url: ``hqueue://[TOKEN@]host:port[,host:port…][?timeout=S&tls=1&ca=FILE]``.
        timeout: One call's deadline, in seconds (default 30, or the URL's).
        owner_timeout: How long a call retries while its partition has no owner.
        token: The token (default: the URL's, or ``$HQUEUE_TOKEN``).
        unix_socket: Call the server on this Unix socket: ``url`` is then the ``local://``
            store another local process serves there (server/shared.py), with no token
            and no TLS (the socket file's permissions decide who may).
    """

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
        self.tls = self._ssl_context is not None
        self._poll_us = poll_us_of(url)  # (as the blocking client's: awake.py)
        self.owner_timeout = owner_timeout
        self._pools: dict[str, AsyncPool] = {}
        self.closed = False
        self._locations: dict[str, list[str]] = {}
        self._infos: dict[str, tuple[float, QueueInfo]] = {}
        self._forgets = 0  # (a definition read as a queue was deleted is not kept: InfoCache)
        self._lanes = Lanes()  # puts' lanes (requests.py)
        self._silent = SilentServers(resolve=False)  # (no DNS lookup on the loop)
        #: Answers read for callers that were cancelled (_answer_later).
        self._answering: set[asyncio.Task[None]] = set()
        self.groups = AsyncRemoteGroups(self)
        self.subscriptions = AsyncRemoteSubscriptions(self)

    # -- deadlines ------------------------------------------------------------------

    def deadline(self, extra: float = 0.0) -> CallDeadline:
        """The deadline of the call under way in this task, or a new one for the calls inside
        (``with engine.deadline() as at:``)."""
        return CallDeadline(_deadline, id(self), self.timeout + extra, asyncio.get_running_loop().time)

    def deadline_at(self, at: float) -> CallDeadline:
        """``with engine.deadline_at(at):`` the calls inside end by ``at`` (loop time)."""
        return CallDeadline(_deadline, id(self), 0.0, asyncio.get_running_loop().time, at)

    async def _unavailable(
        self, address: str, method: str, cause: BaseException, sent: bool = False, deadline: float | None = None
    ) -> ServerUnavailable:
        """The error for a call that got no answer. Whether a server that closed a plain
        connection unanswered speaks TLS is asked on a thread (the handshake blocks), within
        the call's ``deadline`` (loop time), and not at all once this client closed."""
        if isinstance(cause, TimeoutError):
            error: ServerUnavailable = DeadlineExceeded(past_deadline(address, method, self.timeout, sent))
        elif self.unix_socket is not None:
            error = ServerUnavailable(f"the process serving {self.url} (on {self.unix_socket}): {cause}")
        else:
            host, _, port = address.rpartition(":")
            speaks = False
            loop = asyncio.get_running_loop()
            seconds = PROBE_SECONDS if deadline is None else min(PROBE_SECONDS, deadline - loop.time())
            spoke = spoke_plain(self._pools.get(address))
            if not (self.closed or spoke) and seconds > 0.05 and would_probe(cause, self.tls):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        speaks = await asyncio.to_thread(speaks_tls, host, int(port), seconds)
            why = explain(host, int(port), cause, self.tls, speaks=speaks)
            error = ServerUnavailable(f"hqueue server {address}: {why}")
        error.maybe_sent = sent
        return error

    # -- calls ----------------------------------------------------------------------

    def pool(self, address: str) -> AsyncPool:
        if self.closed:  # a call still under way when its handle closed: no new connection
            raise RuntimeError(f"closed: the connections to {self.url} were closed (the handle's close())")
        if self.unix_socket is not None:
            address = self._seeds[0]  # the one server, whatever it calls itself
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = AsyncPool(
                address, self._token, self._ssl_context, self.unix_socket, self._poll_us
            )
        return pool

    async def _call_at(
        self,
        address: str,
        method: str,
        *args: Any,
        queue: str | None = None,
        pid: int = -1,
        late: Callable[[Any], None] | None = None,
    ) -> Any:
        """One call at one server, by the deadline; IDL exceptions become hqueue errors.
        Its caller cancelled once the request was written, the answer is read all the same,
        by a task given to ``late`` at once (its result: the answer, or None if none came;
        a receive's deliveries go to the member's next receive, or back, so)."""
        with self.deadline() as deadline:
            for attempt in range(1, READ_TRIES + 1):
                pool = self.pool(address)
                try:
                    connection = pool.take_idle(call=True)  # the usual case: no wait, so no timer to set
                    if connection is None:
                        async with asyncio.timeout_at(deadline):
                            connection = await pool.take(call=True)
                except NotSentError as e:
                    raise await self._unavailable(address, method, e.cause, deadline=deadline) from e.cause
                except TimeoutError as e:
                    raise await self._unavailable(address, method, e, sent=attempt > 1) from e
                except TException as e:  # the token was refused
                    raise wire.from_thrift_error(e, queue, pid) from e
                try:
                    async with asyncio.timeout_at(deadline):
                        result = await connection.call(method, *args)
                except (TTransportException, OSError) as e:  # TimeoutError included
                    pool.give_back(connection, broken=True)
                    if attempt < READ_TRIES and method in _IDEMPOTENT and not isinstance(e, TimeoutError):
                        await asyncio.sleep(READ_RETRY_DELAY * attempt)
                        continue  # the connection broke under us: a call that may go twice goes again
                    raise await self._unavailable(address, method, e, sent=True, deadline=deadline) from e
                except TException as e:
                    pool.give_back(connection)  # an answer came: the connection is fine
                    raise wire.from_thrift_error(e, queue, pid) from e
                except asyncio.CancelledError:
                    self._answer_later(pool, connection, method, deadline, late)
                    raise
                except BaseException:
                    pool.give_back(connection, broken=True)
                    raise
                pool.give_back(connection)
                return result
        raise AssertionError("unreachable")

    def _answer_later(
        self, pool: Any, connection: Any, method: str, deadline: float, late: Callable[[Any], None] | None
    ) -> None:
        """A call whose caller was cancelled went whole (its request is written before the
        call first waits): its answer is read in the background, then the connection goes
        back to the pool. Closing it instead ended what the server ties to the connection:
        a group member's every lease, given out again while the member worked on them.
        ``late`` gets the reading task now; its result is the answer (None if none came)."""

        async def read() -> Any:
            broken, answer = True, None
            try:
                async with asyncio.timeout_at(deadline):
                    answer = await connection.receive(method)
                broken = False
            except TTransportException:
                pass
            except TException:
                broken = False  # a typed answer: the connection is fine
            except OSError:  # TimeoutError included
                pass
            finally:
                pool.give_back(connection, broken=broken)
            return answer

        task = asyncio.ensure_future(read())
        # A loop ended meanwhile (asyncio.run cancelling what an unclosed handle had under way)
        # destroys it unread, as it does the connection, whose end gives the server's leases
        # back: nothing to warn of ("Task was destroyed but it is pending!").
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        if late is not None:
            try:
                late(task)
            except Exception:  # (its answer is read all the same; those leases run out instead)
                logger.exception("the answer to a cancelled %s call could not be handed on", method)

    async def _call(self, method: str, *args: Any, queue: str | None = None) -> Any:
        """A call any server answers: each in random order (those lately silent last) until the
        deadline (one that changes something goes to a second server only if the first cannot have it)."""
        failures: list[ServerUnavailable] = []
        clock = asyncio.get_running_loop().time
        with self.deadline() as deadline:
            servers = self._silent.order(self._seeds)
            for tried, address in enumerate(servers):
                left = len(servers) - tried  # (servers still to try, this one too)
                mine = deadline if method not in _READS else server_share(deadline, clock(), left)
                try:
                    with self.deadline_at(mine):
                        return await self._call_at(address, method, *args, queue=queue)
                except ServerUnavailable as e:
                    failures.append(e)
                    if isinstance(e, DeadlineExceeded) and mine < deadline:  # its share ran out: silent
                        self._silent.mark(address)
                    if (e.maybe_sent and method not in _IDEMPOTENT) or clock() >= deadline:
                        break
        error = (DeadlineExceeded if isinstance(failures[-1], DeadlineExceeded) else ServerUnavailable)(
            "no hqueue server answered: " + "; ".join(map(str, failures))
        )
        error.maybe_sent = any(e.maybe_sent for e in failures)
        raise error from failures[-1]

    # -- queue metadata -------------------------------------------------------------

    async def queue_info(self, name: str, *, fresh: bool = False) -> QueueInfo:
        """The queue's definition, cached as the blocking client caches it (stale while no server answers)."""
        now = asyncio.get_running_loop().time()
        cached = self._infos.get(name)
        if cached and not fresh and now - cached[0] < INFO_CACHE_SECONDS:
            return cached[1]
        forgets = self._forgets
        try:
            info = wire.from_tinfo(await self._call("getQueue", name, queue=name))
        except ServerUnavailable:
            if cached is None or fresh:
                raise
            info = cached[1]
        if self._forgets == forgets:
            self._infos[name] = (now, info)
        return info

    async def enabled_queue(self, name: str) -> QueueInfo:
        return (await self.queue_info(name)).require_enabled()

    async def create_queue(self, info: QueueInfo) -> None:
        await self._call("createQueue", wire.to_tinfo(info), queue=info.name)

    async def set_state(self, name: str, state: str) -> QueueInfo:
        with self.deadline():
            await self._call("disableQueue" if state == QueueState.DISABLED else "enableQueue", name, queue=name)
            return await self.queue_info(name, fresh=True)

    async def truncate_queue(self, name: str) -> None:
        await self._call("truncateQueue", name, queue=name)

    async def delete_queue(self, name: str) -> None:
        await self._call("dropQueue", name, queue=name)
        self._forgets += 1
        self._infos.pop(name, None)
        self._locations.pop(name, None)

    async def list_queues(self) -> list[QueueInfo]:
        return [wire.from_tinfo(t) for t in await self._call("listQueues")]

    async def describe_queue(self, name: str) -> dict[str, Any]:
        return queue_description(await self._call("describeQueue", name, queue=name))

    async def partition_locations(self, name: str) -> list[str]:
        return await self.locations(name, fresh=True)

    async def locations(self, name: str, *, fresh: bool = False) -> list[str]:
        """``host:port`` of each partition's owner (``""`` where none)."""
        if fresh or name not in self._locations:
            self._locations[name] = owner_addresses(
                await self._call("getQueueLocations", name, queue=name), self._seeds
            )
        return self._locations[name]

    # -- puts and timers ------------------------------------------------------------

    async def put(
        self, name: str, messages: Sequence[Message], partition_id: int, *, routed_by: str | None = None
    ) -> list[MessageID]:
        with self.deadline():
            topics, values = message_columns(await self.enabled_queue(name), messages)
            what = f"put of {len(topics)} message(s)"
            with self._lanes.lane() as lane:  # sent again, it is written once (requests.py)
                lane.created = routed_by  # (for the owner to check: EngineAPI.put)
                blob = packed.pack(topics, values)
                result = await self.owner_call(name, partition_id, what, "putPacked", partition_id, blob, lane=lane)
        return consecutive(wire.from_tid(result.firstID), result.count)

    async def schedule(
        self,
        name: str,
        messages: Sequence[Message],
        partition_id: int,
        due: int | Sequence[int],
        *,
        routed_by: str | None = None,
    ) -> list[Timer]:
        with self.deadline():
            info = await self.enabled_queue(name)
            topics, values = message_columns(info, messages)
            blob, due = packed.pack(topics, values), check_dues(due, len(topics))
            what = f"timer put of {len(topics)} message(s)"
            args = packed.timer_call_args(partition_id, blob, due)
            with self._lanes.lane() as lane:
                lane.created = routed_by
                result = await self.owner_call(name, partition_id, what, "scheduleTimers", *args, lane=lane)
        ids = consecutive(wire.from_tid(result.firstID), result.count)
        return timer_handles(name, partition_id, kept_dues(due, ids, info.ttl), ids)  # as Engine.schedule keeps them

    async def cancel_timer(self, name: str, timer: Timer) -> bool:
        return await self.owner_call(name, timer.partition_id, "cancel", "cancelTimer", wire.to_ttimer(timer))

    async def _owns(self, owner: str, name: str, partition_id: int) -> bool:
        """Whether ``owner`` owns the partition, read afresh."""
        locations = await self.locations(name, fresh=True)
        return partition_id < len(locations) and locations[partition_id] == owner

    async def _call_watched(
        self,
        owner: str,
        method: str,
        *args: Any,
        queue: str,
        pid: int = -1,
        wait: float = 0.0,
        late: Callable[[Any], None] | None = None,
        named: Callable[[], Awaitable[bool]],
        gone: Callable[[float], HQueueError],
    ) -> Any:
        """``method`` at a partition's ``owner``, given up with ``gone(seconds)`` once
        ``named()`` says it owns what the call is about no more while no answer comes (as
        the blocking client's ``_call_watched``): a timer at each share starts the look; given
        up, the call is cancelled (an answer read after goes to ``late``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        with self.deadline() as deadline:
            moved: list[bool] = []
            try:
                async with asyncio.timeout(None) as cut:

                    async def look() -> None:  # (a task only once a share passed: rare)
                        self._silent.mark(owner)  # (the reads ask it last)
                        try:
                            still = await named()
                        except HQueueError:  # (none could say: wait on)
                            still = True
                        if not still:
                            moved.append(True)
                            cut.reschedule(loop.time())
                        else:
                            timer[0] = loop.call_at(next_share(deadline, loop.time()), watch)

                    def watch() -> None:
                        looks.append(loop.create_task(look()))

                    looks: list[asyncio.Task[None]] = []
                    timer = [loop.call_at(next_share(deadline - wait, started) + wait, watch)]
                    try:
                        return await self._call_at(owner, method, *args, queue=queue, pid=pid, late=late)
                    finally:
                        timer[0].cancel()
                        for task in looks:
                            task.cancel()
            except TimeoutError:
                if not moved:
                    raise
                raise gone(loop.time() - started) from None

    async def owner_call(
        self,
        name: str,
        partition_id: int,
        what: str,
        method: str,
        *args: Any,
        idempotent: bool = False,
        lane: Lane | None = None,
    ) -> Any:
        """``method(name, *args)`` at ``partition_id``'s owner, following moves until
        ``owner_timeout``, by the call's deadline (as the blocking client's ``_owner_call``)."""
        loop = asyncio.get_running_loop()
        with self.deadline() as deadline:
            give_up = min(deadline, loop.time() + self.owner_timeout)
            delay, fresh = 0.02, False
            unsure: HQueueError | None = None  # the failure after which the request may have been sent
            problem: HQueueError | None = None
            pinned: str | None = None  # the owner a put's silent first try may have reached: none other gets it
            started = loop.time()
            while True:
                looking = True  # (until the call goes to a named owner)
                try:
                    locations = await self.locations(name, fresh=fresh)
                    owner = locations[partition_id] if partition_id < len(locations) else ""
                    if not owner and fresh:  # (read afresh: a partition the queue does not have)
                        partition_of(name, len(locations), partition_id)
                    if owner:
                        looking = False
                        if pinned is not None and owner != pinned:  # (moved since: see _put_at_owner)
                            raise owner_moved(name, partition_id, what, pinned, owner, loop.time() - started)
                        resent = unsure is not None
                        if lane is None:
                            return await self._call_watched(
                                owner, method, name, *args, queue=name, pid=partition_id,
                                named=partial(self._owns, owner, name, partition_id),
                                gone=partial(owner_gone, name, partition_id, what, owner, idempotent),
                            )  # fmt: skip
                        return await self._put_at_owner(
                            name, partition_id, what, owner, deadline, method, args, lane, resent
                        )
                    problem = NotPartitionOwner(name, partition_id, None)
                except (NotPartitionOwner, ServerUnavailable) as e:
                    pinned = getattr(e, "silent_owner", pinned)
                    problem, unsure = owner_failure(e, problem, unsure, looking, idempotent)
                now = loop.time()
                if now >= give_up or isinstance(problem, DeadlineExceeded):
                    assert problem is not None
                    raise owner_error(name, partition_id, what, problem, unsure, self.timeout, self.owner_timeout)
                await asyncio.sleep(min(delay, give_up - now))
                delay, fresh = min(delay * 2, 1.0), True

    async def _put_at_owner(
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
        """A put at ``owner``, which goes silent or answers (as the blocking client's ``_put_at_owner``)."""
        clock = asyncio.get_running_loop().time
        started = clock()
        until = silent_owner_at(deadline, started)
        try:
            with self.deadline_at(until):
                request = wire.to_trequest(lane.request(resent))
                return await self._call_at(owner, method, name, *args, request, queue=name, pid=pid)
        except DeadlineExceeded as e:
            self._silent.put_unanswered(owner, e, until, deadline)
        with maybe_went(name, pid, what, owner, started, clock):
            still_owner(name, pid, what, owner, await self._owner_now(name, pid, deadline), clock() - started)
            request = wire.to_trequest(lane.request(True))
            try:
                return await self._call_at(owner, method, name, *args, request, queue=name, pid=pid)
            except ServerUnavailable:  # (moved meanwhile: not sent to the new owner, as above)
                still_owner(name, pid, what, owner, await self._owner_now(name, pid, deadline), clock() - started)
                raise

    async def _owner_now(self, name: str, pid: int, deadline: float) -> str | None:
        """The partition's owner, read afresh by the next share of ``deadline`` (the rest is
        the call's); None if none could say."""
        try:
            with self.deadline_at(silent_owner_at(deadline, asyncio.get_running_loop().time())):
                return (await self.locations(name, fresh=True))[pid]
        except (HQueueError, IndexError):
            return None

    # -- scans and lifetime ---------------------------------------------------------

    async def open_cursor(self, queue: str, partition_id: int, scan: Scan, caching: int) -> AsyncRemoteCursor:
        return await AsyncRemoteCursor.open(self, queue, partition_id, scan, caching)

    @property
    def connections(self) -> int:
        """Sockets open now, to every server."""
        return sum(pool.connections for pool in self._pools.values())

    async def release(self) -> None:
        """Close every connection (calls still on one fail as broken, and make no other)."""
        self.closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
