"""What services hear from the engine: its events (writes, appends, truncates,
timers scheduled, queues dropped). Services register listeners; the engine
calls them, never the services themselves (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .message import MessageID


class EngineEvents:
    """What services hear from the engine (they register; the engine calls them)."""

    def __init__(self) -> None:
        self._written: list[Callable[[str, int], None]] = []
        self._scheduled: list[Callable[[str, int, int], None]] = []
        self._dropped: list[Callable[[str], None]] = []
        self._appended: list[Callable[[str, int, MessageID, Sequence[bytes]], None]] = []
        self._truncated: list[Callable[[str], None]] = []

    def on_write(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(queue, partition_id)`` after every acknowledged write.

        Subscription workers and waiting receives sleep until a write to their
        partition wakes them: no polling interval between a put and its delivery.
        """
        self._written.append(listener)

    def on_append(self, listener: Callable[[str, int, MessageID, Sequence[bytes]], None]) -> None:
        """Call ``listener(queue, partition_id, first_id, topics)`` for every batch of
        messages written, under the partition's write lock, once the store has them:
        the batch has ``len(topics)`` consecutive IDs from ``first_id`` (lag.py counts
        them). It must be quick: the partition's writes wait for it."""
        self._appended.append(listener)

    def on_truncate(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(queue)`` when a queue's messages are deleted (under every partition's lock)."""
        self._truncated.append(listener)

    def on_schedule(self, listener: Callable[[str, int, int], None]) -> None:
        """Call ``listener(queue, partition_id, due)`` after a timer is written (the firing loop wakes)."""
        self._scheduled.append(listener)

    def on_drop(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(queue)`` after a queue is deleted (services forget what they hold of it)."""
        self._dropped.append(listener)

    def off(self, listener: Callable[..., None]) -> None:
        """Stop calling ``listener`` for whatever it was registered (a service that stops)."""
        for listeners in (self._written, self._scheduled, self._dropped, self._appended, self._truncated):
            while listener in listeners:
                listeners.remove(listener)  # type: ignore[arg-type]

    def written(self, queue: str, partition_id: int) -> None:
        for listener in self._written:
            listener(queue, partition_id)

    def appended(self, queue: str, partition_id: int, first: MessageID, topics: Sequence[bytes]) -> None:
        for listener in self._appended:
            listener(queue, partition_id, first, topics)

    def truncated(self, queue: str) -> None:
        for listener in self._truncated:
            listener(queue)

    def scheduled(self, queue: str, partition_id: int, due: int) -> None:
        for listener in self._scheduled:
            listener(queue, partition_id, due)

    def dropped(self, queue: str) -> None:
        for listener in self._dropped:
            listener(queue)
