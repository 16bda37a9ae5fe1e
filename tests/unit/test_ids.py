"""The per-partition ID allocator (SPEC C2)."""

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hqueue import MessageID
from hqueue.ids import IDAllocator
from hqueue.message import MAX_SEQUENCE


def test_more_than_32768_in_one_millisecond_rolls_into_the_next():
    # Given a clock stuck at one millisecond
    allocator = IDAllocator(clock=lambda: 1000)
    # When 40,000 IDs are taken
    ids = allocator.allocate(40_000)
    # Then the sequence wraps into the next millisecond, strictly increasing
    assert ids[0] == MessageID(1000, 0)
    assert ids[MAX_SEQUENCE] == MessageID(1000, MAX_SEQUENCE)
    assert ids[MAX_SEQUENCE + 1] == MessageID(1001, 0)
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))


def test_a_clock_stepping_backwards_never_makes_ids_go_backwards():
    times = iter([5000, 5001, 4000, 3000, 5001, 6000])
    allocator = IDAllocator(clock=lambda: next(times))
    ids = [allocator.allocate()[0] for _ in range(6)]
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))
    assert ids[-1] == MessageID(6000, 0)


def test_seeded_allocator_continues_above_the_last_stored_id():
    # Given a partition whose last ID is in the future of the clock (clock skew after failover)
    allocator = IDAllocator(MessageID(9000, 7), clock=lambda: 8000)
    assert allocator.allocate(2) == [MessageID(9000, 8), MessageID(9000, 9)]


def test_a_batch_gets_consecutive_ids_in_order():
    allocator = IDAllocator(clock=lambda: 42)
    assert allocator.allocate(3) == [MessageID(42, 0), MessageID(42, 1), MessageID(42, 2)]


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 40_000)), min_size=1, max_size=20))
def test_ids_strictly_increase_whatever_the_clock_does(steps):
    clock = iter([t for t, _ in steps])
    allocator = IDAllocator(clock=lambda: next(clock))
    ids = [i for _, n in steps for i in allocator.allocate(n)]
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False))


def test_concurrent_threads_get_unique_increasing_ids_under_the_partition_lock():
    allocator, lock, taken = IDAllocator(), threading.Lock(), []

    def take():
        for _ in range(2000):
            with lock:
                taken.extend(allocator.allocate(3))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == len(set(taken)) == 48_000
    assert taken == sorted(taken)


def test_allocate_rejects_a_non_positive_count():
    with pytest.raises(ValueError, match="'count'"):
        IDAllocator().allocate(0)
