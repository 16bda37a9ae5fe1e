"""AsyncProducer: many tasks' single sends packed into few put calls, on the event loop.

``queue.producer()`` of an :class:`~hqueue.aio.AsyncHQueue`: ``await
producer.send(message)`` returns the message's ID once it is stored, and sends
awaited at once (``asyncio.gather``, or many tasks each sending one message)
go out together, one put call per partition, as with the blocking
:class:`~hqueue.producer.Producer`. The batching is the same
(:class:`~hqueue.producer.Batches`: ``linger_ms``, ``max_batch``,
``max_bytes``, ``buffer_bytes``, one put per partition under way); its puts
are tasks of the loop, not threads.

Cancelling a send before its batch goes leaves the message out; once its put
is under way, the message may be stored (as with a cancelled put).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import HQueueError, ProducerBufferFull, ProducerClosed
from ..message import Message, MessageID
from ..producer import (
    DEFAULT_BLOCK_TIMEOUT,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BYTES,
    REDEFINED,
    Batch,
    Batches,
    check_timeout,
    fail_sends,
    put_deadline,
    read_deadline,
)
from .handle import bound_loop, other_loop

__all__ = ["AsyncProducer"]

logger = logging.getLogger(__name__)
#: The sender tasks running: the event loop holds its tasks weakly, and a producer dropped
#: before its close was collected with its task pending ("Task was destroyed but it is pending").
_SENDERS: set[asyncio.Task[None]] = set()


class AsyncProducer:
    """Sends messages in batches, from any number of tasks of one event loop.

    Make one with :meth:`AsyncHQueue.producer <hqueue.aio.AsyncHQueue.producer>`; use it
    with ``async with`` (or ``await close()``) to send what it holds at the end.
    ``name`` is the queue's, ``engine()`` its handle's engine (opened on first use);
    the other arguments are :meth:`HQueue.producer <hqueue.HQueue.producer>`'s.
    """

    def __init__(
        self,
        name: str,
        engine: Callable[[], Awaitable[Any]],
        *,
        linger_ms: float = DEFAULT_LINGER_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_bytes: int = DEFAULT_MAX_BYTES,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
    ) -> None:
        self.name, self._engine_of = name, engine
        self._batches = Batches(None, linger_ms, max_batch, max_bytes, buffer_bytes, block_timeout)
        self._engine: Any = None
        self._changed: asyncio.Condition | None = None  # a batch began or filled, room came, a put ended
        self._sender: asyncio.Task[None] | None = None
        self._opening: asyncio.Future[None] | None = None
        self._joining = 0  # sends made and not yet in a batch
        self._given_up = False  # closed before its opening ended, past the close's timeout
        self._puts: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Task[None] | None = None  # the sender's read of the definition (Batches.due)
        #: Put calls made, and messages they carried (stored or failed).
        self.puts = self.sent = 0

    async def open(self) -> AsyncProducer:
        """Reach the queue (``QueueNotFound``, ``QueueDisabled``) and start sending; the
        first send opens it too (sends made meanwhile wait for the same opening)."""
        bound_loop(self._sender.get_loop() if self._sender is not None else None, type(self).__name__)
        if self._sender is None:
            opening = self._opening
            if opening is None:
                if self._batches.closed:
                    raise ProducerClosed(f"the producer of {self.name!r} is closed")
                opening = self._opening = asyncio.ensure_future(self._open())
            try:
                await asyncio.shield(opening)  # (one send cancelled leaves the opening to the others)
            except BaseException:
                if opening.done() and self._opening is opening and (opening.cancelled() or opening.exception()):
                    self._opening = None  # the next send tries again (the queue may exist by then)
                raise
        return self

    async def _open(self) -> None:
        try:
            engine = await self._engine_of()
            info = (await engine.queue_info(self.name, fresh=True)).require_enabled()  # (not a cached copy)
        except RuntimeError:  # (its queue's handle was closed meanwhile, and the store with it)
            if self._batches.closed:
                raise ProducerClosed(f"the producer of {self.name!r} is closed") from None
            raise
        if self._given_up:  # a close waited for it and gave up: nothing is sent after the close returned
            raise ProducerClosed(f"the producer of {self.name!r} closed before it was stored")
        # Closed meanwhile, it starts all the same: the sends made before the close are sent by it
        self._engine, self._batches.info, self._batches.read_at = engine, info, time.monotonic()
        self._changed = asyncio.Condition()
        self._sender = asyncio.ensure_future(self._run())
        _SENDERS.add(self._sender)  # (a producer dropped unclosed sends on, until its queue closes)
        self._sender.add_done_callback(_SENDERS.discard)

    # -- sending ----------------------------------------------------------------------------

    async def send(
        self, message: Message, *, key: bytes | str | None = None, partition: int | None = None
    ) -> MessageID:
        """Queue ``message`` for its partition's next batch and wait until it is stored:
        its ID. Arguments, routing and errors as :meth:`Producer.send
        <hqueue.producer.Producer.send>`'s (the put's error is raised here).

        Raises:
            ProducerBufferFull: no room in ``buffer_bytes`` within ``block_timeout``.
            ProducerClosed: the producer is closed.
            InvalidMessage, MessageTooLarge, InvalidPartition, TypeError: nothing is queued.
        """
        if self._batches.closed:  # (a send made before the close goes on: the close sends it)
            raise ProducerClosed(f"the producer of {self.name!r} is closed")
        self._joining += 1  # the sender waits for it, closed or not
        try:
            await self.open()
            batches, changed = self._batches, self._changed
            assert changed is not None
            cost, chosen = batches.check(message, key, partition)
            if not batches.has_room(cost):
                await self._room(cost)
            future, wake = batches.add(message, cost, chosen, lambda _: asyncio.get_running_loop().create_future())
        finally:
            self._joining -= 1
            if self._batches.closed and self._changed is not None:
                poke = asyncio.ensure_future(self._poke())  # (a closing sender may wait for the last of them)
                self._puts.add(poke)
                poke.add_done_callback(self._puts.discard)
        if wake:
            try:
                async with changed:  # (its lock may be another task's a moment: this may wait)
                    changed.notify_all()
            except asyncio.CancelledError:
                future.cancel()  # queued already: its batch, not gone, leaves it out
                raise
        return await future  # cancelled here: the future is, and a batch not gone leaves it out

    async def _poke(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _room(self, cost: int) -> None:
        batches, changed = self._batches, self._changed
        assert changed is not None
        async with changed:
            batches.pending()  # a full buffer sends what it holds now, not at its linger's end
            changed.notify_all()
            try:  # (not asyncio.wait_for: on 3.11 a cancel while it ends its inner wait left the
                async with asyncio.timeout(batches.block_timeout):  # lock taken by nobody, every send hung)
                    await changed.wait_for(lambda: batches.has_room(cost) or batches.closed)
            except TimeoutError:
                raise ProducerBufferFull(self.name, batches.buffer_bytes, batches.block_timeout) from None
        if batches.closed:
            raise ProducerClosed(f"the producer of {self.name!r} is closed")

    # -- flushing and closing ---------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> bool:
        """Send every batch now, and wait until each message sent before this call is
        stored or failed (those waiting for the producer to open too; one still waiting for
        room is not sent yet, as a blocking send has not returned). False if ``timeout``
        seconds passed first."""
        check_timeout(timeout)
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + timeout
        opening = self._opening
        if opening is not None and not opening.done():  # sends made while it opens are in no batch yet
            _, waiting = await asyncio.wait([opening], timeout=None if until is None else max(0.0, until - loop.time()))
            if waiting:
                return False
            await asyncio.sleep(0)  # (they go into their batches first: they waited for it before this call)
        if self._changed is None:
            return True  # (the opening failed: so did those sends)
        futures = [f for batch in self._batches.pending() for f in batch.futures]
        async with self._changed:
            self._changed.notify_all()
        if not futures:
            return True
        _, waiting = await asyncio.wait(futures, timeout=None if until is None else max(0.0, until - loop.time()))
        return not waiting

    async def close(self, timeout: float | None = None) -> None:
        """Stop taking sends, send what is held, and stop, waiting up to ``timeout`` seconds
        (a close already under way is waited for too). Past it, the puts under way are
        cancelled and every send not done fails with ``ProducerClosed`` (one whose put was
        under way may be stored)."""
        check_timeout(timeout)
        self._batches.closed = True
        if self._left_behind():
            return
        loop = asyncio.get_running_loop()
        give_up = None if timeout is None else loop.time() + timeout
        if self._opening is not None and not self._opening.done():  # sends made before the close wait for it
            await asyncio.wait([self._opening], timeout=timeout)
        if self._sender is None or self._changed is None:
            self._given_up = True  # (an opening past the timeout ends: its sends fail with ProducerClosed)
            return
        async with self._changed:
            self._changed.notify_all()  # senders waiting for room, and the sender task
        await self.flush(None if give_up is None else max(0.0, give_up - loop.time()))
        if self._reading is not None:
            self._reading.cancel()
        left = None if give_up is None else max(0.0, give_up - loop.time())
        _, running = await asyncio.wait([self._sender, *self._puts], timeout=left)
        if running:
            for task in running:
                task.cancel()
            await asyncio.wait(running)
            self._fail_held()

    def _left_behind(self) -> bool:
        """Whether this producer's event loop has stopped (an ``asyncio.run`` that left it
        open, closed from the next loop): that run cancelled its tasks and the sends
        waiting in them, so nothing it holds was acknowledged; it is dropped. Its loop
        still running elsewhere, the close must be made there (RuntimeError)."""
        mine = next((t.get_loop() for t in (self._sender, self._opening) if t is not None), None)
        if mine is None or mine is asyncio.get_running_loop():
            return False
        if mine.is_running():
            raise other_loop(type(self).__name__)
        self._sender = self._opening = None
        self._puts.clear()
        self._fail_held()
        return True

    def _fail_held(self) -> None:
        """After a close that timed out: every send not done fails, and its room is freed."""
        closed = ProducerClosed(f"the producer of {self.name!r} closed before it was stored")
        fail_sends((f for batch in self._batches.drop() for f in batch.futures), closed)

    @property
    def closed(self) -> bool:
        return self._batches.closed

    async def __aenter__(self) -> AsyncProducer:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the sender task ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._send_due()
        except asyncio.CancelledError:
            unsent = self._batches.unsent()
            if unsent and not self._batches.closed:  # (the end of asyncio.run: as the blocking producer's exit)
                logger.warning(
                    "%r: %d message(s) sent and not stored are lost: its event loop ended (or its sender "
                    "task was cancelled) before the producer was closed; close() or flush() it (or use it "
                    "with 'async with') before the loop ends", self, unsent,
                )  # fmt: skip
            raise

    async def _send_due(self) -> None:
        batches, changed, engine = self._batches, self._changed, self._engine
        assert changed is not None and engine is not None
        while True:
            if batches.due():  # (a task of its own, as the blocking producer's: the batches due go meanwhile)
                self._reading = asyncio.ensure_future(self._read_again(engine))  # (a close cancels it)
            ready = batches.take_ready()
            if not ready:
                if batches.closed and batches.idle() and not self._joining:
                    return
                async with changed:
                    try:
                        async with asyncio.timeout(batches.next_wake()):  # (see _room)
                            await changed.wait()
                    except TimeoutError:
                        pass
                continue
            for pid, batch in ready:  # partitions' puts under way at once
                task = asyncio.ensure_future(self._put(pid, batch))
                self._puts.add(task)
                task.add_done_callback(self._puts.discard)

    async def _read_again(self, engine: Any) -> None:
        """The definition again (Batches.due), by at most ``block_timeout`` (a handle's store
        released meanwhile: RuntimeError, let be)."""
        batches = self._batches
        with (
            contextlib.suppress(HQueueError, RuntimeError),
            engine.deadline(read_deadline(engine, batches.block_timeout)),
        ):
            batches.renew(await engine.queue_info(self.name))

    async def _put(self, pid: int, batch: Batch) -> None:
        live = [(m, f) for m, f in zip(batch.messages, batch.futures, strict=True) if not f.done()]
        engine = self._engine
        try:
            if live:
                with engine.deadline(put_deadline(engine, batch)):
                    ids = await engine.put(self.name, [m for m, _ in live], pid, routed_by=batch.routed_by)
                for (_, future), message_id in zip(live, ids, strict=True):
                    if not future.done():
                        future.set_result(message_id)
        except asyncio.CancelledError:  # by a close that timed out: the put may have been stored
            closed = ProducerClosed(
                f"the producer of {self.name!r} closed while its put was under way: it may be stored"
            )
            fail_sends((f for _, f in live), closed)
            raise
        except Exception as e:  # every error goes to the batch's futures
            if not isinstance(e, HQueueError):
                logger.warning("put of %d message(s) to %s/%d failed: %r", len(live), self.name, pid, e)
            try:
                if isinstance(e, REDEFINED):  # the queue made again under it: its next sends checked by the new one
                    with contextlib.suppress(HQueueError):
                        self._batches.renew(await engine.queue_info(self.name, fresh=True))
            finally:  # (before they fail: a send that follows one of them is checked so)
                fail_sends((f for _, f in live), e)
        finally:
            self.puts, self.sent = self.puts + bool(live), self.sent + len(live)
            self._batches.finished(pid, batch)
            assert self._changed is not None
            async with self._changed:
                self._changed.notify_all()

    def __repr__(self) -> str:
        b = self._batches
        return f"AsyncProducer({self.name!r}, linger_ms={b.linger * 1000:g}, max_batch={b.max_batch})"
