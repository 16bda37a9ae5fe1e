"""The client's and the pushes' socket (rpc/bounded.py): every wait ends by the deadline (within ARM_SLACK)."""

from __future__ import annotations

import socket
import time

import pytest

from hqueue.rpc.bounded import ARM_SLACK, BoundedSocket


def test_the_timeout_is_set_once_for_a_calls_write_and_read_and_again_for_the_next_call():
    left, right = socket.socketpair()
    try:
        bounded = BoundedSocket(sock=left, socket_timeout=5000)
        set_to: list[float] = []
        real = left.settimeout
        bounded.sock = type("Recorded", (), {"settimeout": lambda _, t: (set_to.append(t), real(t))})()
        bounded.deadline = time.monotonic() + 2
        bounded._arm(False)
        bounded._arm(True)  # the answer's read, right after the request's write: nothing to set
        assert len(set_to) == 1 and 1.9 < set_to[0] <= 2
        time.sleep(ARM_SLACK * 2)
        bounded._arm(True)  # later in the same call: what is left now
        assert len(set_to) == 2 and set_to[1] < set_to[0]
        bounded.deadline = time.monotonic() + 10  # the next call
        bounded._arm(False)
        assert len(set_to) == 3 and set_to[2] > 9
        bounded.share = time.monotonic() + 1  # (a call at a partition's owner: see _call_watched)
        bounded._got = False
        bounded._arm(False)  # a send: by the deadline, not the share (a slow connect ended the call early)
        bounded._arm(True)  # the wait for the answer: by the share
        assert set_to[-1] <= 1
        bounded.share = None
        bounded.deadline = time.monotonic() - 1
        with pytest.raises(TimeoutError):
            bounded._arm(False)
    finally:
        left.close()
        right.close()
