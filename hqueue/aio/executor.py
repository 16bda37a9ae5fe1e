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
loop (as over ``hqueue://``): no thread held, no polling. When nobody
serves the store any more, the blocking client takes it over (in the
executor), and the receive goes on.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import Any

from ..api import EngineAPI
from ..config import UNSEEN
from ..errors import ServerUnavailable
from ..message import Message, messages_from_columns
from ..rpc import packed
from .client.engine import AsyncRemoteEngine

#: Threads an in-process store's handle runs storage calls in.
DEFAULT_WORKERS = 4
#: Longest a waiting receive sleeps without a write waking it (retries, members leaving).
RECEIVE_POLL = 0.05


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
            return loop.run_in_executor(self._executor, self._unless_released, call)
        except RuntimeError as e:  # the executor is shut down
            raise RuntimeError(self._closed()) from e

    def _unless_released(self, call: Callable[[], Any]) -> Any:
        """``call()``, unless the handle was closed while it waited for a thread."""
        if self._releasing:
            raise RuntimeError(self._closed())
        return call()

    def _closed(self) -> str:
        return f"closed: the store {self.url} was released (the handle's close())"

    def deadline(self, extra: float = 0.0) -> nullcontext[None]:
        return nullcontext()  # in process, no deadline (as the blocking engine)

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
    process serves, a receive waits there (see the module's docstring): then it
    is not cancel-safe by itself, and the consumer hands back what a cancelled
    one was given, as over ``hqueue://``.
    """

    #: Cancelling :meth:`receive` itself leaves nothing leased.
    cancel_safe = True

    def __init__(self, service: Any, engine: ExecutorEngine) -> None:
        super().__init__(service, engine)
        #: The serving process's Unix socket, when another process serves this store.
        self._socket: str | None = getattr(engine.sync, "unix_socket", None)
        self._served_elsewhere: AsyncRemoteEngine | None = None
        if self._socket is not None:
            self.cancel_safe = False

    async def receive(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 300:
            return await self._engine.run(self._service.receive, queue, group, member, max_messages, lease, wait)
        if self._socket is not None:
            return await self._receive_there(queue, group, member, max_messages, lease, wait)
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        waker = _waker(self._engine.sync)
        while True:
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
        loop. With nobody serving it, the blocking client takes the store over (or finds
        who did) in a worker, by a receive that does not wait; then on, within ``wait``."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        if self._served_elsewhere is None:
            sync = self._engine.sync
            timeout = getattr(sync, "timeout", None)
            self._served_elsewhere = AsyncRemoteEngine(sync.url, unix_socket=self._socket, timeout=timeout)
        there = self._served_elsewhere
        while True:
            left = max(0.0, until - loop.time())
            call = ("groupReceive", queue, group, member, max_messages, int(lease * 1000), int(left * 1000))
            try:
                with there.deadline(extra=left):
                    deliveries = await there._call_at(there._seeds[0], *call, queue=queue)
            except ServerUnavailable:  # nobody serves it now (or it did not answer): take it over
                taken = await self._take(queue, group, member, max_messages, lease)
                if taken or loop.time() >= until:
                    return taken
                continue
            if deliveries.attempts:
                messages = messages_from_columns(*packed.unpack(deliveries.messages))
                return list(zip(messages, deliveries.attempts, strict=True))
            return []

    async def release(self) -> None:
        """Close the connection a receive waits on in the serving process, if any."""
        there, self._served_elsewhere = self._served_elsewhere, None
        if there is not None:
            await there.release()

    async def _take(self, queue: str, group: str, member: str, max_messages: int, lease: float) -> Any:
        receive = partial(self._service.receive, queue, group, member, max_messages, lease, 0)
        taking = self._engine.submit(receive)
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(partial(self._give_back, queue, group, member))
            raise

    def _give_back(self, queue: str, group: str, member: str, taking: asyncio.Future) -> None:
        """What a cancelled receive was handed goes back at once."""
        if taking.cancelled() or taking.exception() is not None or not taking.result():
            return
        rowkeys = [message.rowkey for message, _ in taking.result()]
        try:
            self._engine._executor.submit(self._service.nack, queue, group, member, rowkeys, UNSEEN)
        except RuntimeError:  # the handle closed: its member left, which gave every lease back
            pass


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
        with self._lock:
            waiting = list(self._waiting.get(queue, ()))
        for loop, event in waiting:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its receive is gone
                pass


_wakers: weakref.WeakKeyDictionary[Any, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker(engine: Any) -> _Waker:
    """The engine's waker, listening to its writes (registered once per engine). A client
    of the process serving a shared store sees no writes: its receives wait there."""
    with _wakers_lock:
        waker = _wakers.get(engine)
        if waker is None:
            waker = _wakers[engine] = _Waker()
            events = getattr(engine, "events", None)
            if events is not None:
                events.on_write(waker.written)
        return waker
