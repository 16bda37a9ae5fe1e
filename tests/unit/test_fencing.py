"""Every write a partition's owner makes carries its fence (SPEC C10).

Two engines on one shared ``memory://`` store stand for two servers: ``old``
owned the partition, ``new`` takes it (as a server does when ZooKeeper gives
it the partition). From then on each kind of write ``old`` makes (puts,
timers set, fired and cancelled, consumer-group acks and nacks, subscription
checkpoints) is refused with Fenced, a NotPartitionOwner, and leaves nothing
behind. The crash test that pauses a real server is
tests/integration/test_fencing.py.
"""

from __future__ import annotations

import itertools
import time

import pytest

from hqueue import Message, NotPartitionOwner
from hqueue.config import QueueInfo
from hqueue.coordination import LocalCoordinator
from hqueue.engine import Engine
from hqueue.errors import Fenced
from hqueue.keys.groups import state_prefix
from hqueue.services import serve_partitions
from hqueue.storage import open_storage
from hqueue.storage.fence import Token
from hqueue.storage.memory import forget

_names = itertools.count()


@pytest.fixture
def pair():
    """(old, new): two engines on one store; ``old`` keeps groups, neither fires timers on its own."""
    url = f"memory://fencing-{next(_names)}"
    old, new = Engine(open_storage(url)), Engine(open_storage(url))
    old.create_queue(QueueInfo("q", 2))
    groups = serve_partitions(old, LocalCoordinator("old"))
    assert old.groups is groups
    yield old, new
    old.close()
    new.close()
    forget(url[len("memory://") :])


def messages(*values: bytes) -> list[Message]:
    return [Message("t", v) for v in values]


def stored(engine: Engine, pid: int = 0) -> list[bytes]:
    start, stop = bytes([0, pid]), bytes([0, pid + 1])
    return [m.value for m in engine.scan("q", start, stop, None, 1000)]


def test_a_put_after_another_server_took_the_partition_is_refused_and_not_kept(pair):
    old, new = pair
    (first,) = old.put("q", messages(b"before"), 0)
    new.writers.fence("q", 0)  # new takes partition 0
    with pytest.raises(NotPartitionOwner) as refused:
        old.put("q", messages(b"stale"), 0)
    assert isinstance(refused.value, Fenced) and "another server took it" in str(refused.value)
    (second,) = new.put("q", messages(b"after"), 0)
    assert second > first
    assert stored(new) == [b"before", b"after"]
    old.put("q", messages(b"other partition"), 1)  # only partition 0 moved


def test_without_fencing_tokens_a_refused_owner_takes_the_partition_back_on_its_next_write(pair):
    """With a coordinator that has no tokens (one process owns everything: LocalCoordinator),
    a refused writer forgets its fence and its next write bumps the epoch again (fencing
    the other). IDs still only grow and nothing acknowledged is lost."""
    old, new = pair
    old.put("q", messages(b"first"), 0)
    new.writers.fence("q", 0)
    with pytest.raises(Fenced):
        old.put("q", messages(b"refused"), 0)
    (a,) = old.put("q", messages(b"taken back"), 0)
    with pytest.raises(Fenced):
        new.put("q", messages(b"refused too"), 0)
    (b,) = new.put("q", messages(b"and again"), 0)
    assert b > a and stored(old) == [b"first", b"taken back", b"and again"]


def test_timers_of_a_fenced_owner_are_neither_set_fired_nor_cancelled(pair):
    old, new = pair
    due = int(time.time() * 1000) + 3_600_000
    (timer,) = old.schedule("q", messages(b"timer"), 0, due)
    # (Each refused write makes old forget its fence and take it back on the next: take again before each.)
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.schedule("q", messages(b"stale timer"), 0, due)
    old.writers.fence("q", 0)
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.fire_timers("q", 0, due + 1, 100)
    old.writers.fence("q", 0)
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.cancel_timer("q", timer)
    # The timer is still pending, once, and the new owner fires it
    assert [m.value for _, m in new.pending_timers("q", 0)] == [b"timer"]
    assert new.fire_timers("q", 0, due + 1, 100)[0] == 1
    assert stored(new) == [b"timer"]


def test_group_progress_of_a_fenced_owner_is_not_written(pair):
    old, new = pair
    old.put("q", messages(b"m1", b"m2", b"m3"), 0)
    old.groups.open("q", "g", None, 0, 3)
    deliveries = old.groups.receive("q", "g", "member", 10, 30.0, 0)
    keys = [m.rowkey for m, _ in deliveries if m.partition_id == 0]
    assert len(keys) == 3
    assert old.groups.ack("q", "g", keys[:1]) == 1
    before = old.storage.list_meta(state_prefix("q", "g", 0))
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.groups.ack("q", "g", keys[1:2])
    old.writers.fence("q", 0)
    old.groups.receive("q", "g", "member", 10, 30.0, 0)  # the refused ack dropped what was held: lease again
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.groups.nack("q", "g", "member", keys[2:], 0.0)
    assert old.storage.list_meta(state_prefix("q", "g", 0)) == before


def test_a_fenced_owner_saves_no_subscription_checkpoint(pair):
    old, new = pair
    old.writers.check("q", 0)
    new.writers.fence("q", 0)
    with pytest.raises(Fenced):
        old.writers.check("q", 0)


class Tokens(LocalCoordinator):
    """Owns everything, with the fencing token a ZooKeeper lock node's czxid would give."""

    def __init__(self, address: str, token: int) -> None:
        super().__init__(address)
        self.fencing_token = token

    def token(self, queue: str, partition_id: int) -> Token | None:
        return Token(b"z" * 16, self.fencing_token)


def test_an_owner_with_an_older_token_can_never_take_the_partition_back(pair):
    old, new = pair
    serve_partitions(old, Tokens("old", 100))
    new.writers.follow(Tokens("new", 200))
    (first,) = old.put("q", messages(b"first"), 0)
    new.writers.fence("q", 0)  # the newer owner takes it with its larger token
    for _ in range(3):  # the in-flight write, and every write after it: no retake
        with pytest.raises(Fenced):
            old.put("q", messages(b"stale"), 0)
    (second,) = new.put("q", messages(b"new owner"), 0)
    assert second > first and stored(new) == [b"first", b"new owner"]


def test_a_refused_group_write_drops_the_state_held_in_memory(pair):
    """What the group held for the partition was ahead of the store: it is read again,
    so the messages whose ack was refused come back, none stays leased for ever."""
    old, new = pair
    old.put("q", messages(b"m1", b"m2"), 0)
    old.groups.open("q", "g", None, 0, 3)
    keys = [m.rowkey for m, _ in old.groups.receive("q", "g", "member", 10, 30.0, 0) if m.partition_id == 0]
    new.storage.take_partition("q", 0)
    with pytest.raises(Fenced):
        old.groups.ack("q", "g", keys)
    again = [m.rowkey for m, _ in old.groups.receive("q", "g", "member", 10, 30.0, 0) if m.partition_id == 0]
    assert again == keys
