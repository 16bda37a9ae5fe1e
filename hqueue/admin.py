"""HQueueAdmin: create, change and inspect queues (SPEC C1, C8)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .api import groups_of
from .checks import names_a_queue
from .config import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FLAG_FALSE,
    PRIORITIES_KEY,
    TOPIC_INDEX_KEY,
    Durability,
    QueueInfo,
    QueueState,
    check_config,
    validate_new_queue_name,
)
from .connection import Connected
from .deadletters import DeadLetterNote, dead_letter_queue, note_of
from .errors import InvalidArgument, InvalidPartition, InvalidQueueName, NotAuthorized, QueueEnabled, QueueNotFound
from .message import MAX_PARTITIONS, Message, MessageID, successor, topic_filter, topics_of_keys
from .queue import HQueue, TimeLike, as_message_id
from .scanner import Scan, read_columns
from .topic_index import config_for as topic_index_config

__all__ = ["HQueueAdmin"]


if TYPE_CHECKING:
    from .api import SubscriptionsAPI


class HQueueAdmin(Connected):
    """Administers the queues of one store.

    Args:
        url: ``local:///path`` (default: ``$HQUEUE_DATA`` or ``./hqueue-data``)
            ``hbase://host:9090``, or ``hqueue://[TOKEN@]host:9700[,…]``.
        data_dir: Shorthand for ``url="local://" + data_dir``.
        token: For hqueue servers, as in :class:`~hqueue.HQueue`.
        timeout: As in :class:`~hqueue.HQueue`.
        group_limits: For a store this process serves, as in :class:`~hqueue.HQueue`.
    """

    def create_queue(
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
        """Create a queue.

        Args:
            name: 1-196 characters of ``[A-Za-z0-9_.-]`` (so that ``<name>.dlq``, its
                dead-letter queue, is a legal name; 200 for a name ending in ``.dlq``).
            partitions: 1..32767, fixed for the queue's life.
            ttl: Seconds messages stay visible; 0 keeps them forever.
            config: Extra settings, e.g. ``{'hbase.hqueue.partitionsPerRegion': '4'}``.
            durability: ``SYNC_WAL`` (default), ``ASYNC_WAL`` or ``SKIP_WAL``;
                see :class:`~hqueue.config.Durability`.
            max_message_bytes: Largest topic + value accepted (default 4 MiB).
            topic_index: Keep a per-topic index (SPEC X4): a read of a few
                topics then costs their rows only, whatever else the queue
                holds; each put writes every message twice (config
                ``hqueue.topicIndex``).
            priorities: Priority tiers (SPEC X4): the partitions are split
                into this many equal bands, tier 0 (lowest) first; a put
                with ``priority=t`` goes to band t, and consumer groups serve
                higher tiers first without starving lower ones. Must divide
                ``partitions``. None: 1, or config ``hqueue.priorities`` (both, differing: refused).

        Raises:
            QueueExists: A queue of that name exists.
            InvalidQueueName: The name is not a legal queue name.
            TypeError: An argument of the wrong type.
            ValueError: An argument out of range (an ``InvalidArgument``).
        """
        info = new_queue_info(name, partitions, ttl, config, durability, max_message_bytes, topic_index, priorities)
        self.engine.create_queue(info)
        try:  # as stored: with what the store adds (hqueue.created, the topic index's hash)
            return self.engine.queue_info(name, fresh=True)
        except QueueNotFound:  # (deleted at once by another client)
            return info

    @names_a_queue
    def truncate_queue(self, name: str) -> None:
        """Delete every message; the queue and its partitions stay."""
        self.engine.truncate_queue(name)

    @names_a_queue
    def disable_queue(self, name: str) -> None:
        """Reject puts, scans and consumer groups' receives with QueueDisabled until enabled
        again. Its pending timers do not fire meanwhile (they fire once it is enabled), and
        its timers may still be listed, found and cancelled."""
        self.engine.set_state(name, QueueState.DISABLED)

    @names_a_queue
    def enable_queue(self, name: str) -> None:
        self.engine.set_state(name, QueueState.ENABLED)

    @names_a_queue
    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue and its messages.

        Like HBase's drop, the queue must be disabled first, so that a live
        queue is not dropped by accident; ``force=True`` disables it for you.

        Raises:
            QueueNotFound: No such queue.
            QueueEnabled: The queue is enabled and ``force`` is not set (or, with
                ``force``, other clients enabled it again FORCE_TRIES times as it was deleted).
        """
        tries = FORCE_TRIES if force else 1
        for attempt in range(tries):
            if force and self.engine.queue_info(name, fresh=True).enabled:
                with forced_disable():
                    self.disable_queue(name)
            try:
                self.engine.delete_queue(name)
                return
            except QueueEnabled:  # (forced: enabled, or made again, by another client meanwhile)
                if attempt == tries - 1:
                    raise

    @names_a_queue
    def queue_exists(self, name: str) -> bool:
        try:
            self.engine.queue_info(name, fresh=True)
        except (QueueNotFound, InvalidQueueName):  # a name no queue may have: none has it
            return False
        return True

    def list_queues(self) -> list[QueueInfo]:
        """Every queue's definition, sorted by name."""
        return self.engine.list_queues()

    @names_a_queue
    def describe_queue(self, name: str) -> dict[str, Any]:
        """Definition, state, a message count estimate and each partition's last ID."""
        return self.engine.describe_queue(name)

    # -- subscribers (SPEC C7) ---------------------------------------------------------

    def _server(self) -> SubscriptionsAPI:
        return self.subscriptions("subscriber administration")

    @names_a_queue
    def add_subscriber(
        self,
        queue: str,
        name: str,
        topics: Iterable[str | bytes] | None = None,
        partitions: Mapping[int, MessageID | None] | Iterable[int] | None = None,
        *,
        dead_letter_after: int | None = None,
    ) -> None:
        """Register a subscriber now: nothing written after this call is missed,
        even before the subscriber process starts.

        Args:
            topics: Topics it takes; None for all.
            partitions: Partition ids (from now), or ``{pid: start ID or None}``;
                None for all partitions, from now.
            dead_letter_after: See :class:`~hqueue.Subscription`.
        """
        self._server().add(queue, name, *subscriber_scope(topics, partitions), dead_letter_after)

    @names_a_queue
    def delete_subscriber(self, queue: str, name: str) -> None:
        """Forget a subscriber and its checkpoints (queue first, as every admin call)."""
        self._server().delete(queue, name)

    @names_a_queue
    def list_subscribers(self, queue: str) -> list[str]:
        return self._server().names(queue)

    @names_a_queue
    def describe_subscriber(self, queue: str, name: str) -> dict[str, Any]:
        """Address (None while away), topics, per-partition checkpoints and lag
        in messages (exact: every one is counted) and in milliseconds."""
        return self._server().describe(queue, name)

    @names_a_queue
    def replay_dead_letters(
        self, queue: str, start: TimeLike = None, stop: TimeLike = None, *, rate: float | None = None
    ) -> int:
        """Put the messages of ``<queue>.dlq`` in ``[start, stop)`` back on ``queue``
        (same partition, topic and value; new IDs); return how many.

        A copy: the dead letters stay until you truncate ``<queue>.dlq``, so a
        failure half-way loses nothing (run it again from where it stopped).
        Without ``stop`` it ends, in each partition of ``<queue>.dlq``, at the
        last dead letter there when it began: those that come meanwhile (its
        own copies failing again too) wait for the next replay. (It read on to
        the live end: copies that failed again came back to it, and a replay
        of 5 dead letters put back 46, and could go on for ever.)

        Args:
            rate: At most this many messages a second (None: as fast as the
                store takes them), so a replay does not swamp the queue's consumers.
        """
        if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0):
            raise InvalidArgument(f"'rate' must be a number > 0 (messages a second), got {rate!r}")
        engine, dlq = self.engine, dead_letter_queue(queue)
        partitions = engine.enabled_queue(queue).partitions
        scan = Scan(as_message_id(start, "start"), as_message_id(stop, "stop"))
        batch = 1000 if rate is None else max(1, min(1000, int(rate)))
        copied, began = 0, time.monotonic()
        if not self._has_dead_letters(queue):
            return 0
        letters = engine.queue_info(dlq, fresh=True).require_enabled()  # (read partition after partition)
        ends = None if scan.stop_id is not None else engine.describe_queue(dlq)["last_ids"]
        for pid in range(letters.partitions):  # of that dead-letter queue only (scanner.check_opened)
            if ends is not None:  # (up to its last dead letter now: none of those that come meanwhile)
                last = ends.get(pid)
                if last is None:
                    continue
                scan = Scan(scan.start_id, successor(last))
            for keys, values in read_columns(engine, dlq, pid, scan, batch, letters.created):
                for at in range(0, len(keys), batch):
                    messages = list(map(Message, topics_of_keys(keys[at : at + batch]), values[at : at + batch]))
                    if rate is not None:  # the next batch waits until the rate allows it
                        time.sleep(max(0.0, began + copied / rate - time.monotonic()))
                    copied += len(engine.put(queue, messages, pid % partitions))
        return copied

    @names_a_queue
    def dead_letters(
        self, queue: str, start: TimeLike = None, stop: TimeLike = None, *, limit: int = 100
    ) -> list[tuple[Message, int, DeadLetterNote | None]]:
        """The first ``limit`` dead letters of ``<queue>.dlq`` in ``[start, stop)``, each with
        the partition of ``queue`` a replay puts it on, and its note (where it came from, who
        sent it there, after how many attempts; None where the store is not open here, or
        for dead letters older than notes)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise InvalidArgument(f"'limit' must be an int in 1..10000, got {limit!r}")
        partitions = self.engine.enabled_queue(queue).partitions
        if not self._has_dead_letters(queue):
            return []
        with self.queue(dead_letter_queue(queue)) as dlq:
            letters = list(dlq.scan(start, stop, limit=limit))
        return [(m, m.partition_id % partitions, note_of(self.engine, queue, m.partition_id, m.id)) for m in letters]

    def _has_dead_letters(self, queue: str) -> bool:
        """Whether ``<queue>.dlq`` exists: it is made by the first dead letter (none: nothing to see;
        nor for a queue whose ``.dlq`` name is too long, a dead-letter queue of 197..200 characters)."""
        try:
            self.engine.queue_info(dead_letter_queue(queue))
        except (QueueNotFound, InvalidQueueName):
            return False
        return True

    # -- consumer groups (SPEC X3) -----------------------------------------------------

    @names_a_queue
    def list_groups(self, queue: str) -> list[str]:
        """The consumer groups of ``queue``."""
        return groups_of(self.engine).names(queue)

    @names_a_queue
    def describe_group(self, queue: str, group: str) -> dict[str, Any]:
        """Live members, and per partition: the completion cursor (``done``) and the
        scan cursor, messages in flight and retrying, retries so far, lag in
        messages (exact) and in ms of the oldest unfinished one;
        and the dead-letter queue's size."""
        return groups_of(self.engine).describe(queue, group)

    @names_a_queue
    def set_group_position(
        self, queue: str, group: str, partition: int | str | None, position: MessageID | datetime | int
    ) -> None:
        """Replay a consumer group (or skip ahead): it takes the partition (``"all"``/None:
        every one) again from ``position`` (a MessageID, a datetime or epoch ms), as
        if it had been made there; leases, retries and acks kept there are dropped."""
        groups_of(self.engine).set_position(queue, group, *position_of(partition, position))

    @names_a_queue
    def delete_group(self, queue: str, group: str) -> None:
        """Forget a consumer group and all its progress."""
        groups_of(self.engine).delete(queue, group)

    @names_a_queue
    def set_checkpoint(
        self, queue: str, name: str, partition: int | str | None, position: MessageID | datetime | int
    ) -> None:
        """Replay: deliver again from ``position`` (inclusive).

        Args:
            partition: A partition id, or ``"all"``/None for every partition.
            position: A MessageID, a datetime or epoch milliseconds.
        """
        self._server().set_checkpoint(queue, name, *position_of(partition, position))

    @names_a_queue
    def queue(self, name: str) -> HQueue:
        """A handle on queue ``name`` over the same store or servers, with the same
        credentials (close it when done, as any handle)."""
        return HQueue(name, **self._opened_with)

    def __repr__(self) -> str:
        return f"HQueueAdmin(url={self._engine.url if self._engine else None!r})"


def new_queue_info(
    name: str,
    partitions: int,
    ttl: int = 0,
    config: dict[str, str] | None = None,
    durability: str = Durability.SYNC_WAL,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    topic_index: bool = False,
    priorities: int | None = None,
) -> QueueInfo:
    """A new queue's definition, checked (:meth:`HQueueAdmin.create_queue`'s arguments)."""
    config = check_config(dict(config or {}))
    if not isinstance(topic_index, bool):  # ("false" made an indexed queue)
        raise TypeError(f"'topic_index' must be a bool, not {type(topic_index).__name__}")
    if priorities is not None and (not isinstance(priorities, int) or isinstance(priorities, bool)):
        raise TypeError(f"'priorities' must be an int, not {type(priorities).__name__}")  # (True and "2" were taken)
    said = config.get(PRIORITIES_KEY)
    if priorities is not None and said is not None and said != str(priorities):  # (one silently won)
        raise InvalidArgument(f"'priorities' is {priorities!r} and config {PRIORITIES_KEY!r} is {said!r}: give one")
    flag = config.get(TOPIC_INDEX_KEY)
    if topic_index and flag is not None and flag.lower() in FLAG_FALSE:  # (the argument silently won)
        raise InvalidArgument(f"'topic_index' is True and config {TOPIC_INDEX_KEY!r} is {flag!r}: give one")
    return QueueInfo(
        name=validate_new_queue_name(name),
        partitions=partitions,
        ttl=ttl,
        durability=durability,
        config=config
        | topic_index_config(topic_index)
        | ({PRIORITIES_KEY: str(priorities)} if priorities not in (None, 1) else {}),
        max_message_bytes=max_message_bytes,
    )


#: Disables and deletes a forced delete_queue tries while other clients enable the queue (or
#: make it again) between its disable and its delete: it said QueueEnabled, "must be
#: disabled", though forced (an attacker's pass).
FORCE_TRIES = 3


@contextlib.contextmanager
def forced_disable() -> Iterator[None]:
    """The disable of ``delete_queue(force=True)``: a refusal says it was the delete's (it named
    only the disable, a call the user did not make)."""
    try:
        yield
    except NotAuthorized as e:
        raise NotAuthorized(f"{e}: a forced delete disables the queue before it deletes it") from e


def subscriber_scope(
    topics: Iterable[str | bytes] | None, partitions: Mapping[int, MessageID | None] | Iterable[int] | None
) -> tuple[frozenset[bytes] | None, dict[int, MessageID | None] | None]:
    """(topics, starts) of :meth:`HQueueAdmin.add_subscriber`'s arguments."""
    if isinstance(topics, (str, bytes)):
        raise TypeError("'topics' must be a collection of topics, not one topic")
    starts: dict[int, MessageID | None] | None = None
    if partitions is not None:
        if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Iterable):
            raise TypeError(f"'partitions' must be partition ids or {{pid: start}}, not {type(partitions).__name__}")
        given = dict(partitions) if isinstance(partitions, Mapping) else dict.fromkeys(partitions)
        starts = {}
        for pid, start in given.items():  # (checked here: through a server these failed as decode errors)
            if not isinstance(pid, int) or isinstance(pid, bool):
                raise TypeError(f"a partition id in 'partitions' must be an int, not {type(pid).__name__}")
            if not 0 <= pid < MAX_PARTITIONS:
                raise InvalidPartition(f"a partition id in 'partitions' must be in 0..{MAX_PARTITIONS - 1}, got {pid}")
            starts[pid] = as_message_id(start, "partitions")
    return (frozenset(topic_filter(t) for t in topics) if topics is not None else None), starts


def position_of(partition: int | str | None, position: MessageID | datetime | int) -> tuple[int | None, MessageID]:
    """(partition or None for all, start) of a replay's arguments."""
    start = as_message_id(position, "position")
    if start is None:
        raise TypeError("'position' is required")
    pid = None if partition in (None, "all") else partition
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise TypeError(f"'partition' must be an int, 'all' or None, not {partition!r}")
    if pid is not None and pid < 0:  # (on the wire, -1 is "all": a replay of every partition)
        raise InvalidPartition(f"'partition' must be a partition id >= 0, 'all' or None, got {pid}")
    return pid, start
