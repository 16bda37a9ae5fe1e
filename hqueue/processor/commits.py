"""Which received messages a Processor may ack: the longest completed prefix per partition."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING

from ..consumer import Delivery
from ..message import MessageID

if TYPE_CHECKING:
    pass


class CommitTracker:
    """Which of one partition's messages may be committed, as they complete out of order.

    ``received`` messages enter in ID order; ``completed`` ones leave in any
    order; :meth:`committable` gives those below the lowest message still
    incomplete (the highest contiguous completed run), once each.
    """

    def __init__(self) -> None:
        self._pending: list[MessageID] = []  # received, in ID order
        self._held: dict[MessageID, Delivery] = {}
        self._completed: set[MessageID] = set()
        #: Completed ones the group finished already (dead-lettered): no lease left to renew.
        self._finished: set[MessageID] = set()
        #: Being dead-lettered: renewed still, but maybe finished by the group already.
        self._finishing: set[MessageID] = set()
        self._ready = 0  # how many at the head of _pending are completed: the committable run
        self._lock = threading.Lock()

    def received(self, delivery: Delivery) -> bool:
        """Track a message; False if it is tracked already (a redelivery of one in hand)."""
        with self._lock:
            if delivery.id in self._held:
                return False
            at = bisect.bisect(self._pending, delivery.id)
            self._pending.insert(at, delivery.id)
            self._ready = min(self._ready, at)  # (one below the run cuts it there)
            self._held[delivery.id] = delivery
            return True

    def completed(self, message_id: MessageID, *, finished: bool = False) -> int:
        """Mark a message complete (``finished``: the group finished it already, as a
        dead-letter does, so it has no lease to renew); returns how many became committable
        by it (0 while an earlier one is incomplete)."""
        with self._lock:
            if message_id not in self._held or message_id in self._completed:
                return 0
            self._completed.add(message_id)
            if finished:
                self._finished.add(message_id)
            self._finishing.discard(message_id)
            return self._advance()

    def _advance(self) -> int:
        """Lengthen the committable run over the completed messages after it; by how many."""
        start = ready = self._ready
        pending, completed = self._pending, self._completed
        while ready < len(pending) and pending[ready] in completed:
            ready += 1
        self._ready = ready
        return ready - start

    def committable(self) -> list[Delivery]:
        """The completed messages below the first incomplete one, oldest first; forgotten once returned."""
        with self._lock:
            count, self._ready = self._ready, 0
            done, self._pending = self._pending[:count], self._pending[count:]
            self._completed.difference_update(done)
            return [self._held.pop(message_id) for message_id in done]

    def restore(self, deliveries: list[Delivery]) -> None:
        """Take back what :meth:`committable` gave (oldest first), its ack having failed."""
        if not deliveries:
            return
        with self._lock:
            for delivery in deliveries:
                if delivery.id not in self._held:  # (in ID order, whatever came meanwhile)
                    bisect.insort(self._pending, delivery.id)
                self._held[delivery.id] = delivery
                self._completed.add(delivery.id)
            self._ready = 0
            self._advance()

    def forget_incomplete(self, keep: Collection[MessageID] = ()) -> list[Delivery]:
        """Stop tracking the messages not completed (their leases are gone: another process
        has them), but those in ``keep``; the completed ones stay, to be committed. Returns
        those forgotten."""
        with self._lock:
            gone = [self._held.pop(i) for i in self._pending if i not in self._completed and i not in keep]
            self._pending = [i for i in self._pending if i in self._held]
            self._ready = 0
            self._advance()
            return gone

    def holds(self, message_id: MessageID) -> bool:
        """Whether ``message_id`` is in hand."""
        with self._lock:
            return message_id in self._held

    def forget(self, message_id: MessageID) -> None:
        """Stop tracking one message, not completed: it goes back to the group, not acked."""
        with self._lock:
            if self._held.pop(message_id, None) is not None:
                at = self._pending.index(message_id)
                del self._pending[at]
                self._completed.discard(message_id)
                self._ready = min(self._ready, at)
                self._advance()  # (the first incomplete one gone: the run may go on past it)

    def finishing(self, message_id: MessageID, finishing: bool = True) -> None:
        """The group may be finishing ``message_id`` (a dead letter under way; False: no
        more): renewed still, but not among :meth:`firm`'s."""
        with self._lock:
            if not finishing:
                self._finishing.discard(message_id)
            elif message_id in self._held:
                self._finishing.add(message_id)

    def firm(self) -> list[Delivery]:
        """:meth:`held`, less the messages the group may be finishing (a dead letter under way):
        a renewal of these comes back short only for leases gone. (Short by the number being
        finished, counted apart, hid a lease really gone beside them; and one completed between
        the two reads dropped the partition again: a review.)"""
        with self._lock:
            self._finishing &= self._held.keys()
            return [d for i, d in self._held.items() if i not in self._finished and i not in self._finishing]

    def held(self) -> list[Delivery]:
        """Every message received and not yet committed whose lease must not run out (not
        those the group finished already: a renewal of a dead-lettered one renews nothing,
        and counted as a lease gone it dropped the whole partition here)."""
        with self._lock:
            if not self._finished:
                return list(self._held.values())
            self._finished &= self._held.keys()  # (those acked since; a restored one stays)
            return [d for i, d in self._held.items() if i not in self._finished]

    @property
    def in_hand(self) -> int:
        with self._lock:
            return len(self._pending)
