"""Which async engine a URL names: servers (``hqueue://``), spoken to on the loop,
or a store in this process, its calls in a bounded executor."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

from .. import api
from ..connection import acquire_engine, check_options, resolve_url
from ..errors import InvalidArgument
from ..groups.limits import GroupLimits
from .client.engine import AsyncRemoteEngine
from .executor import DEFAULT_WORKERS, ExecutorEngine

AsyncEngine = AsyncRemoteEngine | ExecutorEngine


def check_engine_options(
    url: str, token: str | None, timeout: float | None, group_limits: GroupLimits | None, workers: int
) -> None:
    """Refuse the options that do not go with ``url`` (resolved), as :class:`~hqueue.HQueue`
    does, when a handle is made: not at its first call."""
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 64:
        raise InvalidArgument(f"'workers' must be an int in 1..64, got {workers!r}")
    check_options(url, token, timeout, group_limits)


async def open_engine(
    url: str | None,
    data_dir: str | os.PathLike[str] | None,
    token: str | None,
    timeout: float | None,
    group_limits: GroupLimits | None,
    workers: int,
) -> AsyncEngine:
    """The async engine for ``url`` (as :func:`hqueue.connection.acquire_engine` picks one)."""
    resolved = resolve_url(url, data_dir)
    check_engine_options(resolved, token, timeout, group_limits, workers)
    if resolved.startswith("hqueue://"):
        return AsyncRemoteEngine(resolved, token=token, timeout=timeout)
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hqueue-aio")
    opening = asyncio.get_running_loop().run_in_executor(
        executor, acquire_engine, resolved, None, None, timeout, group_limits
    )
    try:
        engine = await asyncio.shield(opening)
    except BaseException:
        # Cancelled while the store opens: release it once it is open (nothing left open).
        opening.add_done_callback(partial(_release_late, executor))
        raise
    return ExecutorEngine(engine, executor)


def _release_late(executor: ThreadPoolExecutor, opening: asyncio.Future) -> None:
    if not opening.cancelled() and opening.exception() is None:
        executor.submit(opening.result().release)
    executor.shutdown(wait=False)


def groups_of(engine: AsyncEngine) -> Any:
    """``engine.groups`` (awaitable calls), or the blocking API's error where none is attached."""
    return api.groups_of(cast(Any, engine))


def subscriptions_of(engine: AsyncEngine, what: str) -> Any:
    """``engine.subscriptions`` (awaitable calls), or the blocking API's error naming ``what``."""
    return api.subscriptions_of(cast(Any, engine), what)


__all__ = ["DEFAULT_WORKERS", "AsyncEngine", "groups_of", "open_engine", "subscriptions_of"]
