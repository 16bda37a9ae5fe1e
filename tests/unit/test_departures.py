"""Departures: when members left, kept for the longest receive's wait, pruned oldest first."""

from __future__ import annotations

from hqueue.groups import state
from hqueue.groups.limits import MAX_WAIT


def test_a_leave_prunes_only_what_is_older_than_the_longest_wait(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: now[0])
    departures = state.Departures()
    departures.leave("a")
    now[0] += 100
    departures.leave("b")
    now[0] += 100
    departures.leave("a")  # left again: it counts from now, and is pruned by this time
    assert departures.since("a", 1150.0) and departures.since("b", 1100.0)
    now[0] = 1100.0 + MAX_WAIT + 2  # past b's keeping, not a's second leave
    departures.leave("c")
    assert list(departures._at) == ["a", "c"]
    assert not departures.since("b", 0.0) and departures.since("a", 1150.0)
