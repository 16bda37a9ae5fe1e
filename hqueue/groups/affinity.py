"""Key affinity in a consumer group: each key's messages in order, whoever consumes them.

A group made with ``key_affinity`` (like Pulsar's Key_Shared subscription)
hands a key's messages out so that a member that handles each key in order
(the :class:`~hqueue.processor.Processor` does) keeps the key's order across
members, crashes and retries. Per (group, partition), for a key ``k``:

* while a member holds a lease of a message of ``k``, later messages of
  ``k`` go to that member only;
* while a message of ``k`` waits to be retried (a nack, with its backoff; a
  lease that ran out; a member that is gone), no later message of ``k`` is
  handed out, to anyone: the waiting one goes first, then the rest in order;
* a message of ``k`` that may not go out now is *held back*, not skipped: it
  is handed out, in order, once ``k`` is free, and the group's completion
  cursor does not pass it. Other keys go on meanwhile.

The key is what the partition's owner can read of a stored message:

* ``"topic"``: the message's topic (the Processor's default key);
* ``"partition"``: the partition, one key: for keys only the consumer knows
  (a Processor's ``key=`` function), as long as a key's messages share a
  partition (``queue.put(..., key=k)``).

Unlike Pulsar, a negative ack does not give up the order: the nacked message
holds its key's later messages back until it is acked or dead-lettered. What
a member does with the messages it holds is its own affair: one that nacks a
message and then acks a later one of the same key it held already has put
them out of order itself.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from ..errors import InvalidArgument
from ..message import ROWKEY_LENGTH

#: The keys a group may keep in order, and how each is read from a cell key (rowkey + topic).
KEYS: dict[str, Callable[[bytes], bytes]] = {
    "topic": lambda cell_key: cell_key[ROWKEY_LENGTH:],
    "partition": lambda cell_key: b"",
}


def check_key_affinity(value: object) -> str | None:
    if value is None or value in KEYS:
        return value  # type: ignore[return-value]
    raise InvalidArgument(f"'key_affinity' must be None, 'topic' or 'partition', got {value!r}")


class KeyAffinity:
    """Which member may have which of one partition's messages, per key (held by a
    :class:`~hqueue.groups.state.PartitionState`, under its group's lock)."""

    def __init__(self, kind: str) -> None:
        self.key_of_cell = KEYS[kind]
        #: The key of every message leased, waiting to be retried, or held back.
        self.keys: dict[bytes, bytes] = {}
        #: key -> member -> leases of the key's messages it holds.
        self.holders: dict[bytes, Counter[str]] = {}
        #: key -> messages of it waiting to be retried.
        self.waiting: Counter[bytes] = Counter()
        #: key -> messages of it scanned and not handed out yet, in ID order.
        self.back: dict[bytes, deque[bytes]] = {}
        #: Every held-back ID (the completion cursor stops at the first).
        self.back_ids: set[bytes] = set()

    # -- what may go where -----------------------------------------------------------------

    def free_for(self, key: bytes, member: str) -> bool:
        """Whether ``member`` may have the next held-back message of ``key`` (none of it
        waits to be retried, and no other member holds one)."""
        holders = self.holders.get(key)
        return not self.waiting[key] and (not holders or holders.keys() == {member})

    def new_for(self, key: bytes, member: str) -> bool:
        """Whether ``member`` may have a new message of ``key`` (none of it is held back either)."""
        return key not in self.back and self.free_for(key, member)

    def may_retry(self, key: bytes, member: str) -> bool:
        """Whether ``member`` may have a waiting message of ``key`` (no one else holds the key)."""
        holders = self.holders.get(key)
        return not holders or holders.keys() == {member}

    # -- what happens to a message ------------------------------------------------------------

    def leased(self, message_id: bytes, member: str, was_waiting: bool) -> None:
        key = self.keys[message_id]
        if was_waiting:
            self._unwait(key)
        self.holders.setdefault(key, Counter())[member] += 1

    def released(self, message_id: bytes, member: str) -> None:
        key = self.keys[message_id]
        holders = self.holders[key]
        holders[member] -= 1
        if holders[member] <= 0:
            del holders[member]
            if not holders:
                del self.holders[key]

    def waits(self, message_id: bytes) -> None:
        self.waiting[self.keys[message_id]] += 1

    def finished(self, message_id: bytes, was_waiting: bool) -> None:
        key = self.keys.pop(message_id, None)
        if key is not None and was_waiting:
            self._unwait(key)

    def _unwait(self, key: bytes) -> None:
        self.waiting[key] -= 1
        if self.waiting[key] <= 0:
            del self.waiting[key]

    # -- held back -----------------------------------------------------------------------

    def hold_back(self, message_id: bytes, key: bytes) -> None:
        self.keys[message_id] = key
        self.back.setdefault(key, deque()).append(message_id)
        self.back_ids.add(message_id)

    def give_back(self, ids: list[bytes]) -> None:
        """Held-back messages :meth:`take_back` gave and a receive did not take: first again, in order."""
        for message_id in reversed(ids):
            self.back.setdefault(self.keys[message_id], deque()).appendleft(message_id)
            self.back_ids.add(message_id)

    def take_back(self, member: str, limit: int) -> list[bytes]:
        """Held-back messages ``member`` may have now, at most ``limit``, each key's in order."""
        out: list[bytes] = []
        for key in [k for k in self.back if self.free_for(k, member)]:
            waiting = self.back[key]
            while waiting and len(out) < limit:
                message_id = waiting.popleft()
                self.back_ids.discard(message_id)
                out.append(message_id)
            if not waiting:
                del self.back[key]
            if len(out) >= limit:
                break
        return out

    def drop_back(self, ids: list[bytes]) -> None:
        """Held-back messages that are gone from the store (a truncate): no longer held back
        (their keys stay noted until they are finished)."""
        for message_id in ids:
            key = self.keys.get(message_id)
            if key is None or message_id not in self.back_ids:
                continue
            waiting = self.back[key]
            waiting.remove(message_id)
            self.back_ids.discard(message_id)
            if not waiting:
                del self.back[key]
