"""What AsyncHQueue and AsyncHQueueAdmin share: the async engine of their URL, opened
once (on ``async with``, ``open()`` or the first call) and released by ``close()``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ..connection import resolve_url
from ..groups.limits import GroupLimits
from .connect import DEFAULT_WORKERS, AsyncEngine, check_engine_options, open_engine


def other_loop(what: str) -> RuntimeError:
    """The error of a handle (or what it made) used from an event loop other than the one it
    was first used in: its connections, tasks and locks are that loop's."""
    return RuntimeError(
        f"this {what} belongs to the event loop it was first used in (its connections, tasks and locks are "
        "that loop's): open one per event loop (each asyncio.run, each thread)"
    )


def bound_loop(bound: asyncio.AbstractEventLoop | None, what: str) -> asyncio.AbstractEventLoop:
    """The running event loop, when ``bound`` (the loop a handle, or what it made, was first
    used in) is None or it: else :func:`other_loop`'s RuntimeError."""
    loop = asyncio.get_running_loop()
    if bound is not None and loop is not bound:
        raise other_loop(what)
    return loop


class AsyncConnected:
    """Holds an async engine for one store or set of servers.

    Args:
        url, data_dir, token, timeout, group_limits: As for :class:`~hqueue.HQueue`.
        workers: For a store in this process: the threads its storage calls run
            in (default 4; the embedded engine is synchronous). Unused for hqueue://.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        timeout: float | None = None,
        group_limits: GroupLimits | None = None,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        resolved = resolve_url(url, data_dir)
        check_engine_options(resolved, token, timeout, group_limits, workers)
        self._opened_with: dict[str, Any] = {
            "url": resolved, "token": token, "timeout": timeout, "group_limits": group_limits, "workers": workers,
        }  # fmt: skip
        self._engine: AsyncEngine | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    async def async_engine(self) -> AsyncEngine:
        """The engine, opened on first use (in the event loop the handle belongs to from then on)."""
        if self.closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        self._loop = bound_loop(self._loop, type(self).__name__)
        if self._engine is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self._engine is None:
                    o = self._opened_with
                    self._engine = await open_engine(
                        o["url"], None, o["token"], o["timeout"], o["group_limits"], o["workers"]
                    )
                    if self.closed:  # closed while it opened: nothing may be left open
                        await self.close()
                        raise RuntimeError(f"{type(self).__name__} is closed")
                    await self._opened()
        engine = self._engine
        if engine is None:  # closed while this waited for it to open
            raise RuntimeError(f"{type(self).__name__} is closed")
        return engine

    async def _opened(self) -> None:
        """Checks once the engine is open (a queue that must exist)."""

    async def open(self) -> Any:
        await self.async_engine()
        return self

    @property
    def url(self) -> str:
        return self._engine.url if self._engine is not None else self._opened_with["url"]

    @property
    def connections(self) -> int:
        """Sockets this handle has open to hqueue servers now (0 for a store in this process)."""
        return self._engine.connections if self._engine is not None else 0

    def _closable_here(self) -> None:
        """A close comes from the handle's loop, or after that loop stopped (an ``asyncio.run``
        that left the handle open): from another thread while it runs, RuntimeError (its tasks
        and connections are that loop's; a handle with a producer said so, one without was
        released under the running loop)."""
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop() and loop.is_running():
            raise other_loop(type(self).__name__)

    async def close(self) -> None:
        """Release the store or close every connection (the last user in the process closes a store)."""
        self._closable_here()
        self.closed = True
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.release()

    async def __aenter__(self) -> Any:
        try:
            return await self.open()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
