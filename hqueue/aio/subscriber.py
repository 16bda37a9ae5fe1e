"""AsyncSubscriber: push subscriptions (SPEC C7) whose listeners are coroutines.

A push subscriber is a server: servers (or, for a store in this process, this
process) connect to it and push batches. Its listening socket and its
heartbeat run in threads of their own, as :class:`~hqueue.Subscriber`'s do;
each pushed batch is handed to the async listeners *on the event loop*, and
the push is answered once they return, so a listener that raises has the
whole batch delivered again later, as with a blocking listener.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any, NoReturn, TypeVar

from ..message import Message
from ..queue import HQueue
from ..subscriptions.listener import ListenerStopped, MessageListener, Subscriber, Subscription

_T = TypeVar("_T")

#: A listener: a coroutine function taking a batch, an object with an async
#: ``on_messages``, or a blocking :class:`~hqueue.MessageListener` (run in the push thread).
Listener = Callable[[list[Message]], Coroutine[Any, Any, Any]] | MessageListener | Any


#: Seconds between looks, while a push waits for an async listener, at whether its loop ended.
LOOP_CHECK = 1.0


class _OnLoop(MessageListener):
    """Runs an async listener on ``loop`` and waits for it in the push thread; :meth:`cancel`
    ends the runs under way (their batches come again). A loop that ended (its
    ``asyncio.run`` returned without a stop) runs no listener again: the batch comes again,
    to the next subscriber of the name, and ``ended()`` stops this one (else it kept its name
    from every later start, each push failing with "Event loop is closed")."""

    def __init__(
        self,
        call: Callable[[list[Message]], Coroutine[Any, Any, Any]],
        loop: asyncio.AbstractEventLoop,
        ended: Callable[[], None],
    ) -> None:
        self.call, self.loop, self._ended = call, loop, ended
        self._running: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._cancelled = False

    def on_messages(self, messages: list[Message]) -> None:
        with self._lock:
            if self._cancelled:  # (stopping: the batch comes again)
                raise ListenerStopped
            if self.loop.is_closed():
                self._loop_ended()
            coroutine = self.call(messages)
            try:
                run = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
            except RuntimeError:  # (closed meanwhile)
                coroutine.close()
                self._loop_ended()
            self._running.add(run)
        try:
            while True:
                try:
                    run.result(LOOP_CHECK)  # raises: the batch comes again
                    return
                except concurrent.futures.TimeoutError:
                    if self.loop.is_closed() and not run.done():  # (handed to it as it ended: it never runs)
                        run.cancel()
                        with self._lock:
                            self._loop_ended()
        except concurrent.futures.CancelledError:
            if self._cancelled:  # by the stop: no failure of the listener's
                raise ListenerStopped from None
            raise
        finally:
            with self._lock:
                self._running.discard(run)

    def _loop_ended(self) -> NoReturn:
        """(Under the lock.) Stop this subscriber, once; the batch comes again."""
        if not self._cancelled:
            self._cancelled = True
            self._ended()
        raise ListenerStopped

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for run in running:
            run.cancel()


def _async_call(listener: Listener) -> Callable[[list[Message]], Coroutine[Any, Any, Any]] | None:
    """The listener's coroutine function, None for a blocking MessageListener; TypeError otherwise."""
    on_messages = getattr(listener, "on_messages", None)
    if on_messages is not None and inspect.iscoroutinefunction(on_messages):
        return on_messages
    if isinstance(listener, MessageListener):
        return None
    if callable(listener) and inspect.iscoroutinefunction(listener):
        return listener
    raise TypeError(f"a listener is a coroutine function or a MessageListener, not {type(listener).__name__}")


def _adapted(listener: Listener, loop: asyncio.AbstractEventLoop, ended: Callable[[], None]) -> MessageListener:
    call = _async_call(listener)
    if call is None:
        assert isinstance(listener, MessageListener)
        return listener
    return _OnLoop(call, loop, ended)


class AsyncSubscriber:
    """A subscriber made by :meth:`AsyncHQueue.create_subscriber <hqueue.aio.AsyncHQueue.create_subscriber>`.

    ``await start()`` registers it and starts listening (waiting up to
    ``takeover_timeout`` for an earlier instance that crashed, as
    :meth:`Subscriber.start <hqueue.Subscriber.start>`); ``await stop()`` or
    ``async with`` ends it. Start and stop run in a thread (the blocking
    subscriber's; a lifecycle call, not a per-message one).
    """

    def __init__(
        self,
        queue: str,
        opened_with: dict[str, Any],
        subscription: Subscription,
        listeners: Sequence[Listener],
        options: dict[str, Any],
        started: set[AsyncSubscriber] | None = None,
    ) -> None:
        if isinstance(listeners, (str, bytes)) or not isinstance(listeners, Sequence) or not listeners:
            raise TypeError("'listeners' must be a non-empty sequence of listeners")
        for listener in listeners:
            _async_call(listener)  # a wrong one fails here, not in start()
        self.queue, self.subscription, self._listeners, self._options = queue, subscription, listeners, options
        self._opened_with = {k: v for k, v in opened_with.items() if k != "workers"}
        self._handle: HQueue | None = None
        self.subscriber: Subscriber | None = None
        self._on_loop: list[_OnLoop] = []
        self._started = set() if started is None else started  # (its queue's: it stops them at its close)
        self._starting = 0  # start()s under way

    @property
    def address(self) -> str:
        assert self.subscriber is not None, "start() it first"
        return self.subscriber.address

    async def start(self) -> AsyncSubscriber:
        """Register and start listening. Cancelled meanwhile, the start goes on in its
        thread, and what it started is stopped once it is done: a subscriber left running
        unseen kept its name from every later start (``SubscriberActive``)."""
        loop = asyncio.get_running_loop()
        listeners = [_adapted(listener, loop, self._loop_ended) for listener in self._listeners]
        on_loop = [listener for listener in listeners if isinstance(listener, _OnLoop)]
        if self.subscriber is None:  # (a second start of a running one fails: stop() cancels the first's)
            self._on_loop = on_loop
        self._started.add(self)  # (its queue's close meanwhile stops it: below)
        starting = _in_thread(self._start, listeners)
        self._starting += 1
        try:
            subscriber, handle = await asyncio.shield(asyncio.wrap_future(starting))
        except asyncio.CancelledError:
            for listener in on_loop:
                listener.cancel()
            self._forget_unless_running()
            starting.add_done_callback(partial(_in_thread, _stop_started))  # (never on the loop)
            raise
        except BaseException:
            self._forget_unless_running()
            raise
        finally:
            self._starting -= 1
        if self not in self._started:  # stopped while it started (its queue closed): it stops
            await asyncio.shield(asyncio.wrap_future(_in_thread(_stop, subscriber, handle, "stopped as it started")))
            return self
        self.subscriber, self._handle, self._on_loop = subscriber, handle, on_loop  # (another start's may be there)
        return self

    def _forget_unless_running(self) -> None:
        """A start failed: forget this subscriber, unless one runs or another start may still
        make one (a second start fails while the first runs on, or finishes starting)."""
        if self.subscriber is None and self._starting <= 1:
            self._started.discard(self)

    def _start(self, listeners: list[MessageListener]) -> tuple[Subscriber, HQueue]:
        handle = HQueue(self.queue, **self._opened_with)
        try:
            subscriber = handle.create_subscriber(self.subscription, listeners, **self._options).start()
        except BaseException:
            handle.close()  # (a start that failed: one that runs keeps its own handle)
            raise
        return subscriber, handle

    def _loop_ended(self) -> None:
        """(In a push thread.) The loop it started on ended with it running: it stops, in a
        thread of its own (a stop waits for the pushes under way, this one among them)."""
        self._started.discard(self)
        subscriber, self.subscriber = self.subscriber, None
        handle, self._handle = self._handle, None
        if subscriber is not None or handle is not None:
            _in_thread(_stop, subscriber, handle, "its event loop ended")

    async def stop(self, reason: str = "") -> None:
        """Stop: listeners still running are cancelled (their batches are delivered again,
        to the next subscriber of the name), then the subscriber leaves. Cancelled meanwhile
        (a listener that stops its own subscriber is), the stop goes on in its thread."""
        for listener in self._on_loop:
            listener.cancel()
        self._started.discard(self)
        subscriber, self.subscriber = self.subscriber, None
        handle, self._handle = self._handle, None
        if subscriber is not None or handle is not None:
            await asyncio.shield(asyncio.wrap_future(_in_thread(_stop, subscriber, handle, reason)))

    async def __aenter__(self) -> AsyncSubscriber:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _in_thread(call: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
    """``call(*args)`` in a thread of its own, started now: it runs whatever becomes of the
    task that awaits it (cancelled, or its loop ended; a job queued in an executor whose
    await was cancelled never ran: a stop dropped, a subscriber left running)."""
    done: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(call(*args))
        except BaseException as e:  # noqa: BLE001 - the awaiting task raises it
            done.set_exception(e)

    threading.Thread(target=run, name="hqueue-lifecycle", daemon=True).start()
    return done


def _stop_started(starting: concurrent.futures.Future[tuple[Subscriber, HQueue]]) -> None:
    """A start whose caller was cancelled is done (in its thread): what it started stops."""
    if not starting.cancelled() and starting.exception() is None:
        _stop(*starting.result(), "its start was cancelled")


def _stop(subscriber: Subscriber | None, handle: HQueue | None, reason: str) -> None:
    try:
        if subscriber is not None:
            subscriber.stop(reason)
    finally:
        if handle is not None:
            handle.close()
