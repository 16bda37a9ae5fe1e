"""The in-memory store, ``memory://NAME``: for fast unit tests and throwaway work.

Nothing is durable: a store lives as long as its process, and every handle
on ``memory://NAME`` in the process sees the same data (closing the last one
keeps it; :func:`forget` drops it). Durability settings are accepted and
mean nothing here. It follows the same storage contract as the embedded and
HBase backends (``tests/storage/test_contract.py`` runs on all three): cells
sorted by key, TTL hiding, metadata.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from ..config import Durability, QueueInfo, check_routed
from ..errors import QueueExists, QueueNotFound
from ..message import partition_prefix
from .base import Cell, Storage, expired, keep_id_floor, ttl_cutoff, ttl_start, until_bytes
from .fence import Fence, LocalFences, Token


@dataclass
class _Queue:
    info: QueueInfo
    keys: list[bytes] = field(default_factory=list)  # sorted
    values: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class _Data:
    queues: dict[str, _Queue] = field(default_factory=dict)
    meta: dict[str, bytes] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    fences: LocalFences = field(init=False)

    def __post_init__(self) -> None:
        self.fences = LocalFences(self.meta.get, self.meta.__setitem__)


_STORES: dict[str, _Data] = {}
_STORES_LOCK = threading.Lock()


def _bounds(queue: _Queue, start_key: bytes, stop_key: bytes) -> tuple[int, int]:
    """The positions in ``queue.keys`` of a read of ``start_key <= key < stop_key``, from the
    first key its TTL keeps (call under the data's lock)."""
    cutoff = ttl_cutoff(queue.info)
    if cutoff is not None:
        start_key = max(start_key, ttl_start(start_key, cutoff))
    at = bisect_left(queue.keys, start_key)
    return at, max(at, bisect_left(queue.keys, stop_key))


def forget(name: str) -> None:
    """Drop the data of ``memory://name``."""
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemoryStorage(Storage):
    """Sorted lists in a dict, under one lock per store."""

    def __init__(self, name: str) -> None:
        self.url = "memory://" + name
        with _STORES_LOCK:
            self._data = _STORES.setdefault(name, _Data())

    def _queue(self, name: str) -> _Queue:
        try:
            return self._data.queues[name]
        except KeyError:
            raise QueueNotFound(name) from None

    # -- queues ---------------------------------------------------------------

    def create_queue(self, info: QueueInfo) -> None:
        with self._data.lock:
            if info.name in self._data.queues:
                raise QueueExists(info.name)
            self._data.queues[info.name] = _Queue(info)

    def get_queue(self, name: str) -> QueueInfo:
        return self._queue(name).info

    def list_queues(self) -> list[QueueInfo]:
        return [queue.info for _, queue in sorted(self._data.queues.items())]  # (one read: a delete may run)

    def update_queue(self, info: QueueInfo) -> None:
        with self._data.lock:
            self._queue(info.name).info = info

    def delete_queue(self, name: str) -> None:
        with self._data.lock:
            self._queue(name)
            del self._data.queues[name]

    def truncate_queue(self, name: str) -> None:
        with self._data.lock:
            queue = self._queue(name)
            queue.keys, queue.values = [], {}

    # -- cells ----------------------------------------------------------------

    def take_partition(self, name: str, partition_id: int, token: Token | None = None) -> Fence:
        self._queue(name)
        return self._data.fences.take(name, partition_id, token)

    def write(
        self,
        name: str,
        cells: Sequence[Cell],
        durability: str,
        deletes: Sequence[bytes] = (),
        *,
        fence: Fence | None = None,
        high: bytes = b"",
        ttl: int = 0,
        created: str | None = None,
    ) -> None:
        self._data.fences.write(fence, high, self._write, name, cells, deletes, created)

    def _write(self, name: str, cells: Sequence[Cell], deletes: Sequence[bytes], created: str | None) -> None:
        with self._data.lock:
            queue = self._queue(name)
            check_routed(queue.info, created)
            keys, values = queue.keys, queue.values
            for key in deletes:
                if values.pop(key, None) is not None:
                    del keys[bisect_left(keys, key)]
            for key, value in cells:
                if key not in values:
                    if not keys or key > keys[-1]:
                        keys.append(key)  # the usual case: IDs only grow
                    else:
                        insort(keys, key)
                values[key] = value

    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None = None,
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> list[Cell]:
        with self._data.lock:
            queue = self._queue(name)
            keys, values = queue.keys, queue.values
            at, end = _bounds(queue, start_key, stop_key)
            cells = ((key, values[key]) for key in islice(keys, at, end))
            if topics is not None:
                cells = (cell for cell in cells if cell[0][12:] in topics)
            if max_bytes is None:
                return list(islice(cells, limit))
            return until_bytes(islice(cells, limit), max_bytes)

    def scan_keys(self, name: str, start_key: bytes, stop_key: bytes, limit: int) -> list[bytes]:
        with self._data.lock:
            queue = self._queue(name)
            at, end = _bounds(queue, start_key, stop_key)
            return queue.keys[at : min(end, at + limit)]

    def last_rowkey(self, name: str, partition_id: int) -> bytes | None:
        with self._data.lock:
            keys = self._queue(name).keys
            at = bisect_left(keys, partition_prefix(partition_id + 1)) - 1
            if at >= 0 and keys[at].startswith(partition_prefix(partition_id)):
                return keys[at][:12]
            return None

    def estimate_count(self, name: str) -> int:
        return len(self._queue(name).keys)

    def reclaim_expired(self, name: str) -> None:
        with self._data.lock:
            queue = self._queue(name)
            cutoff = ttl_cutoff(queue.info)
            if cutoff is None:
                return
            keep_id_floor(self, queue.info, cutoff)
            oldest, kept = cutoff.to_bytes(), []
            for key in queue.keys:
                if expired(key, oldest):
                    del queue.values[key]
                else:
                    kept.append(key)
            queue.keys = kept

    # -- metadata ----------------------------------------------------------------

    def get_meta(self, key: str) -> bytes | None:
        return self._data.meta.get(key)

    def put_meta(self, key: str, value: bytes) -> None:
        self._data.meta[key] = value

    def write_meta(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        durability: str = Durability.SYNC_WAL,
        *,
        fence: Fence | None = None,
        entered: Callable[[], object] | None = None,
    ) -> None:
        self._data.fences.write(fence, b"", self._write_meta, puts, deletes, entered=entered)

    def _write_meta(self, puts: Mapping[str, bytes], deletes: Iterable[str]) -> None:
        with self._data.lock:
            self._data.meta.update(puts)
            for key in deletes:
                self._data.meta.pop(key, None)

    def delete_meta(self, key: str) -> None:
        self._data.meta.pop(key, None)

    def list_meta(self, prefix: str) -> dict[str, bytes]:
        with self._data.lock:
            return {k: v for k, v in self._data.meta.items() if k.startswith(prefix)}

    def close(self) -> None:
        pass  # the data stays for the process's other handles
