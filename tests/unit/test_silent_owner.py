"""The put's policy at a silent partition owner (client/silent.py, silent_owner_at), with the
calls to servers replaced by a scripted owner: how long it waits, where the put goes again,
and that it never goes to a new owner. Scaled down: MIN_OWNER_TRY 0.05 s. The real thing,
against a paused server in a ZooKeeper cluster, is tests/integration/test_cluster.py's."""

from __future__ import annotations

import time

import pytest

import hqueue.client.silent as client_silent
from hqueue import OutcomeUnknown
from hqueue.client.engine import RemoteEngine
from hqueue.errors import DeadlineExceeded, NotPartitionOwner, ServerUnavailable


@pytest.fixture
def scripted(monkeypatch):
    """An engine whose owner of partition 0 answers at ``answer_at`` seconds (None: never),
    and whose look for the owner says ``moved_to`` after the first (None: the same)."""
    monkeypatch.setattr(client_silent, "MIN_OWNER_TRY", 0.05)

    def make(
        answer_at: float | None,
        moved_to: str | None = None,
        timeout: float = 3.0,
        owner_timeout: float = 0.6,
        sends: bool = True,
        refuses_resend: bool = False,
        resend_unsent: bool = False,
        moved_after: int = 1,
    ):
        engine = RemoteEngine("hqueue://127.0.0.1:1", timeout=timeout, owner_timeout=owner_timeout)
        engine.sent = []  # (address, seconds since the start, resent)
        looks = []
        started = time.monotonic()

        def locations(name, fresh=False):
            looks.append(fresh)
            return [moved_to if (moved_to and len(looks) > moved_after) else "owner:1"]

        def call_at(address, method, *args, queue=None, pid=-1):
            until = engine.current_deadline()
            engine.sent.append((address, round(time.monotonic() - started, 2), args[-1].resent))
            if address != "owner:1":  # the new owner answers at once
                return "IDs"
            if refuses_resend and args[-1].resent:  # (resumed, its partition moved meanwhile)
                raise NotPartitionOwner("q", 0, None)
            if resend_unsent and args[-1].resent:  # (its connection refused: it went away)
                raise ServerUnavailable("connection refused")
            if answer_at is not None and started + answer_at <= until:
                time.sleep(max(0.0, started + answer_at - time.monotonic()))
                return "IDs"
            time.sleep(max(0.0, until - time.monotonic()))
            error = DeadlineExceeded("no answer")
            error.maybe_sent = sends
            raise error

        engine.locations, engine._call_at = locations, call_at
        return engine

    return make


def put(engine: RemoteEngine):
    with engine.deadline(), engine._lanes.lane() as lane:
        return engine._owner_call("q", 0, "put", "putPacked", 0, b"", lane=lane)


def test_a_slow_owner_still_named_gets_the_put_again_once_and_answers_within_the_deadline(scripted):
    """An owner that answers at 1.2 s of a 3 s deadline (owner_timeout 0.6 s): the put got
    OutcomeUnknown at 0.9 s once (a review), with the owner_timeout cutting its retries."""
    engine = scripted(answer_at=1.2)
    assert put(engine) == "IDs"
    assert [(a, resent) for a, _, resent in engine.sent] == [("owner:1", False), ("owner:1", True)]


def test_a_put_whose_partition_moved_while_its_owner_was_silent_is_outcome_unknown_at_once(scripted):
    engine = scripted(answer_at=None, moved_to="new:2")
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown, match="new:2 owns the partition now"):
        put(engine)
    assert time.monotonic() - started < 2.5  # an eighth of 3 s (and the look), not the deadline
    assert [a for a, _, _ in engine.sent] == ["owner:1"]  # never sent to the new owner


def test_an_owner_silent_to_the_end_is_outcome_unknown_at_the_deadline_after_two_sends(scripted):
    engine = scripted(answer_at=None)
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        put(engine)
    assert 2.5 < time.monotonic() - started < 4.5
    assert [(a, resent) for a, _, resent in engine.sent] == [("owner:1", False), ("owner:1", True)]


def test_a_put_never_sent_to_its_silent_owner_goes_to_the_new_owner(scripted):
    """Nothing went (a connection that could not be made): nothing can be half written."""
    engine = scripted(answer_at=None, moved_to="new:2", sends=False)
    assert put(engine) == "IDs"
    assert [a for a, _, _ in engine.sent] == ["owner:1", "new:2"]


def test_a_silent_server_is_asked_last_however_its_address_is_spelled():
    """A server marked silent by the address it advertises (an owner's) was asked first
    by reads through a seed spelled otherwise ("localhost:9700" for "127.0.0.1:9700")."""
    from hqueue.client.silent import SilentServers

    servers = SilentServers()
    servers.mark("127.0.0.1:9700")
    for _ in range(20):  # (the order is random within each kind)
        assert servers.order(["localhost:9700", "127.0.0.2:9700"])[-1] == "localhost:9700"
    assert not servers.silent("127.0.0.1:9701") and not servers.silent("no such host.invalid:9700")


def test_a_put_sent_again_to_an_owner_that_lost_its_partition_meanwhile_is_outcome_unknown(scripted):
    """The first try may have been written before the owner paused: the resumed owner's
    NotPartitionOwner for the second try sent the put to the new owner unmarked (a
    duplicate). It is OutcomeUnknown, and the put goes nowhere else."""
    engine = scripted(answer_at=None, refuses_resend=True)
    with pytest.raises(OutcomeUnknown, match="may have taken effect"):
        put(engine)
    assert [(a, resent) for a, _, resent in engine.sent] == [("owner:1", False), ("owner:1", True)]


@pytest.mark.parametrize("moved_after", [2, 3, 4])
def test_a_put_whose_second_try_could_not_go_and_whose_partition_moved_is_not_sent_to_the_new_owner(
    scripted, moved_after
):
    """The first try may be half written at the paused owner (undone later, on HBase, after
    the new owner could have read its record): it went to the new owner all the same, marked
    resent (two reviews: the move seen by the look after the failure, or only by a later
    one). Moved, it is OutcomeUnknown, as when the look finds the move first."""
    engine = scripted(answer_at=None, moved_to="new:2", resend_unsent=True, moved_after=moved_after)
    with pytest.raises(OutcomeUnknown, match="new:2 owns the partition now"):
        put(engine)
    assert [a for a, _, _ in engine.sent][:2] == ["owner:1", "owner:1"]
    assert "new:2" not in [a for a, _, _ in engine.sent]
