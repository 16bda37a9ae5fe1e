"""Waits that double with each failure: a nacked message's, a processor's retry, a wrong
token's answer. One formula, with the exponent bounded: ``2 ** 1,024`` is past a float,
and a count that high (a group allowing thousands of retries, a guesser's thousandth wrong
token) raised OverflowError where it should have waited the most."""

from __future__ import annotations

import math

#: Doublings past this change nothing a float can hold apart from "the most".
_MAX_DOUBLINGS = 1023


def doubled(first: float, times: int, most: float = math.inf) -> float:
    """``first`` doubled ``times`` times (none below 0), at most ``most``."""
    return min(most, first * 2.0 ** min(max(0, times), _MAX_DOUBLINGS))
