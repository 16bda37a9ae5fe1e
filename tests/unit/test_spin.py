"""Polling before a blocking wait (rpc/spin.py): only while waits are short, and less after polls in vain."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from hqueue.rpc.bounded import BoundedSocket
from hqueue.rpc.spin import (
    FORGIVE,
    MAX_BACKOFF,
    MAX_NEAR_RUN,
    MAX_POLL_US,
    NEAR_MISSES,
    PREEMPTED,
    STRETCH,
    Spin,
    check_poll_us,
    env_poll_us,
)


def short_waits_until_polling(spin: Spin) -> int:
    """How many short blocking waits in a row it takes ``spin`` to poll again."""
    waits = 0
    while not spin.on:
        spin.blocked(0.00001)
        waits += 1
    return waits


def test_a_new_spin_blocks_at_once_and_polls_after_a_wait_short_enough_to_catch():
    spin = Spin(200)
    assert spin.poll(lambda: True) is None  # (not polled: off until a short wait)
    spin.blocked(0.001)  # 1 ms: a poll of 200 µs would not have caught it
    assert not spin.on
    spin.blocked(0.00005)
    assert spin.on
    assert spin.poll(lambda: ["event"]) == ["event"]
    assert spin.on  # it caught something: it goes on polling


def test_a_poll_in_vain_stops_polling_for_twice_as_many_short_waits_each_time():
    spin = Spin(50)
    needed = []
    for _ in range(8):
        spin.blocked(0.00001)
        assert spin.on
        assert spin.poll(lambda: []) is None  # nothing came in the whole limit
        assert not spin.on
        needed.append(short_waits_until_polling(spin))
    assert needed == [2, 4, 8, 16, 32, 64, 64, 64]
    assert MAX_BACKOFF == 64


def test_a_poll_whose_cpu_went_to_another_task_stops_as_one_in_vain():
    # Given a spin polling with a long limit (10 ms)
    spin = Spin(10_000)
    spin.blocked(0.00001)
    turns = []

    def ready():  # its third turn comes back late: another thread or process had the CPU
        turns.append(time.perf_counter())
        if len(turns) == 3:
            time.sleep(PREEMPTED * 3)
        return []

    # When one of its turns takes longer than PREEMPTED, it stops there, long before its limit
    assert spin.poll(ready) is None
    assert len(turns) <= 3 and not spin.on  # (at 3, or sooner on a busy machine)
    # and polls again only after twice as many short waits, as after a poll in vain
    assert short_waits_until_polling(spin) == 2


def test_polls_that_catch_halve_the_count_after_a_run_of_them():
    spin = Spin(50)
    spin.blocked(0.00001)
    for _ in range(3):  # the count goes to 8
        spin.poll(lambda: [])
        short_waits_until_polling(spin)
    for _ in range(FORGIVE - 1):
        assert spin.poll(lambda: [1]) == [1]
    spin.poll(lambda: [])  # one short of a run: the count doubles to 16
    assert short_waits_until_polling(spin) == 16
    for _ in range(FORGIVE):  # a whole run: 8
        spin.poll(lambda: [1])
    spin.poll(lambda: [])  # in vain: 16 again
    assert short_waits_until_polling(spin) == 16


def test_bursts_with_long_gaps_between_soon_waste_few_polls():
    # A client that calls three times in a row, then pauses: each pause a poll in vain
    spin, wasted, caught = Spin(50), 0, 0
    for _ in range(640):
        for wait in (0.00001, 0.00001, 0.00001, 0.001):
            short = wait < spin.limit
            if spin.on:
                if spin.poll(lambda short=short: [1] if short else []):
                    caught += 1
                    continue
                wasted += 1
                spin.blocked(wait + spin.limit)
            else:
                spin.blocked(wait)
    assert wasted <= 640 // 20  # about one poll in vain in 64 short waits, not one each pause
    assert caught > 0


def test_a_long_wait_starts_the_count_of_short_ones_again():
    spin = Spin(50)
    spin.blocked(0.00001)
    spin.poll(lambda: [])  # in vain: 2 short waits in a row needed
    spin.poll(lambda: [])  # (off: not polled, nothing changes)
    spin.blocked(0.00001)
    spin.blocked(1.0)  # a long one: two short ones in a row again
    spin.blocked(0.00001)
    assert not spin.on
    spin.blocked(0.00001)
    assert spin.on


def test_waits_that_keep_ending_just_past_the_limit_stretch_the_poll_to_catch_them():
    # Given a 300 µs poll whose client calls again every 430 µs (an asyncio member's batch)
    spin = Spin(300)
    for _ in range(NEAR_MISSES - 1):
        spin.blocked(0.00043)
        assert not spin.on and spin.limit == 300e-6
    # When the waits keep ending just past it, within STRETCH times it
    spin.blocked(0.00043)
    # Then it polls, STRETCH times as long, and catches them
    assert spin.on and spin.limit == STRETCH * 300e-6
    assert spin.poll(lambda: [1]) == [1] and spin.limit == STRETCH * 300e-6
    # and once a stretched poll is in vain, it is back to its limit, and backs off as before
    assert spin.poll(lambda: []) is None
    assert not spin.on and spin.limit == 300e-6
    assert short_waits_until_polling(spin) == 2


def test_after_stretched_polls_in_vain_it_stretches_only_after_as_many_near_waits_as_its_back_off():
    # Given a client whose pace is mostly just past the poll, now and then longer than the stretch
    spin = Spin(300)
    for _ in range(4):  # stretched, then in vain: the back-off doubles each time (2, 4, 8, 16)
        while not spin.on:
            spin.blocked(0.00043)
        assert spin.limit == STRETCH * 300e-6
        assert spin.poll(lambda: []) is None
    # When it waits just past the poll again, NEAR_MISSES in a row no longer stretch it
    for _ in range(NEAR_MISSES):
        spin.blocked(0.00043)
    assert not spin.on and spin.limit == 300e-6
    # Then only as many as its back-off (16) do, as for short waits
    for _ in range(16 - NEAR_MISSES):
        spin.blocked(0.00043)
    assert spin.on and spin.limit == STRETCH * 300e-6


def test_after_many_stretched_polls_in_vain_a_bounded_run_of_near_waits_stretches_it_again():
    # Given a poll whose stretched polls went in vain again and again (its back-off at MAX_BACKOFF)
    spin = Spin(300)
    while spin._backoff < MAX_BACKOFF:
        while not spin.on:
            spin.blocked(0.00043)
        assert spin.poll(lambda: []) is None
    # When its client's pace is near the poll, with one wait past the stretch now and then
    for _ in range(3):
        for _ in range(MAX_NEAR_RUN - 1):
            spin.blocked(0.00043)
        spin.blocked(0.002)  # (past the stretch: the run starts again)
        assert not spin.on
    for _ in range(MAX_NEAR_RUN - 1):
        spin.blocked(0.00043)
    assert not spin.on
    # Then MAX_NEAR_RUN near waits in a row stretch it again (not MAX_BACKOFF: that run of a
    # pace like this one never came, and the server stayed cold for good)
    spin.blocked(0.00043)
    assert spin.on and spin.limit == STRETCH * 300e-6
    assert MAX_NEAR_RUN < MAX_BACKOFF


def test_waits_far_past_the_limit_or_broken_by_longer_ones_do_not_stretch_it():
    spin = Spin(300)
    for _ in range(3 * NEAR_MISSES):  # 2 ms: beyond the stretch (an idle client)
        spin.blocked(0.002)
    assert not spin.on and spin.limit == 300e-6
    for _ in range(3):
        for _ in range(NEAR_MISSES - 1):
            spin.blocked(0.0005)
        spin.blocked(1.0)  # (a long one among them: the count starts again)
        assert spin.limit == 300e-6 and not spin.on
    stretched = Spin(MAX_POLL_US)  # (never past MAX_POLL_US)
    for _ in range(NEAR_MISSES):
        stretched.blocked(MAX_POLL_US / 1e6 * 1.5)
    assert stretched.limit == MAX_POLL_US / 1e6 and not stretched.on


def test_near_waits_between_short_ones_stretch_it_and_it_then_catches_both():
    # Given a member whose calls alternate a quick one (0.1 ms: its ack) and one just past the
    # 300 µs poll (0.43 ms: the receive after it handled its batch), as the server sees them
    spin, caught_near = Spin(300), 0
    for turn in range(200):
        for wait in (0.0001, 0.00043):
            if spin.on:
                if spin.poll(lambda wait=wait: [1] if wait < spin.limit else []):
                    caught_near += turn >= 100 and wait > 0.0003
                    continue
                spin.blocked(spin.limit + 0.00001)  # (in vain: what came, came just after)
            else:
                spin.blocked(wait)
    # Then the quick ones do not break the run of slow ones: the poll stretched, and caught
    # every slow call of the second half (the quick ones alone never stretched it before)
    assert spin.on and spin.limit == STRETCH * 300e-6
    assert caught_near == 100


def test_poll_times_from_the_environment_are_checked(monkeypatch):
    monkeypatch.setenv("HQUEUE_POLL_US", "120")
    assert env_poll_us("HQUEUE_POLL_US", 500) == 120
    monkeypatch.setenv("HQUEUE_POLL_US", "")
    assert env_poll_us("HQUEUE_POLL_US", 500) == 500
    for bad in ("x", "-1", "\u0663\u0660\u0660", "20000"):
        monkeypatch.setenv("HQUEUE_POLL_US", bad)
        with pytest.raises(ValueError, match=r"'\$HQUEUE_POLL_US' must be whole microseconds"):
            env_poll_us("HQUEUE_POLL_US", 500)


def test_a_zero_limit_never_polls():
    spin = Spin(0)
    for seconds in (0.0, 0.000001, 1.0):
        spin.blocked(seconds)
        assert not spin.on


@pytest.mark.parametrize("value", [-1, MAX_POLL_US + 1, 1.5, "200", True, None])
def test_a_poll_time_is_whole_microseconds_in_range(value):
    with pytest.raises(ValueError, match="'idle_poll_us' must be whole microseconds"):
        check_poll_us(value, "idle_poll_us")
    assert check_poll_us(0, "x") == 0 and check_poll_us(MAX_POLL_US, "x") == MAX_POLL_US


def test_a_client_socket_polls_for_an_answer_that_comes_soon_and_reads_it_whole():
    left, right = socket.socketpair()
    try:
        bounded = BoundedSocket(sock=left, socket_timeout=5000)
        bounded.poll_first(500)
        assert bounded.spin is not None
        bounded.spin.blocked(0.0)  # (as after an answer that came at once)
        answer = struct.pack(">Ii", 0x80010002, 6) + b"answer" + b"\0\0\0\x01\0"  # (a reply of nothing)
        right.sendall(struct.pack(">I", len(answer)) + answer)  # a frame: its size, then it
        assert bounded.read(4) == struct.pack(">I", len(answer))
        assert bounded.read(len(answer)) == answer
        assert bounded.spin.on
        off = BoundedSocket(sock=right, socket_timeout=5000)
        off.poll_first(0)
        assert off.spin is None
    finally:
        left.close()
        right.close()
