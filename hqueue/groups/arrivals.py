"""What a waiting receive waits for, and what wakes it.

A receive that found nothing to take waits for something that may give it
some: a write to its queue (new messages, a timer fired); a nack,
dead-letter or leave in its group, or an ack that frees a partition at its
``max_span`` or a key in order (a message back, a member gone); a member of
its group reaching its ``max_member_in_flight``, or given room under it, on
a queue of several partitions (the members share them out again); or, on a
queue of one, an ack of its own member's messages while the member holds
all it may. Each is a generation: a receive notes its
queue's, its group's and its member's before it looks for messages, and
waits only while none has moved since, so nothing that happens between its
look and its wait is missed.

Each waiting (queue, group, member) has its own condition (all on one lock):
a write wakes the receives of its queue, a group's event those of its group,
a member's room (one partition) those of that member only. Before, one condition per queue
served every group and member: 50 members of a group waiting on a drained
queue were all woken by each ack of another member (5 ms of server CPU an
ack, ``bench/group_abuse.py``), each to go back to waiting.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator

#: A receive's view: its queue's generation, its group's, its member's, and the forgets.
Seen = tuple[int, int, int, int]


class Arrivals:
    """Generations per queue, per (queue, group) and per member receiving, and the receives
    waiting on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations: dict[str | tuple[str, str], int] = {}
        #: (queue, group, member) -> [its generation, its receives under way] (gone at 0: a
        #: member's room matters only to a receive of its own, and names do not pile up).
        self._members: dict[tuple[str, str, str], list[int]] = {}
        #: queue -> group -> member -> its condition and how many receives wait on it (gone at
        #: 0): a group's event wakes its own waiting receives without walking the others'.
        self._waiting: dict[str, dict[str, dict[str, tuple[threading.Condition, list[int]]]]] = {}
        #: Times generations were forgotten (a group deleted, a queue dropped): a receive
        #: waiting on one sees it go, even one never moved (or moved as often as it went).
        self._forgets = 0
        #: Called with the queue after each group event (not writes: the engine's events
        #: say those): receives that wait elsewhere (an asyncio loop's) look again.
        self._listeners: tuple[Callable[[str], None], ...] = ()
        self.stopped = False

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(queue)`` after each ack, nack, dead-letter, leave, cap reached or
        group gone that may give a receive of ``queue`` something (from the thread of the
        call, which may hold the group's lock: a listener takes no lock but its own)."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def _tell(self, queue: str) -> None:
        for listener in self._listeners:
            listener(queue)

    @contextlib.contextmanager
    def receiving(self, queue: str, group: str, member: str) -> Iterator[None]:
        """Around a receive that may wait: its member's room (:meth:`freed`) is noted meanwhile."""
        key = (queue, group, member)
        with self._lock:
            entry = self._members.get(key)
            if entry is None:
                entry = self._members[key] = [0, 0]
            entry[1] += 1
        try:
            yield
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._members[key]

    def seen(self, queue: str, group: str, member: str) -> Seen:
        """The generations a receive notes before it looks for messages."""
        with self._lock:
            return self._seen(queue, group, member)

    def _seen(self, queue: str, group: str, member: str) -> Seen:
        entry = self._members.get((queue, group, member))
        generations = self._generations
        member_generation = entry[0] if entry is not None else 0
        return generations.get(queue, 0), generations.get((queue, group), 0), member_generation, self._forgets

    def written(self, queue: str) -> None:
        """A write to ``queue``: every receive waiting on it looks again."""
        with self._lock:
            self._generations[queue] = self._generations.get(queue, 0) + 1
            self._wake(queue)

    def finished(self, queue: str, group: str) -> None:
        """A nack, dead-letter, leave, or an ack freeing what any member may wait for in
        ``group``: its waiting receives look again."""
        with self._lock:
            self._generations[(queue, group)] = self._generations.get((queue, group), 0) + 1
            self._wake(queue, group)
        self._tell(queue)

    def freed(self, queue: str, group: str, members: Iterable[str]) -> None:
        """``members`` of ``group`` got room under their ``max_member_in_flight``: their own
        waiting receives look again, no other."""
        with self._lock:
            waiting = self._waiting.get(queue, {}).get(group, {})
            for member in members:
                entry = self._members.get((queue, group, member))
                if entry is not None:  # (no receive of it under way: none to tell)
                    entry[0] += 1
                    waiter = waiting.get(member)
                    if waiter is not None:
                        waiter[0].notify_all()
        self._tell(queue)  # (a receive waiting elsewhere did not note its member's room: it looks)

    def waiting(self, queue: str) -> int:
        """How many receives wait on ``queue`` now."""
        with self._lock:
            groups = self._waiting.get(queue, {}).values()
            return sum(count[0] for members in groups for _, count in members.values())

    def wait(self, queue: str, group: str, member: str, seen: Seen | None, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, until the generations move from ``seen`` (None:
        from what they are now) or the stop."""
        deadline = time.monotonic() + timeout
        with self._lock:
            groups = self._waiting.setdefault(queue, {})
            waiters = groups.setdefault(group, {})
            entry = waiters.get(member)
            if entry is None:
                entry = waiters[member] = (threading.Condition(self._lock), [0])
            condition, count = entry
            count[0] += 1
            try:
                seen = self._seen(queue, group, member) if seen is None else seen
                while not self.stopped and self._seen(queue, group, member) == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    condition.wait(left)
            finally:
                count[0] -= 1
                if not count[0]:
                    del waiters[member]
                    if not waiters:
                        del groups[group]
                        if not groups:
                            del self._waiting[queue]

    def stop(self) -> None:
        """Wake every waiting receive, for good."""
        with self._lock:
            self.stopped = True
            for groups in self._waiting.values():
                for waiters in groups.values():
                    for condition, _ in waiters.values():
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
            self._forgets += 1
            self._wake(queue, group)
        self._tell(queue)

    def _wake(self, queue: str, group: str | None = None) -> None:
        """(Under the lock.) Wake the receives waiting on ``queue``: all, or ``group``'s."""
        groups = self._waiting.get(queue, {})
        for waiters in groups.values() if group is None else (groups.get(group, {}),):
            for condition, _ in waiters.values():
                condition.notify_all()
