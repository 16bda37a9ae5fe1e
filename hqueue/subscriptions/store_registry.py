"""Registrations kept in the store, presence by heartbeat (one server, no ZooKeeper).

Registrations are JSON under ``subscribers/<queue>/<name>`` in the store's
metadata. A subscriber is attached while it heartbeats (every second); it
counts as gone ``presence_timeout`` seconds after its last one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from ..auth import PushCredentials
from ..errors import SubscriberActive, SubscriberExists, SubscriberNotFound
from ..storage import Storage
from .registry import PresenceChanges, Registration, SubscriberRegistry

PREFIX = "subscribers/"


class Presence(NamedTuple):
    """An attached subscriber, as its last heartbeat said."""

    address: str
    topics: frozenset[bytes] | None
    push: PushCredentials
    seen: float


class StoreRegistry(SubscriberRegistry):
    """Registrations in the store; presence in memory, by heartbeat."""

    def __init__(self, storage: Storage, presence_timeout: float = 3.0) -> None:
        super().__init__()
        self.storage, self.presence_timeout = storage, presence_timeout
        self._lock = threading.RLock()
        self._presence: dict[tuple[str, str], Presence] = {}
        self._changes = PresenceChanges()

    def _key(self, queue: str, name: str) -> str:
        return f"{PREFIX}{queue}/{name}"

    def _stored(self, queue: str, name: str) -> Registration:
        data = self.storage.get_meta(self._key(queue, name))
        if data is None:
            raise SubscriberNotFound(name, queue)
        return Registration.from_json(queue, name, data)

    def create(self, registration: Registration) -> None:
        with self._lock:
            if self.storage.get_meta(self._key(registration.queue, registration.name)) is not None:
                raise SubscriberExists(f"subscriber {registration.name!r} exists on {registration.queue!r}")
            self.storage.put_meta(self._key(registration.queue, registration.name), registration.to_json())
        self.changed()

    def load(self, queue: str, name: str) -> Registration:
        registration = self._stored(queue, name)
        presence = self._presence.get((queue, name))
        if presence and time.monotonic() - presence.seen < self.presence_timeout:
            # The heartbeat's address was checked when it came: it is the approved one.
            return replace(
                registration,
                address=presence.address,
                live_topics=presence.topics,
                push=presence.push,
                approved=(presence.address,),
            )
        return registration

    def update(self, queue: str, name: str, change: Callable[[Registration], Registration]) -> Registration:
        with self._lock:
            registration = change(self._stored(queue, name))
            self.storage.put_meta(self._key(queue, name), registration.to_json())
        return registration

    def remove(self, queue: str, name: str) -> None:
        with self._lock:
            self._stored(queue, name)
            self.storage.delete_meta(self._key(queue, name))
            self._presence.pop((queue, name), None)
            self._changes.forget((queue, name))
        self.changed()

    def names(self, queue: str) -> list[str]:
        return sorted(key.rsplit("/", 1)[1] for key in self.storage.list_meta(f"{PREFIX}{queue}/"))

    def attached(self) -> list[Registration]:
        now = time.monotonic()
        live = [key for key, presence in list(self._presence.items()) if now - presence.seen < self.presence_timeout]
        found = []
        for queue, name in live:
            try:
                found.append(self.load(queue, name))
            except SubscriberNotFound:
                self._presence.pop((queue, name), None)
        return found

    def heartbeat(
        self, queue: str, name: str, address: str, topics: frozenset[bytes] | None, push: PushCredentials
    ) -> None:
        self._stored(queue, name)
        previous = self._presence.get((queue, name))
        now = time.monotonic()
        live = previous is not None and now - previous.seen < self.presence_timeout
        if previous is not None and live and previous.push != push:  # (its key is the instance: it may move)
            raise SubscriberActive(
                f"subscriber {name!r} on {queue!r} is attached at {previous.address}; a second instance is refused "
                f"(if that one died, its presence lapses within {self.presence_timeout:g}s)"
            )
        if previous is not None and live and (previous.address, previous.topics) != (address, topics):
            self._changes.check((queue, name), now)  # it moved, or its topics changed
        self._presence[(queue, name)] = Presence(address, topics, push, now)
        if previous is None or (previous.address, previous.topics, previous.push) != (address, topics, push):
            self._changes.made((queue, name), now)
            self.changed()

    def leave(self, queue: str, name: str, push: PushCredentials | None = None) -> None:
        self._stored(queue, name)
        presence = self._presence.get((queue, name))
        if presence is not None and (push is None or presence.push == push):
            self._presence.pop((queue, name), None)
            self.changed()
