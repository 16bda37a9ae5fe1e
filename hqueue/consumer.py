"""Work-queue consumption by consumer groups (SPEC X2, X3): receive, then ack or nack.

::

    with HQueue("orders") as queue, queue.consumer("billing") as consumer:
        for delivery in consumer:              # waits for work
            bill(delivery.value)
            consumer.ack(delivery)             # never handed out to "billing" again

Each message goes to one member of a group at a time, under a lease; one
not acked before its lease runs out (a crashed or stuck member) goes to
another member. ``nack`` gives it back at once or after a delay; past
``max_retries`` failures it goes to the dead-letter queue ``<queue>.dlq``.
Every group gets every message. The state lives with the partitions' owners
(:mod:`hqueue.groups`): the process that opened an embedded store, or the
hqueue servers.

Once it has received, an open consumer heartbeats every second from a thread
of its own, so that a slow handler does not make it look gone; a member that
is gone (silent past the server's member timeout, 10 s by default, or whose
connections closed: its process died) has its leases end at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import partial
from itertools import repeat
from operator import getitem
from typing import TYPE_CHECKING, Any, NamedTuple

from . import forks
from .api import groups_of
from .config import UNSEEN
from .errors import GroupNotFound, HQueueError, InvalidArgument, QueueNotFound, ServerUnavailable
from .groups.affinity import check_key_affinity
from .groups.limits import (
    DEFAULT_LEASE,
    DEFAULT_MAX_RETRIES,
    HEARTBEAT_INTERVAL,
    check_delay,
    check_group_name,
    check_lease,
    check_max_messages,
    check_max_retries,
    check_member,
    check_wait,
)
from .groups.state import start_ms
from .message import ROWKEY_LENGTH, Message, MessageID, Topic, topic_filter

if TYPE_CHECKING:
    from .api import QueueHandle
    from .client.ahead import GroupAhead

__all__ = ["Consumer", "Delivery", "Pending"]

logger = logging.getLogger(__name__)


class Pending(NamedTuple):
    """A message a consumer group has handed out and not finished (:meth:`HQueue.pending
    <hqueue.HQueue.pending>`), as Redis's XPENDING or Kafka's in-flight records show it.

    Attributes:
        partition_id, id: The message.
        member: The member holding its lease; None while it waits to be retried.
        attempt: 1 on its first delivery, then one more per failure.
        lease_left: Seconds its lease has left (None while it waits).
        retry_in: Seconds before it goes out again (None while leased).
    """

    partition_id: int
    id: MessageID
    member: str | None
    attempt: int
    lease_left: float | None
    retry_in: float | None


class Delivery(tuple):
    """A message handed to this member, to ack or nack: ``(message, attempt)``.

    Attributes:
        message: The message, with its ID and partition.
        attempt: 1 on its first delivery to the group, then one more per failure.
    """

    __slots__ = ()

    def __new__(cls, message: Message, attempt: int) -> Delivery:
        return tuple.__new__(cls, (message, attempt))

    @property
    def message(self) -> Message:
        return self[0]

    @property
    def attempt(self) -> int:
        return self[1]

    @property
    def id(self) -> MessageID:
        return self[0].id

    @property
    def partition_id(self) -> int:
        return self[0].partition_id

    @property
    def topic(self) -> Topic:
        return self[0].topic

    @property
    def value(self) -> bytes:
        return self[0].value

    @property
    def rowkey(self) -> bytes:
        """What ack and nack send: the message's 12-byte rowkey (SPEC C1)."""
        return self[0][1][:ROWKEY_LENGTH]

    def __repr__(self) -> str:
        return f"Delivery({self.message!r}, attempt={self.attempt})"


_deliveries = partial(map, partial(tuple.__new__, Delivery))
_ROWKEY = slice(0, ROWKEY_LENGTH)


def _rowkeys(items: Delivery | Message | Iterable[Delivery | Message]) -> list[bytes]:
    if isinstance(items, (Delivery, Message)):
        items = [items]
    elif isinstance(items, (str, bytes, bytearray)) or not isinstance(items, Iterable):
        raise TypeError(f"ack and nack take received Deliveries (or Messages with IDs), not {type(items).__name__}")
    if isinstance(items, list) and items and set(map(type, items)) == {Delivery}:  # what receive gave: in C
        return list(map(getitem, map(getitem, map(getitem, items, repeat(0)), repeat(1)), repeat(_ROWKEY)))
    rowkeys = []
    for item in items:
        message = item[0] if isinstance(item, Delivery) else item
        rowkey = message.rowkey if isinstance(message, Message) else None
        if rowkey is None or message.partition_id is None:
            raise TypeError(f"ack and nack take received Deliveries (or Messages with IDs), not {item!r}")
        rowkeys.append(rowkey)
    return rowkeys


class Joining(NamedTuple):
    """What a member opens its group with (checked): the group's settings if it is new."""

    topics: frozenset[bytes] | None
    start: int
    max_retries: int
    key_affinity: str | None


def joining(
    group: str,
    topics: Iterable[str | bytes] | None,
    start: str | datetime | int,
    max_retries: int,
    key_affinity: str | None,
) -> Joining:
    """The arguments of :class:`Consumer` (and the async one) that open its group, checked
    here, before any call (a server's IDL carries ``max_retries`` as an i32: 1.5 went as 1)."""
    check_group_name(group)
    if isinstance(topics, (str, bytes)):
        raise TypeError("'topics' must be a collection of topics, not one topic")
    chosen = None if topics is None else frozenset(map(_group_topic, topics))
    if chosen is not None and not chosen:  # (a group of no topic would take nothing; on the wire, all)
        raise InvalidArgument("'topics' names no topic: give at least one, or None for all of them")
    return Joining(chosen, start_ms(start), check_max_retries(max_retries), check_key_affinity(key_affinity))


def _group_topic(topic: object) -> bytes:
    if not isinstance(topic, (str, bytes)) or not topic:
        raise InvalidArgument("'topics' must be non-empty str or bytes")
    return topic_filter(topic)


def member_name(member: str | None) -> str:
    """``member`` (checked), or, for None, a name unique to this process and call."""
    if member is None:
        return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return check_member(member)


class Consumer:
    """One member of a consumer group; make it with :meth:`HQueue.consumer <hqueue.HQueue.consumer>`.

    Args:
        queue: The queue to consume.
        group: The group's name; made on first use.
        topics: Topics the group takes (None: all). Fixed when the group is made.
        start: Where a new group starts: ``"earliest"`` (default), ``"latest"``,
            a datetime or epoch ms. Ignored for an existing group.
        max_retries: Failures a message may have beyond its first delivery
            before it goes to ``<queue>.dlq`` (default 16). Fixed when the group is made.
        lease: Seconds a received message stays with this member (default 30;
            the server gives at most its maximum, 60 s by default).
        member: This member's name (default: host, pid and a random part).
        key_affinity: Make the group hand each key's messages out in order, one
            member at a time, across retries, nacks and members that die:
            ``"topic"`` (the key is the topic) or ``"partition"`` (one key per
            partition); see :mod:`hqueue.groups.affinity`. Fixed when the group
            is made; None (default) joins an existing group as it is.
        prefetch: Over a server (``hqueue://``, or a ``local://`` store another
            process serves), ask for the next batch as soon as ``receive``
            hands out a whole one, so that the server takes it out while this
            member works (default False); where one server owns the queue's
            partitions, the first ``ack`` after it asks, in its own call. Its
            leases run from then: a batch
            whose lease has run a quarter before the next ``receive`` goes
            back unseen and a fresh one is taken (:mod:`hqueue.client.ahead`).
            No effect on a store this process opened (no round trip to save).
    """

    def __init__(
        self,
        queue: QueueHandle,
        group: str,
        topics: Iterable[str | bytes] | None = None,
        *,
        start: str | datetime | int = "earliest",
        max_retries: int = DEFAULT_MAX_RETRIES,
        lease: float = DEFAULT_LEASE,
        member: str | None = None,
        key_affinity: str | None = None,
        prefetch: bool = False,
    ) -> None:
        self.queue, self.group, self.lease = queue, group, check_lease(lease)
        #: Seconds of lease the store granted at the last receive: the one asked, at most its
        #: ``--max-lease`` (60 s by default), which cuts a longer one without a word.
        self.granted_lease = self.lease
        if not isinstance(prefetch, bool):
            raise TypeError(f"'prefetch' must be True or False, not {prefetch!r}")
        self.member = member_name(member)
        self._groups_here = groups_of(queue.engine)
        self._fork = forks.generation()  # (not carried across fork(): forks.py)
        self._groups.open(queue.name, group, *joining(group, topics, start, max_retries, key_affinity))
        self.closed = False
        self._ahead = _ahead(self._groups_here, queue.name, group, self.member, prefetch)
        self._heartbeats: threading.Thread | None = None
        self._stopped = threading.Event()

    @property
    def _groups(self) -> Any:
        """The groups of the consumer's store: not in a process forked after it was made."""
        forks.check(self._fork, "this Consumer")
        return self._groups_here

    def receive(self, max_messages: int = 100, *, wait: float = 1.0, lease: float | None = None) -> list[Delivery]:
        """Up to ``max_messages`` messages, waiting up to ``wait`` seconds for the first.
        Closed meanwhile (from another thread), it returns none."""
        if self.closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._heartbeats is None:
            self._start_heartbeats()
        lease, wait = check_lease(self.lease if lease is None else lease), check_wait(wait)
        check_max_messages(max_messages)
        groups = self._groups  # (refused in a forked child)
        if self._ahead is not None:
            pairs = self._ahead.receive(max_messages, lease, wait)
        else:
            pairs = groups.receive(self.queue.name, self.group, self.member, max_messages, lease, wait)
        limits = getattr(groups, "limits", None)  # (in this process: its own; a server says in its answer)
        self.granted_lease = getattr(pairs, "lease", None) or (lease if limits is None else limits.lease(lease))
        if self.closed:  # it raced the close's leave, which it may have undone: leave again (what it took goes back)
            with contextlib.suppress(HQueueError, RuntimeError):  # (its store gone: the leases with it)
                self._groups.leave(self.queue.name, self.group, self.member)
            return []
        return list(_deliveries(pairs))

    def ack(self, deliveries: Delivery | Message | Iterable[Delivery | Message]) -> int:
        """Mark messages done: the group never gets them again. Returns how many were still open.

        Only messages the group handed out count (to any member); a receipt it
        never handed out is ignored (the server counts it), so the group
        still delivers that message."""
        groups = self._groups  # (refused in a forked child)
        if self._ahead is not None:  # (prefetching: it may ask for the next batch in the call)
            return self._ahead.ack(_rowkeys(deliveries))
        return groups.ack(self.queue.name, self.group, _rowkeys(deliveries))

    def nack(self, deliveries: Delivery | Message | Iterable[Delivery | Message], *, delay: float | None = None) -> int:
        """Give messages back: handed out again after ``delay`` seconds (None: a
        backoff of 1 s doubling per failure, at most 10 minutes). Counts as a failure."""
        return self._groups.nack(self.queue.name, self.group, self.member, _rowkeys(deliveries), check_delay(delay))

    def extend(
        self, deliveries: Delivery | Message | Iterable[Delivery | Message], *, lease: float | None = None
    ) -> int:
        """Renew the leases this member holds: each runs ``lease`` seconds (None: the
        consumer's lease) from now, at most the server's ``--max-lease``. For work
        that outlasts its lease (NATS's "in progress"). Returns how many were
        renewed: not those whose lease ran out already (the group may have handed
        them to another member), nor finished ones."""
        lease = check_lease(self.lease if lease is None else lease)
        return self._groups.extend(self.queue.name, self.group, self.member, _rowkeys(deliveries), lease)

    def dead_letter(self, deliveries: Delivery | Message | Iterable[Delivery | Message]) -> int:
        """Move messages to ``<queue>.dlq`` now, whatever their retries, and finish them.

        For a message that will never succeed. The partition's owner writes
        the dead-letter queue (making it if missing), so a consumer's token is
        enough. Any message the group handed out and has not finished goes,
        even one whose lease ran out meanwhile; returns how many (0 for one
        already acked or dead-lettered, or never handed out).

        Raises:
            NotPartitionOwner: the dead-letter queue was just made and its
                partitions are not served yet (a cluster): try again soon.
        """
        return self._groups.dead_letter(self.queue.name, self.group, self.member, _rowkeys(deliveries))

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries as they come, until :meth:`close`. Ack each one. Left early (``break``),
        the rest of the batch it was going through goes back to the group once the
        generator is closed, unseen: at once, counting no delivery attempt."""
        while not self.closed:
            batch = self.receive(wait=1.0)
            given = 0
            try:
                for delivery in batch:
                    given += 1
                    yield delivery
            finally:
                if given < len(batch) and not self.closed:
                    self._hand_back_unseen(batch[given:])

    def give_back(self, deliveries: Delivery | Message | Iterable[Delivery | Message]) -> int:
        """Give leases back unhandled: handed out again at once, counting no failure (as a
        member that leaves gives its leases back). Only leases this member holds go; returns
        how many."""
        return self._groups.nack(self.queue.name, self.group, self.member, _rowkeys(deliveries), UNSEEN)

    def _hand_back_unseen(self, deliveries: list[Delivery]) -> None:
        try:
            self.give_back(deliveries)
        except Exception as e:  # their leases run out instead
            logger.warning("consumer %s: handing back %d deliveries not iterated: %s", self.member, len(deliveries), e)

    def close(self) -> None:
        """Leave the group: leases still held go back to the others at once."""
        if not self.closed:
            self.closed = True
            self._stopped.set()
            if self._fork == forks.generation():  # (in a forked child, the member is the parent's)
                try:
                    if self._ahead is not None:
                        self._ahead.close()  # (what it asked ahead: read first, so the leave gives it back)
                finally:
                    # (gone, its queue with it maybe: nothing to leave; a store or server that does not
                    # answer: the leases run out there, as a remote leave's at an owner that does not)
                    with contextlib.suppress(GroupNotFound, QueueNotFound, ServerUnavailable):
                        self._groups.leave(self.queue.name, self.group, self.member)

    def _start_heartbeats(self) -> None:
        self._heartbeats = threading.Thread(
            target=_heartbeat, args=(weakref.ref(self), self._stopped), name="hqueue-heartbeat", daemon=True
        )
        self._heartbeats.start()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.queue.name!r}, {self.group!r}, member={self.member!r})"


def _ahead(groups: Any, queue: str, group: str, member: str, prefetch: bool) -> GroupAhead | None:
    """The member's batch asked ahead: with ``prefetch``, over a server only (the client,
    and Thrift, load on demand: not for a store in this process)."""
    if not prefetch:
        return None
    from .client.ahead import GroupAhead
    from .client.groups import RemoteGroups

    return GroupAhead(groups, queue, group, member) if isinstance(groups, RemoteGroups) else None


def _heartbeat(ref: weakref.ref[Consumer], stopped: threading.Event) -> None:
    """Tell the group the member is there, every HEARTBEAT_INTERVAL, until it closes
    (or is dropped: the thread holds it weakly)."""
    while not stopped.wait(HEARTBEAT_INTERVAL):
        consumer = ref()
        if consumer is None:
            return
        try:
            consumer._groups.heartbeat(consumer.queue.name, consumer.group, consumer.member)
        except Exception as e:  # a server away: the next beat, or the leases end
            logger.debug("consumer %s: heartbeat failed: %s", consumer.member, e)
        del consumer
