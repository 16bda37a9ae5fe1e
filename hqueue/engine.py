"""The engine: what runs next to the store (HQueue's coprocessor role).

The engine validates messages, assigns IDs (SPEC C2) and writes batches,
and serves partition scans. The embedded ``HQueue`` uses one in-process; the
hqueue server wraps one and serves it over Thrift.

One engine exists per store per process (``Engine.acquire``), so every
``HQueue`` object on the same data shares the partitions' allocators and
locks; that sharing is what makes IDs strictly increasing.

Every write to a partition carries the partition's fence (storage/fence.py,
SPEC C10), taken from the store when this process gains the partition: a
server that lost it while paused has its late writes refused by the store
(:class:`~hqueue.errors.Fenced`, a NotPartitionOwner the client retries on
the new owner), so they can neither reuse an acknowledged ID nor land.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from . import forks, topic_index
from .checks import check_columns, check_partition, message_columns
from .config import CREATED_KEY, InfoCache, QueueInfo, check_config, check_routed, validate_new_queue_name
from .errors import QueueEnabled
from .events import EngineEvents
from .ids import consecutive, runs, wall_clock_ms
from .keys.groups import groups_prefix, queue_state_prefix
from .keys.index import index_cells, topic_hash
from .keys.timers import (
    HIGH_WATER_QUALIFIER,
    Fired,
    Timer,
    check_dues,
    due_of,
    high_water_key,
    id_of,
    kept_dues,
    one_timer_range,
    pending_range,
    timer_cell_keys,
    timer_handles,
    topic_of,
)
from .message import (
    MAX_SEQUENCE,
    Message,
    MessageID,
    cell_keys,
    decode_rowkey,
    messages_from_columns,
)
from .requests import Request
from .scanner import KeyRangeCursor, Scan
from .storage import Storage, normalize_url, open_storage
from .storage.base import forget_id_floor
from .writers import Answer, PartitionWriters

if TYPE_CHECKING:
    from .api import GroupsAPI, SubscriptionsAPI

logger = logging.getLogger(__name__)

_FIRST, _SECOND = itemgetter(0), itemgetter(1)
#: A count of pending timers reads their cells (keys and messages) in chunks of this many bytes
#: (and the one cell over it).
TIMER_COUNT_BYTES = 1024 * 1024


class Engine:
    """ID assignment, validation, writes and scans over one store.

    Args:
        storage: The backend to use; the engine closes it on :meth:`close`.
    """

    _registry: dict[str, Engine] = {}
    _registry_lock = threading.Lock()

    def __init__(self, storage: Storage, registry_key: str | None = None) -> None:
        #: Services attached by whoever serves the partitions (hqueue/services.py); None until then.
        self.groups: GroupsAPI | None = None
        self.subscriptions: SubscriptionsAPI | None = None
        self.storage = storage
        self._registry_key = registry_key
        self._infos = InfoCache(storage.get_queue)
        #: Who writes each partition this process owns, under its fence (writers.py).
        self.writers = PartitionWriters(storage, self.queue_info)
        #: What services listen to: writes, timers set, queues dropped.
        self.events = EngineEvents()
        self._closers: list[Callable[[], None]] = []
        self._refs = 0

    @property
    def url(self) -> str:
        return self.storage.url

    # -- sharing ----------------------------------------------------------------

    @classmethod
    def acquire(cls, url: str) -> Engine:
        """The process's engine for ``url``, opened on first use (one per store
        per process, so IDs stay strictly increasing). Services are attached
        by the caller (hqueue/services.py)."""
        url = normalize_url(url)
        with cls._registry_lock:
            engine = cls._registry.get(url)
            if engine is None:
                engine = cls._registry[url] = cls(open_storage(url), registry_key=url)
            engine._refs += 1
        return engine

    def deadline(self, extra: float = 0.0) -> AbstractContextManager[None]:
        """In process, calls have no deadline (the remote engine's have)."""
        return nullcontext()

    def release(self) -> None:
        """Drop one reference from :meth:`acquire`; the last one closes."""
        with self._registry_lock:
            self._refs -= 1
            if self._refs > 0:
                return
            self._registry.pop(self._registry_key or self.storage.url, None)
        self.close()

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call ``closer()`` when the engine closes, before the store does (services stop)."""
        self._closers.append(closer)

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()
        self.storage.close()

    # -- queue metadata -------------------------------------------------------

    def queue_info(self, name: str, *, fresh: bool = False) -> QueueInfo:
        """The queue's info, from a short-lived cache unless ``fresh``."""
        return self._infos.get(name, fresh=fresh)

    def enabled_queue(self, name: str) -> QueueInfo:
        return self._infos.enabled(name)

    def routed_queue(
        self, name: str, routed_by: str | None, before_reading: Callable[[], object] | None = None
    ) -> QueueInfo:
        """The enabled queue's definition, if it is the one a put was routed by (``routed_by``,
        its ``created``; None: any). Read afresh when the cached one is another, after
        ``before_reading()`` (a server's event loop hands the call to a worker): on a store of
        several servers it may be the outdated one, not the put's (a put routed by the new
        queue was refused for 2 s as made by the old one: a review).

        Raises:
            QueueNotFound: the queue was made again since the put was routed (check_routed).
        """
        info = self._infos.enabled(name)
        if routed_by is not None and routed_by != info.created:
            if before_reading is not None:
                before_reading()
            info = self.queue_info(name, fresh=True).require_enabled()
            check_routed(info, routed_by)
        return info

    def create_queue(self, info: QueueInfo) -> None:
        validate_new_queue_name(info.name)  # room for its dead-letter queue's name
        check_config(info.config)  # (a server's: other clients' too)
        now = wall_clock_ms()
        created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 1000)) + f".{now % 1000:03d}Z/"
        info = info.evolve(config=info.config | {CREATED_KEY: created + secrets.token_hex(4)})
        self.storage.create_queue(topic_index.for_new_queue(info))
        self._infos.forget(info.name)

    def set_state(self, name: str, state: str) -> QueueInfo:
        info = self.queue_info(name, fresh=True).evolve(state=state)
        self.storage.update_queue(info)
        self._infos.forget(name)
        return info

    def truncate_queue(self, name: str) -> None:
        """Delete all messages; IDs given later stay above every old one."""
        info = self.queue_info(name, fresh=True)
        locks = [self.writers.lock(name, pid) for pid in range(info.partitions)]
        for lock in locks:
            lock.acquire()
        try:
            floor = max([info.id_floor] + [a.last.timestamp for a in self.writers.allocators(name) if a.last])
            # Truncating is an admin's act on the whole queue, not one owner's write: it is not fenced.
            for pid in range(info.partitions):
                last = self.storage.last_rowkey(name, pid)
                if last:
                    floor = max(floor, decode_rowkey(last)[1].timestamp)
            self.storage.update_queue(info.evolve(id_floor=floor))
            for allocator in self.writers.allocators(name):  # (as a restart would: above the floor's whole ms)
                allocator.advance_to(MessageID(floor, MAX_SEQUENCE))
            self.storage.truncate_queue(name)
            self.writers.truncated(name)
            self.events.truncated(name)
        finally:
            for lock in locks:
                lock.release()
        self._infos.forget(name)

    def delete_queue(self, name: str) -> None:
        if self.queue_info(name, fresh=True).enabled:
            raise QueueEnabled(name, "it can be dropped")
        self.storage.delete_queue(name)
        forget_id_floor(self.storage, name)
        self.events.dropped(name)  # the services forget it first (a group waits for its acks under way)
        kept = [*self.storage.list_meta(groups_prefix(name)), *self.storage.list_meta(queue_state_prefix(name))]
        if kept:  # its consumer groups and their progress
            self.storage.write_meta({}, kept)
        self.writers.drop_queue(name)
        self._infos.forget(name)

    def list_queues(self) -> list[QueueInfo]:
        return self.storage.list_queues()

    def describe_queue(self, name: str) -> dict[str, Any]:
        """Definition, state, a message count estimate and each partition's last ID."""
        info = self.queue_info(name, fresh=True)
        description = asdict(info)
        description["message_count_estimate"] = self.storage.estimate_count(name)
        description["last_ids"] = {pid: self.last_id(name, pid) for pid in range(info.partitions)}
        return description

    # -- writes ---------------------------------------------------------------

    def put(
        self, name: str, messages: Sequence[Message], partition_id: int, *, routed_by: str | None = None
    ) -> list[MessageID]:
        """Assign IDs to ``messages`` and write them to one partition atomically
        (``routed_by``: :meth:`routed_queue`).

        Raises:
            QueueNotFound, QueueDisabled, InvalidPartition, InvalidMessage,
            MessageTooLarge, StorageError. Nothing is written when any is raised.
        """
        info = self.routed_queue(name, routed_by)
        check_partition(info, partition_id)
        first = self._write(info, partition_id, *message_columns(info, messages))
        return consecutive(first, len(messages))

    def put_columns(
        self,
        name: str,
        topics: Sequence[bytes],
        values: Sequence[bytes],
        partition_id: int,
        request: Request | None = None,
    ) -> MessageID:
        """:meth:`put` for a batch given as its topics and its values (the packed wire path).

        Returns the first ID; the batch has the ``len(topics)`` IDs from it on
        (:func:`hqueue.ids.consecutive`). With a ``request`` (requests.py), a put
        whose request was written already is answered with its first ID, and
        nothing is written again.
        """
        info = self.enabled_queue(name)
        check_partition(info, partition_id)
        check_columns(info, topics, values)
        return self._write(info, partition_id, topics, values, request)

    def _write(
        self,
        info: QueueInfo,
        partition_id: int,
        topics: Sequence[bytes],
        values: Sequence[bytes],
        request: Request | None = None,
    ) -> MessageID:
        with self.writers.lock(info.name, partition_id):
            done = self.writers.answered(info, partition_id, request, len(topics))
            if done is not None:
                return done.first
            first = self._append(info, partition_id, topics, values, request=request)
        self._written(info.name, partition_id)
        return first

    def _append(
        self,
        info: QueueInfo,
        partition_id: int,
        topics: Sequence[bytes],
        values: Sequence[bytes],
        deletes: Sequence[bytes] = (),
        request: Request | None = None,
    ) -> MessageID:
        """Give the messages IDs and write them (and delete ``deletes``); call under the partition's lock.

        Allocation and write happen under one lock so rows become visible in
        ID order: subscribers and tailing scanners rely on it.
        """
        writer = self.writers.held(info, partition_id)
        first = writer.allocator.reserve(len(topics))
        keys = cell_keys(partition_id, runs(first, len(topics)), topics)
        cells = list(zip(keys, values, strict=False))
        if info.topic_index:  # each message's index entry, in the same atomic write
            cells += index_cells(keys, values, topic_hash(info))
        last = writer.allocator.last
        high = last.to_bytes() if last else b""
        answer = None if request is None else Answer(request, first, len(topics))
        self.writers.store(info, partition_id, writer, cells, deletes, high, answer)
        self.events.appended(info.name, partition_id, first, topics)
        return first

    def _written(self, queue: str, partition_id: int) -> None:
        self.events.written(queue, partition_id)

    # -- timers (SPEC X1, timers.py) -------------------------------------------------

    def schedule(
        self,
        name: str,
        messages: Sequence[Message],
        partition_id: int,
        due: int | Sequence[int],
        request: Request | None = None,
        *,
        routed_by: str | None = None,
    ) -> list[Timer]:
        """Write ``messages`` as timers of one partition, delivered at ``due`` (epoch ms):
        one due time for them all, or one per message. One storage write for the batch.
        With a ``request``, as :meth:`put_columns`: timers written already are answered.
        ``routed_by``: as :meth:`put`'s.

        Raises what :meth:`put` raises; nothing is written when it does.
        """
        info = self.routed_queue(name, routed_by)
        check_partition(info, partition_id)
        topics, values = message_columns(info, messages)
        dues = check_dues(due, len(topics))
        with self.writers.lock(name, partition_id):
            done = self.writers.answered(info, partition_id, request, len(topics))
            if done is not None:
                ids = consecutive(done.first, done.size)
                return timer_handles(name, partition_id, kept_dues(dues, ids, info.ttl), ids)
            writer = self.writers.held(info, partition_id)
            ids = consecutive(writer.allocator.reserve(len(topics)), len(topics))
            dues = kept_dues(dues, ids, info.ttl)  # (on a TTL queue a past due would expire unfired)
            cells = list(zip(timer_cell_keys(partition_id, dues, ids, topics), values, strict=True))
            cells.append((high_water_key(partition_id) + HIGH_WATER_QUALIFIER, ids[-1].to_bytes()))
            answer = None if request is None else Answer(request, ids[0], len(ids))
            self.writers.store(info, partition_id, writer, cells, high=ids[-1].to_bytes(), answer=answer)
        self.events.scheduled(name, partition_id, dues if isinstance(dues, int) else min(dues))
        return timer_handles(name, partition_id, dues, ids)

    def cancel_timer(self, name: str, timer: Timer) -> bool:
        """Delete a pending timer; False if it has fired or was cancelled already."""
        info = self.queue_info(name, fresh=True)
        check_partition(info, timer.partition_id)
        with self.writers.lock(name, timer.partition_id):
            cells = self.storage.scan(name, *one_timer_range(timer), None, 1)
            if cells:
                writer = self.writers.held(info, timer.partition_id)
                self.writers.store(info, timer.partition_id, writer, (), [cells[0][0]])
        return bool(cells)

    def next_timer(self, name: str, partition_id: int, since: int = 0) -> int | None:
        """The due time of the partition's earliest pending timer due at ``since`` or
        after (0: of all), None if it has none."""
        cells = self.storage.scan(name, *pending_range(partition_id, since=since), None, 1)
        return due_of(cells[0][0]) if cells else None

    def pending_timers(
        self,
        name: str,
        partition_id: int,
        limit: int = 1000,
        max_bytes: int | None = None,
        after: Timer | None = None,
    ) -> list[tuple[Timer, Message]]:
        """The partition's pending timers, earliest first (for inspection; those after
        ``after`` when given): at most ``limit``, and none after the one that brings their
        keys and messages to ``max_bytes``."""
        start, stop = pending_range(partition_id)
        if after is not None:
            start = max(start, one_timer_range(after)[1])
        cells = self.storage.scan(name, start, stop, None, limit, max_bytes)
        return [
            (Timer(partition_id, due_of(key), id_of(key), name), Message(topic_of(key), value)) for key, value in cells
        ]

    def count_timers(self, name: str, partition_id: int, limit: int) -> int:
        """How many timers the partition has pending, counted up to ``limit``: read in chunks
        of at most :data:`TIMER_COUNT_BYTES` (their messages come with them), so the memory
        a count takes stays bounded however large the messages are."""
        start, stop = pending_range(partition_id)
        count = 0
        while count < limit:
            cells = self.storage.scan(name, start, stop, None, limit - count, TIMER_COUNT_BYTES)
            if not cells:
                break
            count += len(cells)
            start = cells[-1][0] + b"\0"  # the next key
        return count

    def find_timer(self, name: str, timer: Timer) -> Message | None:
        """The message of a pending timer; None if it fired or was cancelled."""
        check_partition(self.queue_info(name), timer.partition_id)
        cells = self.storage.scan(name, *one_timer_range(timer), None, 1)
        return Message(topic_of(cells[0][0]), cells[0][1]) if cells else None

    def fire_timers(self, name: str, partition_id: int, now: int, limit: int, since: int = 0) -> Fired:
        """Deliver the partition's timers due at ``now`` or before (at most ``limit``,
        earliest first), looking only at those due at ``since`` or after (the caller
        knows none is pending before it: the scan skips the tombstones of fired ones).

        Each becomes a message with a fresh ID, and its timer row goes, all in one
        storage write under the partition's lock.
        """
        info = self.enabled_queue(name)
        with self.writers.lock(name, partition_id):
            cells = self.storage.scan(name, *pending_range(partition_id, now + 1, min(since, now)), None, limit)
            if cells:
                keys = list(map(_FIRST, cells))
                self._append(info, partition_id, list(map(topic_of, keys)), list(map(_SECOND, cells)), keys)
        if cells:
            self._written(name, partition_id)
        if len(cells) == limit:  # more may be due: come back at once, from the last one fired
            floor = due_of(cells[-1][0])
            return Fired(len(cells), floor, now)
        return Fired(len(cells), now + 1, self.next_timer(name, partition_id, since=now + 1))

    # -- reads ----------------------------------------------------------------

    def scan(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None,
        limit: int,
    ) -> list[Message]:
        """Up to ``limit`` messages of one partition, ``start_key <= key < stop_key``."""
        return messages_from_columns(*self.scan_columns(name, start_key, stop_key, topics, limit))

    def scan_columns(
        self,
        name: str,
        start_key: bytes,
        stop_key: bytes,
        topics: Collection[bytes] | None,
        limit: int,
        max_bytes: int | None = None,
    ) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """:meth:`scan` as (cell keys, values): no object per message (``max_bytes``: as
        :meth:`Storage.scan <hqueue.storage.base.Storage.scan>`'s)."""
        info = self.enabled_queue(name)
        if info.topic_index and topic_index.usable(topics):
            assert topics is not None  # (usable says so)
            cells = topic_index.scan(self.storage, info, start_key, stop_key, topics, limit, max_bytes)
        else:
            cells = self.storage.scan(name, start_key, stop_key, topics, limit, max_bytes)
        # Two passes in C, each one list: zip(*cells) made a 10,000-argument call, an
        # iterator per cell, and two tuples (about twice the cost).
        return list(map(_FIRST, cells)), list(map(_SECOND, cells))

    def reads_past(self, name: str, topics: Collection[bytes] | None) -> bool:
        """Whether a read of ``name`` for ``topics`` may go through rows it does not return (a
        topic filter without the topic index: up to a partition's end): a server runs such
        reads on a worker, not on its event loop."""
        if topics is None:
            return False
        info = self.queue_info(name)
        return not (info.topic_index and topic_index.usable(topics))

    def off_loop(self, name: str, topics: Collection[bytes] | None) -> bool:
        """Whether a server runs a read of ``name`` for ``topics`` on a worker, not on its
        event loop: one that may go through rows it does not return (:meth:`reads_past`), or
        one that merges the index entries of more than ``topic_index.INLINE_TOPICS`` topics
        (a read each; 64 topics of 4 MiB messages held the loop 0.3 s)."""
        return self.reads_past(name, topics) or (topics is not None and len(topics) > topic_index.INLINE_TOPICS)

    def partition_locations(self, name: str) -> list[str]:
        """Where each partition is served: "" for all (this process reads them itself)."""
        return [""] * self.queue_info(name).partitions

    def open_cursor(self, queue: str, partition_id: int, scan: Scan, caching: int) -> KeyRangeCursor:
        """A cursor over one partition, for the scanners."""
        return KeyRangeCursor(self, queue, partition_id, scan, caching)

    def last_id(self, name: str, pid: int) -> MessageID | None:
        last = self.storage.last_rowkey(name, pid)
        return decode_rowkey(last)[1] if last else None


def _forget_engines_in_child() -> list[Engine]:
    """After a fork, in the child: no engine of the parent's is this process's (forks.py)."""
    inherited = list(Engine._registry.values())
    Engine._registry, Engine._registry_lock = {}, threading.Lock()
    return inherited


forks.on_fork(_forget_engines_in_child)
