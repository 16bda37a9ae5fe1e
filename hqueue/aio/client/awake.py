"""Polling for an answer before the event loop sleeps: the asyncio client's side of
idle polling (rpc/spin.py).

The blocking client polls its socket for up to ``poll_us`` before its read blocks,
and so takes a quick answer at once, on warm caches (rpc/spin.py says why that
pays). An event loop cannot poll one socket without holding up its other tasks,
but it can be kept from sleeping: while an answer awaited with polling is due,
:class:`Awake` keeps a callback ready that yields the CPU (``sched_yield``) and
schedules itself again, and an event loop with a callback ready waits for its
sockets without blocking. The answer is read in the turn of the loop it comes
in, and every other task runs as it would have.

One :class:`Awake` per event loop, however many connections wait. Each
connection's :class:`~hqueue.rpc.spin.Spin` decides, as a blocking connection's
does, whether its wait polls (only while its answers come that soon), and learns
whether the poll caught the answer. The polling ends when no wait whose poll
has time left is under way (a long wait keeps no other call's poll going), or
when one turn of the loop took longer than :data:`~hqueue.rpc.spin.PREEMPTED`:
other tasks had work (the loop is awake anyway), or another process had the
CPU (which it wants).
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref

from ...rpc.spin import PREEMPTED, Spin


class Awake:
    """Keeps one event loop from sleeping while a wait that polls is under way."""

    __slots__ = ("_polls", "_turn", "running")

    def __init__(self) -> None:  # (no reference to its loop: the loop's entry in _AWAKE goes with it)
        self._polls: dict[Spin, float] = {}  # each wait under way that polls: its poll's end
        self._turn = 0.0  # when the polling callback last ran
        #: Whether the polling callback is scheduled.
        self.running = False

    def begin(self, spin: Spin) -> float:
        """A wait for an answer begins: the loop polls for up to ``spin.limit`` if ``spin``
        says this wait polls. Its start, for :meth:`end` (negative: it does not poll)."""
        started = time.perf_counter()
        if not spin.on:
            return -started
        self._polls[spin] = started + spin.limit  # (one wait per connection, so per Spin)
        if not self.running:
            self.running, self._turn = True, started
            asyncio.get_running_loop().call_soon(self._poll)
        return started

    def end(self, spin: Spin, began: float, came: bool) -> None:
        """The wait :meth:`begin` returned ``began`` for ended; its answer ``came`` (else it
        was cancelled or failed: ``spin`` learns nothing from it)."""
        if began >= 0:
            self._polls.pop(spin, None)
        if not came:
            return
        waited = time.perf_counter() - abs(began)
        if began < 0:
            spin.blocked(waited)
        elif waited <= spin.limit:
            spin.caught()
        else:  # in vain, and then the wait it was, as a blocking client's poll and wait (rpc/bounded.py)
            spin.missed()
            spin.blocked(waited)

    def _poll(self) -> None:
        now = time.perf_counter()
        polls = self._polls
        if polls and now - self._turn <= PREEMPTED:
            for spin, until in list(polls.items()):
                if until <= now:
                    del polls[spin]  # (its poll ended: a long wait does not keep the loop awake)
        if not polls or now - self._turn > PREEMPTED:
            self.running = False
            return
        self._turn = now
        os.sched_yield()  # (another process that wants this CPU runs first)
        asyncio.get_running_loop().call_soon(self._poll)


_AWAKE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Awake] = weakref.WeakKeyDictionary()


def awake() -> Awake:
    """The running event loop's :class:`Awake`."""
    loop = asyncio.get_running_loop()
    keeper = _AWAKE.get(loop)
    if keeper is None:
        keeper = _AWAKE[loop] = Awake()
    return keeper
