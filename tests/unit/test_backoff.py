"""Waits that double (hqueue/backoff.py), and the places that use them."""

from __future__ import annotations

from hqueue.backoff import doubled
from hqueue.console.access import MAX_WAIT, LoginThrottle
from hqueue.groups.limits import BACKOFF_BASE, BACKOFF_MAX, backoff


def test_a_wait_doubles_from_its_first_up_to_its_most():
    assert [doubled(0.1, n, 2.0) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert doubled(1.0, -3) == 1.0
    assert [backoff(r) for r in (0, 1, 2, 3)] == [BACKOFF_BASE, BACKOFF_BASE, 2 * BACKOFF_BASE, 4 * BACKOFF_BASE]


def test_thousands_of_failures_wait_the_most_instead_of_overflowing():
    """``2 ** 1,024`` is past a float: a group allowing thousands of retries raised
    OverflowError on a message's 1,026th nack, as wrong tokens did past about 1,030."""
    assert backoff(2000) == BACKOFF_MAX
    assert doubled(0.1, 5000, 2.0) == 2.0
    assert doubled(1.0, 5000) > 1e300  # (no most: as long as a float holds)
    throttle = LoginThrottle()
    for _ in range(3000):
        throttle.failed("10.0.0.1")
    assert 0 < throttle.wait("10.0.0.1") <= MAX_WAIT
