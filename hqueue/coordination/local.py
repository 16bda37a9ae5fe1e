"""One server alone owns every partition (the embedded default)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .base import Coordinator


class LocalCoordinator(Coordinator):
    """Owns everything; for a single server, or an embedded store."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def start(self, queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        pass

    def owns(self, queue: str, partition_id: int) -> bool:
        return True

    def owner(self, queue: str, partition_id: int) -> str | None:
        return self.address

    def queues_changed(self) -> None:
        pass

    def stop(self) -> None:
        pass
