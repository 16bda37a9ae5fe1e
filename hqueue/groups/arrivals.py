"""What a waiting receive waits for, and what wakes it.

A receive that found nothing to take waits for something that may give it
some: a write to its queue (new messages, a timer fired), or an ack, nack,
dead-letter or leave in its group (room for a member at its
``max_member_in_flight``, a key in order whose message came back, a member
gone). Each is a
generation: a receive notes its queue's and its group's before it looks for
messages, and waits only while neither has moved since, so nothing that
happens between its look and its wait is missed.

Each queue has its own condition (all on one lock), made while receives wait
on it: a write wakes only the receives of its queue, and a receive woken by
another group's ack goes back to waiting without looking again (a look costs
the group's lock and a read per partition). Before, one condition served
every queue, and each write woke every waiting receive of the server to look.
"""

from __future__ import annotations

import threading
import time

#: A receive's view: its queue's generation and its group's.
Seen = tuple[int, int]


class Arrivals:
    """Generations per queue and per (queue, group), and the receives waiting on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations: dict[str | tuple[str, str], int] = {}
        #: queue -> its condition and how many receives wait on it (gone at 0).
        self._waiting: dict[str, tuple[threading.Condition, list[int]]] = {}
        self.stopped = False

    def seen(self, queue: str, group: str) -> Seen:
        """The generations a receive notes before it looks for messages."""
        with self._lock:
            return self._seen(queue, group)

    def _seen(self, queue: str, group: str) -> Seen:
        return self._generations.get(queue, 0), self._generations.get((queue, group), 0)

    def written(self, queue: str) -> None:
        """A write to ``queue``: every receive waiting on it looks again."""
        self._bump(queue, queue)

    def finished(self, queue: str, group: str) -> None:
        """An ack, nack, dead-letter or leave in ``group``: its waiting receives look again."""
        self._bump((queue, group), queue)

    def waiting(self, queue: str) -> int:
        """How many receives wait on ``queue`` now."""
        with self._lock:
            entry = self._waiting.get(queue)
            return entry[1][0] if entry is not None else 0

    def _bump(self, key: str | tuple[str, str], queue: str) -> None:
        with self._lock:
            self._generations[key] = self._generations.get(key, 0) + 1
            entry = self._waiting.get(queue)
            if entry is not None:
                entry[0].notify_all()

    def wait(self, queue: str, group: str, seen: Seen | None, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, until the generations move from ``seen`` (None:
        from what they are now) or the stop."""
        deadline = time.monotonic() + timeout
        with self._lock:
            entry = self._waiting.get(queue)
            if entry is None:
                entry = self._waiting[queue] = (threading.Condition(self._lock), [0])
            condition, count = entry
            count[0] += 1
            try:
                seen = self._seen(queue, group) if seen is None else seen
                while not self.stopped and self._seen(queue, group) == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    condition.wait(left)
            finally:
                count[0] -= 1
                if not count[0]:
                    del self._waiting[queue]

    def stop(self) -> None:
        """Wake every waiting receive, for good."""
        with self._lock:
            self.stopped = True
            for condition, _ in self._waiting.values():
                condition.notify_all()

    def forget(self, queue: str, group: str | None = None) -> None:
        """The queue dropped (or ``group`` of it deleted): its generations go, so that names
        made and dropped do not pile up here; a receive waiting on them looks again."""
        with self._lock:
            if group is not None:
                self._generations.pop((queue, group), None)
            else:
                for key in [k for k in self._generations if k == queue or (isinstance(k, tuple) and k[0] == queue)]:
                    del self._generations[key]
            entry = self._waiting.get(queue)
            if entry is not None:
                entry[0].notify_all()
