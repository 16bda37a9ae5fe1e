"""AsyncHQueueAdmin: create, change and inspect queues, on the event loop."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from ..admin import FORCE_TRIES, forced_disable, new_queue_info, position_of, subscriber_scope
from ..checks import names_a_queue
from ..config import DEFAULT_MAX_MESSAGE_BYTES, Durability, QueueInfo, QueueState
from ..errors import InvalidQueueName, QueueEnabled, QueueNotFound
from ..message import MessageID
from .connect import groups_of, subscriptions_of
from .handle import AsyncConnected
from .queue import AsyncHQueue

__all__ = ["AsyncHQueueAdmin"]


class AsyncHQueueAdmin(AsyncConnected):
    """:class:`~hqueue.HQueueAdmin`'s calls, awaitable (arguments, results and errors the same)."""

    async def create_queue(
        self,
        name: str,
        partitions: int,
        ttl: int = 0,
        config: dict[str, str] | None = None,
        *,
        durability: str = Durability.SYNC_WAL,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        topic_index: bool = False,
        priorities: int | None = None,
    ) -> QueueInfo:
        """Create a queue (as :meth:`HQueueAdmin.create_queue <hqueue.HQueueAdmin.create_queue>`)."""
        info = new_queue_info(name, partitions, ttl, config, durability, max_message_bytes, topic_index, priorities)
        engine = await self.async_engine()
        await engine.create_queue(info)
        try:  # as stored (as HQueueAdmin's)
            return await engine.queue_info(name, fresh=True)
        except QueueNotFound:
            return info

    @names_a_queue
    async def truncate_queue(self, name: str) -> None:
        await (await self.async_engine()).truncate_queue(name)

    @names_a_queue
    async def disable_queue(self, name: str) -> None:
        await (await self.async_engine()).set_state(name, QueueState.DISABLED)

    @names_a_queue
    async def enable_queue(self, name: str) -> None:
        await (await self.async_engine()).set_state(name, QueueState.ENABLED)

    @names_a_queue
    async def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a disabled queue (``force=True`` disables it first)."""
        engine = await self.async_engine()
        tries = FORCE_TRIES if force else 1
        for attempt in range(tries):  # (as HQueueAdmin.delete_queue)
            if force and (await engine.queue_info(name, fresh=True)).enabled:
                with forced_disable():
                    await self.disable_queue(name)
            try:
                await engine.delete_queue(name)
                return
            except QueueEnabled:
                if attempt == tries - 1:
                    raise

    @names_a_queue
    async def queue_exists(self, name: str) -> bool:
        try:
            await (await self.async_engine()).queue_info(name, fresh=True)
        except (QueueNotFound, InvalidQueueName):  # a name no queue may have: none has it (as HQueueAdmin)
            return False
        return True

    async def list_queues(self) -> list[QueueInfo]:
        return await (await self.async_engine()).list_queues()

    @names_a_queue
    async def describe_queue(self, name: str) -> dict[str, Any]:
        return await (await self.async_engine()).describe_queue(name)

    # -- subscribers ---------------------------------------------------------------

    async def _subscriptions(self) -> Any:
        return subscriptions_of(await self.async_engine(), "subscriber administration")

    @names_a_queue
    async def add_subscriber(
        self,
        queue: str,
        name: str,
        topics: Iterable[str | bytes] | None = None,
        partitions: Mapping[int, MessageID | None] | Iterable[int] | None = None,
        *,
        dead_letter_after: int | None = None,
    ) -> None:
        await (await self._subscriptions()).add(queue, name, *subscriber_scope(topics, partitions), dead_letter_after)

    @names_a_queue
    async def delete_subscriber(self, queue: str, name: str) -> None:
        await (await self._subscriptions()).delete(queue, name)

    @names_a_queue
    async def list_subscribers(self, queue: str) -> list[str]:
        return await (await self._subscriptions()).names(queue)

    @names_a_queue
    async def describe_subscriber(self, queue: str, name: str) -> dict[str, Any]:
        return await (await self._subscriptions()).describe(queue, name)

    @names_a_queue
    async def set_checkpoint(
        self, queue: str, name: str, partition: int | str | None, position: MessageID | datetime | int
    ) -> None:
        await (await self._subscriptions()).set_checkpoint(queue, name, *position_of(partition, position))

    # -- consumer groups -----------------------------------------------------------

    @names_a_queue
    async def list_groups(self, queue: str) -> list[str]:
        return await groups_of(await self.async_engine()).names(queue)

    @names_a_queue
    async def describe_group(self, queue: str, group: str) -> dict[str, Any]:
        return await groups_of(await self.async_engine()).describe(queue, group)

    @names_a_queue
    async def set_group_position(
        self, queue: str, group: str, partition: int | str | None, position: MessageID | datetime | int
    ) -> None:
        await groups_of(await self.async_engine()).set_position(queue, group, *position_of(partition, position))

    @names_a_queue
    async def delete_group(self, queue: str, group: str) -> None:
        await groups_of(await self.async_engine()).delete(queue, group)

    def queue(self, name: str) -> AsyncHQueue:
        """A handle on queue ``name`` with the same URL and credentials (open and close it)."""
        return AsyncHQueue(name, **self._opened_with)

    def __repr__(self) -> str:
        return f"AsyncHQueueAdmin(url={self.url!r})"
