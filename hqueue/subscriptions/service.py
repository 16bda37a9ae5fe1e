"""The push-subscription service: register, describe, replay, presence (SPEC C5-C7).

One :class:`Subscribers` is attached to an engine as ``engine.subscriptions``
by whoever serves the partitions: ``hqueue server`` (registrations in
ZooKeeper or the store), or the process that opened an embedded store
(local.py). Delivery itself is delivery.py.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..auth import PushCredentials
from ..checks import check_name, check_partition
from ..engine import Engine
from ..errors import InvalidArgument, LimitExceeded, SubscriberExists, SubscriberNotFound
from ..lag import partition_lag
from ..message import MessageID, successor
from .registry import Registration, SubscriberRegistry

#: Subscribers one queue may have registered (a consumer token may register them; each
#: costs every server's reconciling a look).
MAX_SUBSCRIBERS_PER_QUEUE = 1_000

#: Topics one subscription may name, and their bytes in all: its registration and presence
#: are nodes in ZooKeeper (1 MB at most a request: a bigger one cut servers' sessions).
MAX_TOPICS, MAX_TOPICS_BYTES = 1_000, 64 * 1024


def check_topics(topics: frozenset[bytes] | None) -> None:
    if topics is not None and (len(topics) > MAX_TOPICS or sum(map(len, topics)) > MAX_TOPICS_BYTES):
        raise InvalidArgument(
            f"a subscription takes at most {MAX_TOPICS} topics of {MAX_TOPICS_BYTES} bytes in all, "
            f"got {len(topics)} of {sum(map(len, topics))}"
        )


def check_dead_letter_after(value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidArgument(f"'dead_letter_after' must be an int >= 1 or None, got {value!r}")


class Subscribers:
    """The calls of push subscriptions, over a registry and the engine.

    Args:
        in_use: Called before the first registration or heartbeat, to start
            delivery only once a subscriber exists (a store in this process).
    """

    def __init__(self, engine: Engine, registry: SubscriberRegistry, in_use: Callable[[], None] | None = None) -> None:
        self.engine, self.registry = engine, registry
        self._in_use = in_use

    def _used(self) -> None:
        if self._in_use is not None:
            self._in_use()

    def names(self, queue: str) -> list[str]:
        self.engine.queue_info(queue, fresh=True)  # a missing queue says so
        return self.registry.names(queue)

    def coordination(self, queue: str) -> str:
        """How subscribers of ``queue`` announce themselves: ``"server"`` (heartbeats; an older
        server with ZooKeeper answered ``"zk:<hosts>"``: they wrote their presence there)."""
        return self.registry.coordination

    def registration(self, queue: str, name: str) -> Registration:
        """``name``'s registration on ``queue``: SubscriberNotFound (QueueNotFound) if there is none."""
        self._used()
        check_name("subscriber", name)
        return self.registry.load(queue, name)

    def heartbeat(
        self, queue: str, name: str, address: str, topics: frozenset[bytes] | None, push: PushCredentials
    ) -> None:
        """Presence (with ZooKeeper too, where the server writes it); the caller checked
        ``address`` (the server's push policy)."""
        self._used()
        check_name("subscriber", name)
        if not isinstance(push, PushCredentials):
            raise InvalidArgument("a heartbeat carries the subscriber's push key")
        topics = frozenset(topics) if topics else None
        check_topics(topics)
        self.registry.heartbeat(queue, name, address, topics, push)

    def approve(self, queue: str, name: str, address: str, push: PushCredentials) -> None:
        """Record an address the caller checked, before the subscriber announces it
        (and ``push``) in ZooKeeper."""
        self._used()
        check_name("subscriber", name)
        if not isinstance(push, PushCredentials):
            raise InvalidArgument("an announcement carries the subscriber's push key")
        self.registry.approve(queue, name, address)

    def leave(self, queue: str, name: str, push: PushCredentials | None = None) -> None:
        """End the presence (only if it is still ``push``'s, when given)."""
        check_name("subscriber", name)
        self.registry.leave(queue, name, push)

    def _now(self, queue: str, partition_id: int) -> MessageID:
        """Where "from now" starts: after the partition's last message.

        Every ID given later is above the last stored one (allocators are
        seeded from storage), so nothing written after this is missed, even
        when a server with a slower clock takes the partition over.
        """
        last = self.engine.last_id(queue, partition_id)
        return successor(last) if last else MessageID(0)

    def add(
        self,
        queue: str,
        name: str,
        topics: frozenset[bytes] | None,
        starts: dict[int, MessageID | None] | None,
        dead_letter_after: int | None = None,
        create_only: bool = False,
    ) -> Registration:
        """Register ``name`` (or update its topics, partitions, dead-letter limit and given starts;
        ``create_only``: not, SubscriberExists instead)."""
        self._used()
        check_name("subscriber", name)
        topics = frozenset(topics) if topics else None  # (none named: all of them, as a heartbeat takes it)
        check_topics(topics)
        check_dead_letter_after(dead_letter_after)
        info = self.engine.queue_info(queue, fresh=True)
        for pid in starts or {}:
            check_partition(info, pid)
        partitions = frozenset(starts) if starts is not None else None
        given = {pid: start for pid, start in (starts or {}).items() if start is not None}
        fresh = Registration(
            queue, name, topics, partitions, dead_letter_after=dead_letter_after, made=secrets.token_hex(8)
        )
        checkpoints = {pid: self._now(queue, pid) for pid in range(info.partitions) if fresh.takes(pid)}
        registered = self.registry.names(queue)
        if len(registered) >= MAX_SUBSCRIBERS_PER_QUEUE and name not in registered:
            raise LimitExceeded(
                "max_subscribers_per_queue", MAX_SUBSCRIBERS_PER_QUEUE,
                f"queue {queue!r} has {len(registered)} subscribers registered: delete one first",
            )  # fmt: skip
        try:
            self.registry.create(fresh.with_checkpoints({**checkpoints, **given}))
        except SubscriberExists:
            if create_only:
                raise

            # Registered before: keep its checkpoints, except where a start is given, and what its
            # attached process announced. A start given is a replay: a new epoch, so that running
            # workers stop and never save their own positions over it (the epoch went back to 0).
            def change(old: Registration) -> Registration:
                missing = {p: c for p, c in checkpoints.items() if p not in old.checkpoints}
                kept = replace(
                    old, topics=topics, partitions=partitions, dead_letter_after=dead_letter_after,
                    epoch=old.epoch + 1 if given else old.epoch,
                )  # fmt: skip
                return kept.with_checkpoints({**missing, **given})

            self.registry.update(queue, name, change)
        return self.registry.load(queue, name)

    def delete(self, queue: str, name: str) -> None:
        check_name("subscriber", name)  # (every call, not add alone: a path in ZooKeeper is made of it)
        try:
            self.registry.remove(queue, name)
        except SubscriberNotFound:
            self.engine.queue_info(queue, fresh=True)  # a missing queue says so first
            raise

    def set_checkpoint(self, queue: str, name: str, partition_id: int | None, start: MessageID) -> None:
        """Replay: deliver again from ``start`` (inclusive); None: every partition."""
        check_name("subscriber", name)
        info = self.engine.queue_info(queue, fresh=True)
        if partition_id is not None:
            check_partition(info, partition_id)
        registration = self.registry.load(queue, name)
        if partition_id is not None and not registration.takes(partition_id):
            raise InvalidArgument(
                f"subscriber {name!r} of {queue!r} does not take partition {partition_id} "
                f"(it takes {sorted(registration.partitions or ())}): its checkpoint there would never be read"
            )
        pids = (
            [partition_id] if partition_id is not None else [p for p in range(info.partitions) if registration.takes(p)]
        )
        # A new epoch: running workers (on every server) restart from these.
        self.registry.replay(queue, name, dict.fromkeys(pids, start))

    def describe(self, queue: str, name: str) -> dict[str, Any]:
        """Address, topics, checkpoints and lag per partition (see :func:`partition_lag`)."""
        check_name("subscriber", name)
        info = self.engine.queue_info(queue, fresh=True)  # (a missing queue says so first)
        registration = self.registry.load(queue, name)
        lag_messages, lag_millis = {}, {}
        for pid in range(info.partitions):
            if registration.takes(pid):
                checkpoint = registration.checkpoints.get(pid, MessageID(0))
                lag_messages[pid], lag_millis[pid] = partition_lag(
                    self.engine, queue, pid, checkpoint, registration.effective_topics, limit=None
                )
        return {
            "name": name,
            "queue": queue,
            "address": registration.address,
            "topics": registration.effective_topics,
            "partitions": registration.partitions,
            "checkpoints": registration.checkpoints,
            "lag_messages": lag_messages,
            "lag_millis": lag_millis,
        }
