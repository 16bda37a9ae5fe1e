"""AsyncScanner: ``async for`` over partitions, merged in MessageID order.

The chunk-wise merge of :class:`~hqueue.scanner.CombinedPartitionScanner`, with
the partitions' chunks fetched concurrently (one executor call each on a store
in this process, one server-side cursor and connection each on hqueue servers).
Closed at the end, by ``aclose()``/``async with``, or when its task is cancelled:
every cursor it opened is closed then.
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_right
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..errors import InvalidPartition
from ..message import Message
from ..scanner import Scan, recreated
from .handle import bound_loop

_T = TypeVar("_T")

Opener = Callable[[Any, bool], Awaitable[tuple[str, Mapping[int, Scan], str | None]]]


class AsyncScanner:
    """Messages of chosen partitions in ID order; iterate with ``async for``.

    Args:
        engine: Awaited on the first step: the async engine.
        opener: Then awaited with it and whether to read the queue's definition fresh (not
            from a cache): (the queue, a Scan per partition, the queue's ``created``); it
            and the cursors' opening share one call's deadline.
        caching: Messages fetched a round trip per partition.
        limit: At most this many messages (None: all).
    """

    def __init__(
        self, engine: Callable[[], Awaitable[Any]], opener: Opener, caching: int, limit: int | None = None
    ) -> None:
        self.caching, self.limit = caching, limit
        # (the generator does not hold this scanner: dropped unfinished, e.g. left by a
        # ``break``, the scanner goes at once, and the generator's end closes its cursors)
        self._messages = _generate(engine, opener, caching, limit)
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def __aiter__(self) -> AsyncScanner:
        return self

    async def __anext__(self) -> Message:
        # (the end of an asyncio.run closed its generator: in the next loop, not the scan's end)
        self._loop = bound_loop(self._loop, type(self).__name__)
        return await self._messages.__anext__()

    async def aclose(self) -> None:
        """Stop the scan and close its cursors."""
        if not self.closed:
            self.closed = True
            await self._messages.aclose()

    async def __aenter__(self) -> AsyncScanner:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _generate(
    engine_of: Callable[[], Awaitable[Any]], opener: Opener, caching: int, limit: int | None
) -> AsyncGenerator[Message, None]:
    """The scan's messages: its cursors opened, merged in ID order, and closed."""
    engine = await engine_of()
    opening: list[asyncio.Future[Any]] = []
    cursors: list[Any] = []
    try:
        with engine.deadline():  # opening it (the definition, a cursor per partition) is one call, as HQueue's
            for fresh in (False, True):
                queue, scans, created = await opener(engine, fresh)
                opening[:] = [asyncio.ensure_future(engine.open_cursor(queue, p, s, caching)) for p, s in scans.items()]
                await asyncio.wait(opening)
                cursors = [task.result() for task in opening if not task.cancelled() and task.exception() is None]
                try:
                    for task in opening:
                        task.result()  # the first failure, if any, once every cursor opened is kept to be closed
                except InvalidPartition:  # (a new queue with fewer partitions than a cached definition said)
                    if fresh or (await engine.queue_info(queue, fresh=True)).created == created:
                        raise
                else:
                    if (await engine.queue_info(queue, fresh=True)).created == created:  # (scanner.check_opened)
                        break
                    if fresh:
                        raise recreated(queue)
                # A definition from the cache, outdated by a recreate (HQueue._opened): read again, fresh
                for cursor in cursors:
                    with contextlib.suppress(Exception):
                        await cursor.close()
        emitted = 0
        async for message in _merge(cursors, caching) if limit != 0 else _nothing():
            yield message
            emitted += 1
            if limit is not None and emitted >= limit:
                break
        for cursor in cursors:
            await cursor.close()
    finally:
        for task in opening:
            if not task.done():
                task.cancel()
                task.add_done_callback(_abandon_opened)  # (an open may end, opened, after all)
            elif not task.cancelled() and task.exception() is None and task.result() not in cursors:
                cursors.append(task.result())  # opened while the scan was cancelled: it holds a connection
        for cursor in cursors:
            if not cursor.done:
                cursor.abandon()  # no call from here: the task may be cancelled; its connection is dropped


async def _merge(cursors: list[Any], caching: int) -> AsyncIterator[Message]:
    """The cursors' messages in ID order (each cursor's are in order)."""
    pending: dict[Any, list[Message]] = {cursor: [] for cursor in cursors}
    while pending:
        refill = [c for c, messages in pending.items() if not c.done and len(messages) < caching]
        for cursor, chunk in zip(refill, await _all(c.fetch() for c in refill), strict=True):
            pending[cursor] += chunk
        reading = [messages[-1] for cursor, messages in pending.items() if not cursor.done and messages]
        out: list[Message] = []
        if reading and len(reading) == sum(not c.done for c in pending):
            bound = min(reading)
            for messages in pending.values():
                cut = bisect_right(messages, bound)
                out += messages[:cut]
                del messages[:cut]
        elif not any(not c.done for c in pending):
            for messages in pending.values():
                out += messages
                messages.clear()
        pending = {c: m for c, m in pending.items() if m or not c.done}
        out.sort()
        for message in out:
            yield message


async def _all(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    """Every call's result, as ``asyncio.gather``; but when one fails (or this is cancelled),
    the others are cancelled and ended first: a fetch left running after its scan ended
    would open its scanner again (an attacker's probe)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # (cancelled again meanwhile: the tasks are cancelled already)
        raise


def _abandon_opened(task: asyncio.Future[Any]) -> None:
    """A cursor's open, cancelled with its scan: what it opened anyway is let go."""
    if not task.cancelled() and task.exception() is None and not task.result().done:
        task.result().abandon()


async def _nothing() -> AsyncGenerator[Message, None]:
    """No messages (a scan with ``limit=0``)."""
    return
    yield
