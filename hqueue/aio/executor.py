"""A store in this process (``local://``, ``memory://``, ``hbase://``), awaitable.

The embedded engine, RocksDB and happybase are synchronous: each storage call
runs in a *bounded* executor (``workers`` threads, 4 by default) that the
handle owns, never a thread per call, and the event loop never blocks on the
store. A consumer's receive does not hold a worker while it waits for work:
it asks without waiting, then waits on the loop until a write to the queue
wakes it (or a short poll interval passes, for retries falling due).

A ``local://`` store another local process serves (sharing.py) is the
exception: this process sees none of its writes, so a receive that waits
waits in the serving process, over a connection to its Unix socket on the
loop (as over ``hqueue://``), in long polls of at most LONG_POLL: no thread
held. When nobody serves the store any more, the blocking client takes it
over (in the executor), and the receive goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from ..api import EngineAPI
from ..client.groups import lease_ms, received_pairs
from ..config import UNSEEN
from ..errors import DeadlineExceeded, ServerUnavailable
from ..groups.state import Departures
from ..message import Message
from ..storage.base import released
from .client.engine import AsyncRemoteEngine

#: Threads an in-process store's handle runs storage calls in.
DEFAULT_WORKERS = 4
#: Longest a waiting receive sleeps unwoken by a write or its group's event (retries falling due, members timing out).
RECEIVE_POLL = 0.05
#: Longest one long poll at a store another process serves (a cancelled receive's ends by then).
LONG_POLL = 1.0


class ExecutorEngine:
    """An in-process engine's calls, each run in a bounded executor (see the module's docstring)."""

    def __init__(self, engine: EngineAPI, executor: ThreadPoolExecutor) -> None:
        self.sync, self._executor = engine, executor
        self._releasing = False
        self.url, self.tls = engine.url, False
        self.groups = ExecutorGroups(engine.groups, self) if engine.groups is not None else None
        self.subscriptions = _Awaitable(engine.subscriptions, self) if engine.subscriptions is not None else None

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the executor."""
        return await self.submit(partial(fn, *args, **kwargs))

    def submit(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        """``call()`` in the executor, as a future of the running loop."""
        loop = asyncio.get_running_loop()
        try:
            # (in the caller's context: a deadline it is under holds in the thread too)
            return loop.run_in_executor(self._executor, contextvars.copy_context().run, self._unless_released, call)
        except RuntimeError as e:  # the executor is shut down
            raise self._closed() from e

    def _unless_released(self, call: Callable[[], Any]) -> Any:
        """``call()``, unless the handle was closed while it waited for a thread."""
        if self._releasing:
            raise self._closed()
        return call()

    def _closed(self) -> RuntimeError:
        return released(self.url)

    def deadline(self, extra: float = 0.0) -> AbstractContextManager[Any]:
        """The engine's: none in process (as the blocking engine); a client's of a store
        another process serves (a StoreClient), one deadline for the calls inside the block,
        which :meth:`submit` carries into the executor's threads (each call had one of its
        own: a scan of 16 partitions took 5 s with a timeout of 1)."""
        return self.sync.deadline(extra)

    @property
    def timeout(self) -> float | None:
        """The client's call timeout (None in process: no deadline)."""
        return getattr(self.sync, "timeout", None)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        """queue_info, enabled_queue, create_queue, set_state, truncate_queue, delete_queue,
        list_queues, describe_queue, put, schedule, cancel_timer, partition_locations: awaitable."""
        return partial(self.run, getattr(self.sync, name))

    async def open_cursor(self, queue: str, partition_id: int, scan: Any, caching: int) -> ExecutorCursor:
        return ExecutorCursor(await self.run(self.sync.open_cursor, queue, partition_id, scan, caching), self)

    @property
    def connections(self) -> int:
        return 0

    async def release(self) -> None:
        """Release the store (the last user in the process closes it) once the calls running
        in the executor have ended (those not started yet, and later ones, raise
        RuntimeError): a receive or a fetch under way never meets a closed store."""
        self._releasing = True  # calls still queued raise RuntimeError, not CancelledError, in their tasks
        if isinstance(self.groups, ExecutorGroups):
            await self.groups.release()
        self._executor.shutdown(wait=False)
        await asyncio.to_thread(self._release_after_calls)

    def _release_after_calls(self) -> None:
        self._executor.shutdown(wait=True)
        self.sync.release()


class _Awaitable:
    """A service's methods, each run in the engine's executor."""

    def __init__(self, service: Any, engine: ExecutorEngine) -> None:
        self._service, self._engine = service, engine

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        return partial(self._engine.run, getattr(self._service, name))


class ExecutorGroups(_Awaitable):
    """``engine.groups`` in the executor; receive waits on the loop, not in a worker.

    Its receive may be cancelled anywhere: cancelled while it waits, it was handed
    nothing; cancelled while a worker takes messages, they go back to the group
    as soon as the worker is done (a nack with no delay). On a store another
    process serves, a receive waits there (see the module's docstring), and what
    the poll under way at its cancellation gets goes back the same way.
    """

    #: Cancelling :meth:`receive` itself leaves nothing leased.
    cancel_safe = True

    def __init__(self, service: Any, engine: ExecutorEngine) -> None:
        super().__init__(service, engine)
        #: The serving process's Unix socket, when another process serves this store.
        self._socket: str | None = getattr(engine.sync, "unix_socket", None)
        self._served_elsewhere: AsyncRemoteEngine | None = None
        self._released = False
        #: Polls under way in the serving process, by (queue, group, member): a leave waits for
        #: them (each poll's receive counts its member in; after the leave, it came back).
        self._polls: dict[tuple[str, str, str], set[asyncio.Future[Any]]] = {}
        #: Members that left here, by (queue, group, member): a receive begun before (in
        #: another task) takes nothing more.
        self._left = Departures()

    async def receive(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 300:
            return await self._engine.run(self._service.receive, queue, group, member, max_messages, lease, wait)
        if self._socket is not None:
            return await self._receive_there(queue, group, member, max_messages, lease, wait)
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        waker = _waker(self._engine.sync, self._service)
        started = time.monotonic()
        while True:
            if self._left.since((queue, group, member), started):
                return []  # its consumer closed meanwhile (it leaves again: AsyncConsumer.receive)
            woken = waker.arm(queue, loop)
            try:
                taken = await self._take(queue, group, member, max_messages, lease)
                left = until - loop.time()
                if taken or left <= 0:
                    return taken
                try:
                    async with asyncio.timeout(min(left, RECEIVE_POLL)):
                        await woken.wait()
                except TimeoutError:
                    pass
            finally:
                waker.disarm(queue, woken)

    async def _receive_there(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        """A receive that waits in the process serving the store, over its Unix socket on the
        loop, in long polls of at most LONG_POLL seconds. With nobody serving it, the blocking
        client takes the store over (or finds who did) in a worker, by a receive that does not
        wait; then on. One deadline bounds it all: the client's ``timeout`` plus ``wait``.
        Cancelled, it was handed nothing: a poll under way ends by itself within LONG_POLL,
        and what that poll got goes back at once, unseen."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        end = until + self._timeout()
        pause = RECEIVE_POLL
        while True:
            there = self._there()
            left = max(0.0, until - loop.time())
            poll = min(left, LONG_POLL)
            call = ("groupReceive", queue, group, member, max_messages, lease_ms(lease), int(poll * 1000))
            with there.deadline(extra=end - loop.time() - there.timeout):
                polling = asyncio.ensure_future(there._call_at(there._seeds[0], *call, queue=queue))
            self._polls.setdefault((queue, group, member), set()).add(polling)
            polling.add_done_callback(partial(self._polled, (queue, group, member)))
            try:
                deliveries = await asyncio.shield(polling)
            except asyncio.CancelledError:  # the poll ends by itself (within LONG_POLL): what it gets goes back
                polling.add_done_callback(partial(self._give_back, queue, group, member, received_pairs))
                raise
            except DeadlineExceeded:
                raise
            except ServerUnavailable:  # nobody serves it now (or it went away under the call): take it over
                if loop.time() >= end:
                    raise
                taken = await self._take(queue, group, member, max_messages, lease, end - loop.time())
                if taken or loop.time() >= until:
                    return taken
                # Served, yet its connections break (its --max-connections): not again at once.
                await asyncio.sleep(min(pause, until - loop.time()))
                pause = min(pause * 2, LONG_POLL)
                continue
            if deliveries.attempts:
                return received_pairs(deliveries)
            if loop.time() >= until:
                return []

    def _timeout(self) -> float:
        timeout = getattr(self._engine.sync, "timeout", None)
        return 30.0 if timeout is None else float(timeout)

    def _there(self) -> AsyncRemoteEngine:
        """The connections to the serving process (made on first use; none once released)."""
        if self._engine._releasing or self._released:
            raise self._engine._closed()
        if self._served_elsewhere is None:
            url, socket_path = self._engine.sync.url, self._socket
            self._served_elsewhere = AsyncRemoteEngine(url, unix_socket=socket_path, timeout=self._timeout())
        return self._served_elsewhere

    def _polled(self, key: tuple[str, str, str], polling: asyncio.Future[Any]) -> None:
        polls = self._polls.get(key)
        if polls is not None:
            polls.discard(polling)
            if not polls:
                del self._polls[key]

    async def leave(self, queue: str, group: str, member: str, *, within: float | None = None) -> None:
        """Leave the group, once the member's polls under way in the serving process end
        (within LONG_POLL while it answers): a receive there after the leave would count the
        member in again, and its partitions would wait for it until the member timeout.
        ``within``: seconds it may take (a blocking client's call, by that deadline); the
        leave, once handed to a worker, runs even if this is cancelled."""
        loop = asyncio.get_running_loop()
        end = None if within is None else loop.time() + within
        self._left.leave((queue, group, member))
        polls = self._polls.pop((queue, group, member), set())
        if polls:  # (a serving process that stopped answering: not waited for past that)
            await asyncio.wait(polls, timeout=LONG_POLL + 1 if end is None else max(0.0, end - loop.time()))
        leave = partial(self._service.leave, queue, group, member)
        if end is not None and getattr(self._engine.sync, "timeout", None) is not None:
            leave = partial(_within, self._engine.sync, max(0.001, end - loop.time()), leave)
        await asyncio.shield(self._engine.submit(leave))

    async def release(self) -> None:
        """Close the connections to the serving process, if any (and make no more), once the
        polls under way there end (within LONG_POLL while it answers) and what they got went back: a poll
        left running there would lease what comes next to a member that is gone (counted
        as a failed attempt when its lease ran out)."""
        self._released = True
        polls = [polling for polls in self._polls.values() for polling in polls]
        if polls:  # (a serving process that stopped answering: not waited for past that; the close ends them)
            await asyncio.wait(polls, timeout=LONG_POLL + 1)
        there, self._served_elsewhere = self._served_elsewhere, None
        if there is not None:
            await there.release()

    async def _take(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, within: float | None = None
    ) -> Any:
        """A receive that does not wait, in a worker (a blocking client's call: by ``within``
        seconds when given, else its own deadline)."""
        receive = partial(self._service.receive, queue, group, member, max_messages, lease, 0)
        if within is not None:
            receive = partial(_within, self._engine.sync, within, receive)
        taking = self._engine.submit(receive)
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(partial(self._give_back, queue, group, member, list))
            raise

    def _give_back(
        self, queue: str, group: str, member: str, pairs: Callable[[Any], list[Any]], taking: asyncio.Future
    ) -> None:
        """What a cancelled receive was handed (``pairs`` of ``taking``'s result) goes back at once."""
        if taking.cancelled() or taking.exception() is not None:
            return
        rowkeys = [message.rowkey for message, _ in pairs(taking.result())]
        if not rowkeys:
            return
        try:
            self._engine._executor.submit(self._service.nack, queue, group, member, rowkeys, UNSEEN)
        except RuntimeError:  # the handle closed: its member left, which gave every lease back
            pass


def _within(engine: Any, seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` by a deadline ``seconds`` from now (a blocking client's calls inside)."""
    if seconds <= 0:
        raise DeadlineExceeded(f"{engine.url}: no answer within the call's timeout")
    with engine.deadline(extra=seconds - engine.timeout):
        return call()


class ExecutorCursor:
    """A store cursor whose chunks are read in the executor, one call at a time.

    A fetch whose task is cancelled goes on in its thread (a thread cannot be
    stopped): the close that follows runs in the executor after it, never
    beside it. A client's cursor (a shared store's other process) is a
    connection with requests on the wire: two threads on it read each other's
    answers (a cancelled scan's stale reply reached a put), and its close,
    which reads the answers still due, blocked the loop.
    """

    def __init__(self, cursor: Any, engine: ExecutorEngine) -> None:
        self._cursor, self._engine = cursor, engine
        self._turn = threading.Lock()

    @property
    def done(self) -> bool:
        return bool(self._cursor.done)

    def _one_at_a_time(self, call: Callable[[], Any]) -> Any:
        with self._turn:
            return call()

    async def fetch(self) -> list[Message]:
        return await self._engine.run(self._one_at_a_time, self._cursor.fetch)

    async def fetch_columns(self) -> Any:
        return await self._engine.run(self._one_at_a_time, self._cursor.fetch_columns)

    async def close(self) -> None:
        try:
            await self._engine.run(self._one_at_a_time, self._cursor.close)
        except RuntimeError:  # the handle closed: releasing the store ends its cursors
            pass

    def abandon(self) -> None:
        """Close it in the executor, after a fetch still running there; not waited for
        (the scan's task may be cancelled)."""
        try:
            self._engine._executor.submit(self._one_at_a_time, self._cursor.close)
        except RuntimeError:  # the handle closed: releasing the store ends its cursors
            pass


class _Waker:
    """Wakes waiting receives on the loop when their queue is written (one per engine)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        #: The group services' Arrivals it listens to (a store served again gets a new one).
        self.hearing: weakref.WeakSet[Any] = weakref.WeakSet()

    def arm(self, queue: str, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiting.setdefault(queue, set()).add((loop, event))
        return event

    def disarm(self, queue: str, event: asyncio.Event) -> None:
        with self._lock:
            waiting = self._waiting.get(queue, set())
            waiting -= {pair for pair in waiting if pair[1] is event}
            if not waiting:
                self._waiting.pop(queue, None)

    def written(self, queue: str, partition_id: int) -> None:
        self.moved(queue)

    def moved(self, queue: str) -> None:
        """Something a receive of ``queue`` may take came: a write, or its group's event."""
        with self._lock:
            waiting = list(self._waiting.get(queue, ()))
        for loop, event in waiting:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its receive is gone
                pass


_wakers: weakref.WeakKeyDictionary[Any, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker(engine: Any, groups: Any) -> _Waker:
    """The engine's waker, listening to its writes and to its groups' acks, nacks, leaves
    and the rest (registered once per engine: an ack giving a member at its cap room, or a
    key in order its next message, wakes a receive at once, not at its next poll). A client
    of the process serving a shared store sees none of them: its receives wait there."""
    with _wakers_lock:
        waker = _wakers.get(engine)
        if waker is None:
            waker = _wakers[engine] = _Waker()
            events = getattr(engine, "events", None)
            if events is not None:
                events.on_write(waker.written)
        arrivals = getattr(groups, "arrivals", None)
        if arrivals is not None and arrivals not in waker.hearing:  # (the engine's group service now)
            waker.hearing.add(arrivals)
            arrivals.listen(waker.moved)
        return waker
