"""Subscriber registrations (SPEC C7): what a subscriber takes, and how far it got.

A :class:`Registration` is persistent (it outlives the subscriber process):
its topics, its partitions and, per partition, a checkpoint: the first ID
not yet delivered. The subscriber's *presence* (its address while it runs)
is not: it vanishes when the subscriber leaves or dies.

Two backends keep them: ZooKeeper (``zk_registry.py``), for servers that
coordinate there, and the store (``store_registry.py``), for a single server
without ZooKeeper. Either way presence is a heartbeat the subscriber sends a
server every second; with ZooKeeper that server writes it there, in an
ephemeral node of its own session, for every server to see.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..auth import PushCredentials
from ..errors import SubscriberActive
from ..message import MessageID

__all__ = ["Registration", "SubscriberRegistry"]


#: Seconds between two changes of one subscriber's presence (made, ended, moved, or its
#: topics) by one server: each makes the deliveries reconcile, and a token that changed
#: it in a loop made every server reconcile on each.
PRESENCE_CHANGE_INTERVAL = 1.0


class PresenceChanges:
    """When this server last changed each subscriber's presence, ``(queue, name)``: at most
    one change every PRESENCE_CHANGE_INTERVAL (both registries)."""

    def __init__(self) -> None:
        self._at: dict[tuple[str, str], float] = {}

    def check(self, key: tuple[str, str], now: float) -> None:
        """Raise SubscriberActive while the last change of ``key`` is too recent."""
        if now - self._at.get(key, -PRESENCE_CHANGE_INTERVAL) < PRESENCE_CHANGE_INTERVAL:
            raise SubscriberActive(
                f"the presence of subscriber {key[1]!r} on {key[0]!r} changed less than "
                f"{PRESENCE_CHANGE_INTERVAL:g}s ago: try again"
            )

    def made(self, key: tuple[str, str], now: float) -> None:
        self._at[key] = now

    def forget(self, key: tuple[str, str]) -> None:
        self._at.pop(key, None)

    def prune(self, now: float) -> None:
        """Forget the changes long enough ago to allow the next."""
        self._at = {key: at for key, at in self._at.items() if now - at < PRESENCE_CHANGE_INTERVAL}


@dataclass(frozen=True)
class Registration:
    """A subscriber's registration on one queue.

    Attributes:
        queue, name: Which subscriber.
        topics: Topics it takes; None for all.
        partitions: Partitions it takes; None for all.
        checkpoints: Per partition, the first ID not yet delivered.
        address: ``host:port`` while the subscriber is attached, else None.
        live_topics: The topics the attached subscriber asked for, which
            override ``topics`` while it is attached.
        epoch: Bumped by a replay (``set_checkpoint``): workers of an older
            epoch stop and never save their checkpoints over the new ones.
        dead_letter_after: Refusals by the subscriber a message may take before
            it goes to the dead-letter queue ``<queue>.dlq``; None: retry forever.
        push: The key (and TLS certificate) the attached subscriber announced
            (push.py); servers never push to one without.
        approved: Addresses a server checked when a subscriber announced them
            through it (``approveSubscriberAddress``, or the heartbeat's own);
            servers push only to these, or into their ``--subscriber-allow`` networks.
        made: Random, given when it is registered (kept while it is, and not by one
            registered again after a delete): with ``epoch``, it names its dead letters'
            idempotent puts (delivery.py). Empty for one registered before hqueue kept it.
    """

    queue: str
    name: str
    topics: frozenset[bytes] | None = None
    partitions: frozenset[int] | None = None
    checkpoints: dict[int, MessageID] = field(default_factory=dict)
    address: str | None = None
    live_topics: frozenset[bytes] | None = None
    epoch: int = 0
    dead_letter_after: int | None = None
    push: PushCredentials | None = None
    approved: tuple[str, ...] = ()
    made: str = ""

    @property
    def attached(self) -> bool:
        return bool(self.address)

    @property
    def effective_topics(self) -> frozenset[bytes] | None:
        return self.live_topics if self.attached and self.live_topics is not None else self.topics

    def takes(self, partition_id: int) -> bool:
        return self.partitions is None or partition_id in self.partitions

    def with_checkpoints(self, checkpoints: dict[int, MessageID]) -> Registration:
        return replace(self, checkpoints={**self.checkpoints, **checkpoints})

    def to_json(self) -> bytes:
        """The persistent part (no presence)."""
        return json.dumps(
            {
                "topics": encode_topics(self.topics),
                "partitions": sorted(self.partitions) if self.partitions is not None else None,
                "checkpoints": {str(p): str(i) for p, i in sorted(self.checkpoints.items())},
                "epoch": self.epoch,
                "dead_letter_after": self.dead_letter_after,
                "approved": list(self.approved),
                "made": self.made,
            }
        ).encode()

    @classmethod
    def from_json(cls, queue: str, name: str, data: bytes) -> Registration:
        """Raises ValueError (TypeError, KeyError, AttributeError) for data it is not."""
        raw = read_json(data)
        return cls(
            queue=queue,
            name=name,
            topics=decode_topics(raw.get("topics")),
            partitions=frozenset(raw["partitions"]) if raw.get("partitions") is not None else None,
            checkpoints={int(p): MessageID.parse(i) for p, i in raw.get("checkpoints", {}).items()},
            epoch=raw.get("epoch", 0),
            dead_letter_after=raw.get("dead_letter_after"),
            approved=tuple(a for a in raw.get("approved", ()) if isinstance(a, str)),
            made=made if isinstance(made := raw.get("made", ""), str) else "",
        )


def read_json(data: bytes) -> Any:
    """JSON stored in ZooKeeper or the store, where hands (or a planter) may write too: one
    nested too deep for the decoder is a ValueError, as other malformed data is (a
    RecursionError went past every handler: it stopped every subscriber's pushes)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"JSON of {len(data)} bytes nested too deep") from None


def encode_topics(topics: Iterable[bytes] | None) -> list[str] | None:
    # latin-1 maps every byte to one code point: any binary topic survives JSON.
    return sorted(t.decode("latin-1") for t in topics) if topics is not None else None


def decode_topics(topics: list[str] | None) -> frozenset[bytes] | None:
    return frozenset(t.encode("latin-1") for t in topics) if topics is not None else None


class SubscriberRegistry(abc.ABC):
    """Where registrations and presence live, for the server."""

    #: How subscribers announce themselves (``getCoordination``): by heartbeats to a server, with
    #: either registry (a server older than this version answered ``"zk:<hosts>"`` with ZooKeeper).
    coordination = "server"

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when registrations or presence may have changed."""
        self._listeners.append(listener)

    def changed(self) -> None:
        """Tell the listeners (the server's workers) to look again."""
        for listener in self._listeners:
            listener()

    @abc.abstractmethod
    def create(self, registration: Registration) -> None:
        """Store a new registration; raises SubscriberExists."""

    @abc.abstractmethod
    def load(self, queue: str, name: str) -> Registration:
        """The registration with its presence; raises SubscriberNotFound."""

    @abc.abstractmethod
    def update(self, queue: str, name: str, change: Callable[[Registration], Registration]) -> Registration:
        """Apply ``change`` to the stored registration atomically."""

    @abc.abstractmethod
    def remove(self, queue: str, name: str) -> None:
        """Delete the registration; raises SubscriberNotFound."""

    @abc.abstractmethod
    def names(self, queue: str) -> list[str]:
        """Registered subscriber names of ``queue``, sorted."""

    @abc.abstractmethod
    def attached(self) -> list[Registration]:
        """Every registration whose subscriber is attached now."""

    @abc.abstractmethod
    def heartbeat(
        self, queue: str, name: str, address: str, topics: frozenset[bytes] | None, push: PushCredentials
    ) -> None:
        """Presence by heartbeat (the caller checked ``address``); SubscriberActive while
        another instance's presence is live."""

    @abc.abstractmethod
    def leave(self, queue: str, name: str, push: PushCredentials | None = None) -> None:
        """End presence by heartbeat (only if it is still ``push``'s, when given: an instance
        replaced since must not end the new one's)."""

    #: How many approved addresses a registration keeps (the latest).
    MAX_APPROVED = 8

    def approve(self, queue: str, name: str, address: str) -> None:
        """Record an address a server checked (see :attr:`Registration.approved`)."""

        def change(registration: Registration) -> Registration:
            if address in registration.approved:
                return registration
            return replace(registration, approved=(*registration.approved, address)[-self.MAX_APPROVED :])

        self.update(queue, name, change)

    def save_checkpoints(self, queue: str, name: str, checkpoints: dict[int, MessageID], of: Registration) -> bool:
        """Merge the checkpoints of a worker of registration ``of``; False (nothing saved) if a
        replay started a new epoch meanwhile, or the subscriber was deleted and registered again
        (its ``made``: a worker of the deleted one, still stopping, moved the new one's start)."""
        saved = True

        def change(registration: Registration) -> Registration:
            nonlocal saved
            saved = (registration.epoch, registration.made) == (of.epoch, of.made)
            return registration.with_checkpoints(checkpoints) if saved else registration

        self.update(queue, name, change)
        return saved

    def replay(self, queue: str, name: str, checkpoints: dict[int, MessageID]) -> None:
        """Move checkpoints back (or forward) and start a new epoch."""
        self.update(queue, name, lambda r: replace(r.with_checkpoints(checkpoints), epoch=r.epoch + 1))
        self.changed()

    def close(self) -> None:  # noqa: B027 - optional
        pass
