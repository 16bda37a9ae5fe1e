"""Polling for what comes soon before a blocking wait, while that pays (idle polling).

A thread that blocks for the next call (a server) or for an answer (a
client) and is woken a few hundred microseconds later finds its CPU's
caches cold: on this project's 2-core VM an embedded put costs 17 µs of
Python back to back and 40–60 after a 0.2–1 ms sleep (``bench/cold_calls.py``),
and the wake-up itself costs tens of microseconds more. Polling without
blocking for a little while first keeps the thread warm and takes what
comes at once, the way Seastar (Redpanda's ``--idle-poll-time-us``, 200 µs
by default) and Aeron's idle strategies do. Between polls the thread
yields its CPU (``sched_yield``, which also lets the GIL go): another
process or thread that wants it runs first, so a poll costs a busy
machine little.

Polling burns a CPU while it lasts, so :class:`Spin` polls only while it
pays, as glibc's adaptive mutexes spin: after a blocking wait that ended
within the limit (a poll would have caught it) it polls before the next
one. A poll that runs its whole limit with nothing come stops the polling
until 2, 4, 8, … :data:`MAX_BACKOFF` waits in a row were short enough (the
count doubles with each poll in vain, and halves after :data:`FORGIVE`
polls in a row that caught what came). A thread whose waits are long (an
idle server, a client of a busy one) blocks at once; one whose waits are
short in bursts with long gaps between (a client that calls three times,
then thinks) soon needs 64 short waits before it polls again, so it wastes
about one poll of ``limit`` in 64 of its short waits. A poll one of whose
turns took longer than :data:`PREEMPTED` stops as one in vain: another
process ran on its CPU meanwhile (more runnable work than CPUs), or another
thread of this process held the GIL (each turn lets it go), and either does
more good with the time than a poll catching what comes a little sooner.
Measured with 4 and 16 group member processes on 2 cores
(``bench/groups.py``): 12–25 % more messages a second, with one member and
single puts unchanged; machines with more cores were not measured.

A poll stretches to its client's pace: after NEAR_MISSES blocking waits that
ended past its limit and within STRETCH times it, with no longer wait between
them (short ones may come between), it polls that much longer
(a caller whose turn between calls is a little longer than the poll: an asyncio
group member handling a batch of 100 takes about 0.4 ms against the server's
0.3), until a stretched poll is in vain. After polls in vain it stretches again
only after as many near waits as the short ones it needs, at most MAX_NEAR_RUN.
Measured on the 2-core VM: one member 4–28 % further, 16 member processes where
they were (docs/benchmarks.md).

The asyncio client polls by the same rules (one :class:`Spin` per connection,
its ``poll_us``), keeping its event loop awake rather than polling one socket:
aio/client/awake.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Microseconds a server's event loop polls for its next call by default (``--idle-poll-us``;
#: ``$HQUEUE_IDLE_POLL_US`` for every server of a process, a ``local://`` store's among them).
DEFAULT_SERVER_POLL_US = 300
#: Microseconds a client (blocking or asyncio) polls for an answer by default (``poll_us=`` in the URL;
#: ``$HQUEUE_POLL_US`` for every client of a process, a ``local://`` store's among them).
DEFAULT_CLIENT_POLL_US = 500
#: Short waits in a row that polling waits for, at most, after polls that caught nothing.
MAX_BACKOFF = 64
#: Polls in a row that caught what came, after which polling waits for half as many short waits.
FORGIVE = 16
#: The longest poll either may be given (microseconds): more is a busy CPU, not a quick answer.
MAX_POLL_US = 10_000
#: A poll stretches to this many times its limit (at most MAX_POLL_US) once NEAR_MISSES waits
#: ended past the limit and within that, none longer between: a client whose turn between calls is a little
#: longer than the poll (an asyncio member handling a batch of 100: about 0.4 ms) is caught.
STRETCH = 4
#: Waits just past the limit (within STRETCH times it), with none longer than that between
#: them, after which the poll stretches. Short waits between them do not break the run: a
#: member's calls alternate a quick one (its ack) and a slow one (the receive after it handled
#: the batch), and the quick ones alone would keep the slow ones from ever stretching the poll.
NEAR_MISSES = 8
#: Near waits a stretch needs at most after polls in vain (as many as the short waits it
#: needs, up to this; not MAX_BACKOFF): a client's pace has some waits past the stretch
#: (one in ten for an asyncio member on the 2-core VM), and 64 near ones in a row, once its
#: back-off had reached that, never came again, so the server stayed cold for the rest of
#: the run at half the rate (docs/benchmarks.md).
MAX_NEAR_RUN = 2 * NEAR_MISSES
#: Seconds one turn of a poll may take: a longer one means another process ran on this CPU
#: meanwhile, or another thread of this process held the GIL, and the poll stops as one in
#: vain would: the time does more good there than catching an answer a little sooner.
PREEMPTED = 100e-6


def check_poll_us(value: object, name: str) -> int:
    """``value`` as microseconds of polling (0: never poll), or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POLL_US:
        raise ValueError(f"{name!r} must be whole microseconds from 0 to {MAX_POLL_US}, got {value!r}")
    return value


def env_poll_us(variable: str, default: int) -> int:
    """The microseconds of polling ``$variable`` sets (unset or empty: ``default``).

    Raises:
        ValueError: it is not whole microseconds from 0 to :data:`MAX_POLL_US`.
    """
    given = os.environ.get(variable, "")
    return parse_poll_us(given, "$" + variable) if given else default


def parse_poll_us(text: str, name: str) -> int:
    """``text`` (ASCII digits) as microseconds of polling, or ValueError naming ``name``."""
    return check_poll_us(int(text) if text.isascii() and text.isdigit() else text, name)


class Spin:
    """Polls up to ``limit_us`` microseconds before a blocking wait, while waits are that short.

    Not thread-safe: one per waiting thread (the server's loop; a client connection).
    """

    __slots__ = ("limit", "base", "stretched", "on", "_backoff", "_skip", "_caught", "_near")

    def __init__(self, limit_us: int) -> None:
        #: How long the next poll may last (seconds): ``base``, or stretched (STRETCH).
        self.limit = self.base = limit_us / 1e6
        #: The limit once stretched (seconds): STRETCH times ``base``, at most MAX_POLL_US.
        self.stretched = min(self.base * STRETCH, MAX_POLL_US / 1e6)
        #: Whether the next wait polls first.
        self.on = False
        self._backoff = 1  # short waits in a row needed before polling (doubles after a poll in vain)
        self._skip = 1  # short waits in a row still needed
        self._caught = 0  # polls in a row that caught what came
        self._near = 0  # blocking waits that ended past the limit, within its stretch, none longer since

    def poll(self, ready: Callable[[], T]) -> T | None:
        """Call ``ready()`` without blocking, again and again, until it returns something true
        (returned) or ``limit`` passes (None; polling stops for a while: see the module)."""
        if not self.on:
            return None
        clock, give_way = time.perf_counter, os.sched_yield
        turn = clock()
        until = turn + self.limit
        while True:
            got = ready()
            if got:
                self.caught()
                return got
            now = clock()
            if now >= until or now - turn > PREEMPTED:  # (its time ran out, or its CPU is wanted)
                self.missed()
                return None
            turn = now
            give_way()  # (another process or thread that wants this CPU, or the GIL, runs first)

    def caught(self) -> None:
        """A poll caught what it waited for (made by :meth:`poll`; an asyncio poll's owner
        tells it here, aio/client/awake.py): after FORGIVE in a row, polling waits for half
        as many short waits after its next poll in vain."""
        self._caught += 1
        if self._caught >= FORGIVE:
            self._backoff, self._caught = max(1, self._backoff // 2), 0

    def missed(self) -> None:
        """A poll ran its whole limit, or was preempted, with nothing come: polling stops
        until twice as many short waits in a row as last time (at most MAX_BACKOFF)."""
        self.on, self._caught, self.limit = False, 0, self.base  # (a stretched poll in vain: back to its limit)
        self._skip = self._backoff = min(2 * self._backoff, MAX_BACKOFF)

    def blocked(self, seconds: float) -> None:
        """A blocking wait ended with what it waited for after ``seconds`` (from before any
        poll): poll before the next one once enough waits in a row were short enough for a
        poll to catch (with no limit, none ever is). NEAR_MISSES (or, after polls in vain,
        as many as the short waits it needs, at most MAX_NEAR_RUN) that only a poll of STRETCH times the limit
        would have caught, with no wait longer than that between them, stretch the poll to
        that, and it polls."""
        if seconds >= self.limit:
            self._skip = self._backoff
            if not self.base or seconds >= self.stretched:
                self._near = 0
                return
            self._near += 1
            if self._near >= max(NEAR_MISSES, min(self._backoff, MAX_NEAR_RUN)):  # (after polls in vain, more)
                self.limit, self.on, self._near = self.stretched, True, 0
            return
        if self._skip > 1:  # (a short wait does not break a run of near ones: see NEAR_MISSES)
            self._skip -= 1
        else:
            self.on = True
