"""The coordination interface (SPEC C10).

A coordinator answers, for one server, three questions: do I own partition
``(queue, pid)`` now, who owns it, and where does each partition of a queue
live. Ownership changes are reported to listeners, so the engine can forget
an allocator it no longer may use and re-seed one it gains.

Each partition has exactly one owner at a time; a put is accepted only by
its owner (the engine's allocator is only valid there).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable

from ..errors import NotPartitionOwner
from ..storage.fence import Token

logger = logging.getLogger(__name__)

#: ``listener(gained, lost)``: sets of ``(queue, pid)``.
OwnershipListener = Callable[[set[tuple[str, int]], set[tuple[str, int]]], None]
#: ``listener(partitions)``: ``(queue, pid)`` this server gives up willingly (another server
#: takes them: a rebalance), called while it still holds them, before it refuses them.
ReleaseListener = Callable[[set[tuple[str, int]]], None]


class Coordinator(abc.ABC):
    """Partition ownership for one server."""

    #: ``host:port`` clients use to reach this server.
    address: str

    def __init__(self) -> None:
        self._listeners: list[OwnershipListener] = []
        self._release_listeners: list[ReleaseListener] = []

    def add_listener(self, listener: OwnershipListener) -> None:
        self._listeners.append(listener)

    def add_release_listener(self, listener: ReleaseListener) -> None:
        """Call ``listener`` with the partitions this server hands over willingly, before it
        lets them go: its writes there still land (a graceful move is not a death)."""
        self._release_listeners.append(listener)

    def _notify(self, gained: set[tuple[str, int]], lost: set[tuple[str, int]]) -> None:
        for listener in self._listeners:
            listener(gained, lost)

    def _releasing(self, partitions: set[tuple[str, int]]) -> None:
        for listener in self._release_listeners:
            try:
                listener(partitions)
            except Exception:  # a hand-over goes on (what the listener did not do counts as a death)
                logger.exception("a release listener failed on %d partition(s)", len(partitions))

    @abc.abstractmethod
    def start(self, queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """Join; ``queues()`` lists ``(name, partitions)`` of every queue."""

    @abc.abstractmethod
    def owns(self, queue: str, partition_id: int) -> bool:
        """Whether this server may accept puts for the partition now."""

    def token(self, queue: str, partition_id: int) -> Token | None:
        """A number that only grows from one owner of the partition to the next (its
        fencing token, storage/fence.py); None where owners are not ordered (one
        process owns everything), and a take simply bumps the epoch."""
        return None

    @abc.abstractmethod
    def owner(self, queue: str, partition_id: int) -> str | None:
        """``host:port`` of the partition's owner, None while it has none."""

    def require_owner(self, queue: str, partition_id: int) -> None:
        """Raise NotPartitionOwner (naming the owner, when there is one) unless this server owns the partition."""
        if not self.owns(queue, partition_id):
            raise NotPartitionOwner(queue, partition_id, self.owner(queue, partition_id))

    def owned(self, queue: str, partitions: int) -> list[int]:
        """The partitions of ``queue`` this server owns."""
        return [pid for pid in range(partitions) if self.owns(queue, pid)]

    def locations(self, queue: str, partitions: int) -> list[str]:
        """Each partition's owner address, ``""`` where there is none."""
        return [self.owner(queue, pid) or "" for pid in range(partitions)]

    @abc.abstractmethod
    def queues_changed(self) -> None:
        """A queue was created or dropped: share out the partitions anew."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Give up every partition and leave."""
