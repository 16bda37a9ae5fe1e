"""Priority tiers (SPEC X4): higher tiers served first by consumer groups, lower ones never starved.

Runs on every storage backend and through a server (``make_queue``).
"""

from __future__ import annotations

import time

import pytest

from hqueue import HQueueAdmin, InvalidArgument, InvalidPartition, Message
from hqueue.groups.state import STARVE_GUARD


def test_puts_go_to_their_tier_s_partitions(make_queue):
    queue = make_queue(partitions=6, priorities=3)
    assert queue.info.priorities == 3
    assert [queue.info.tier_of(p) for p in range(6)] == [0, 0, 1, 1, 2, 2]
    ids = {p: queue.put(Message("t", b"%d" % p), priority=p) for p in range(3)}
    assert ids
    by_value = {m.value: m.partition_id for m in queue.scan()}
    assert by_value[b"0"] in (0, 1) and by_value[b"1"] in (2, 3) and by_value[b"2"] in (4, 5)
    queue.put(Message("t", b"plain"))  # no priority: the lowest tier
    queue.put(Message("t", b"keyed"), key="k1", priority=2)
    placed = {m.value: m.partition_id for m in queue.scan()}
    assert placed[b"plain"] in (0, 1) and placed[b"keyed"] in (4, 5)
    with pytest.raises(InvalidArgument):
        queue.put(Message("t", b"x"), priority=3)
    with pytest.raises(InvalidPartition):
        queue.put(Message("t", b"x"), partition_id=0, priority=2)
    # not a tier: refused, where [], {}, '' and False went to tier 0 (an attacker's pass)
    for bad in ([], {}, "", False, "1", 1.0):
        with pytest.raises(InvalidArgument, match="'priority' must be in 0..2"):
            queue.put(Message("t", b"x"), priority=bad)
        with pytest.raises(InvalidArgument, match="'priority' must be in 0..2"):
            queue.put(Message("t", b"x"), partition_id=0, priority=bad)


def test_a_priority_on_a_queue_without_tiers_is_its_one_tier(make_queue):
    queue = make_queue(partitions=2)
    queue.put(Message("t", b"x"), priority=0)
    for bad in (1, [], "", False):
        with pytest.raises(InvalidArgument, match="'priority' must be in 0..0"):
            queue.put(Message("t", b"x"), priority=bad)


def test_a_group_serves_the_highest_tier_first_without_starving_the_rest(make_queue):
    queue = make_queue(partitions=2, priorities=2)
    queue.put([Message("t", b"low-%d" % i) for i in range(40)], priority=0)
    queue.put([Message("t", b"high-%d" % i) for i in range(40)], priority=1)
    with queue.consumer("g") as consumer:
        batches = []
        for _ in range(2 * STARVE_GUARD):
            got = consumer.receive(5, wait=1)
            consumer.ack(got)
            batches.append({d.value.split(b"-")[0] for d in got})
    assert batches.count({b"high"}) >= len(batches) - 2  # mostly the high tier…
    assert {b"low"} in batches  # …but the low tier is served too, while high work is waiting


def test_bad_tier_counts_are_refused(admin, queue_name):
    with pytest.raises(InvalidArgument, match="priorities"):
        admin.create_queue(queue_name, 4, priorities=3)  # 3 does not divide 4
    with pytest.raises(InvalidArgument, match="priorities"):
        admin.create_queue(queue_name, 4, priorities=0)
    # digits int() cannot read ('²' raised a bare ValueError) or can ('٢' was stored so)
    for tiers in ("\u00b2", "\u2460", "\u0662"):
        with pytest.raises(InvalidArgument, match="'priorities' must be 1..partitions"):
            admin.create_queue(queue_name, 4, config={"hqueue.priorities": tiers})
    # both ways of saying it, differing: one of them won, unsaid
    for given, said in ((1, "2"), (2, "4")):
        with pytest.raises(
            InvalidArgument, match=f"'priorities' is {given} and config 'hqueue.priorities' is '{said}'"
        ):
            admin.create_queue(queue_name, 4, config={"hqueue.priorities": said}, priorities=given)
    assert not admin.queue_exists(queue_name)
    assert admin.create_queue(queue_name, 4, config={"hqueue.priorities": "2"}, priorities=2).priorities == 2


def test_tiers_survive_a_reopen(tmp_path):
    url = "local://" + str(tmp_path / "data")
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 4, priorities=2)
    with HQueueAdmin(url) as admin:
        assert admin.describe_queue("q")["config"]["hqueue.priorities"] == "2"


@pytest.mark.parametrize("made", ["at once", "slowly"])
def test_push_subscriptions_deliver_the_highest_tier_first(tmp_path, monkeypatch, made):
    """A subscriber's workers were started one by one, each ready at once: a push thread
    could take the low tier's before the high tier's was made (CI, on a busy machine).
    ``slowly``: each worker after the first takes 0.3 s to make."""
    from hqueue import HQueue, Subscription
    from hqueue.server import HQueueServer
    from hqueue.subscriptions import delivery

    from ..processes import wait_for
    from .test_subscriber import Collect

    if made == "slowly":
        init = delivery.PartitionWorker.__init__

        def slow(self, manager, registration, partition_id):
            if partition_id:
                time.sleep(0.3)
            init(self, manager, registration, partition_id)

        monkeypatch.setattr(delivery.PartitionWorker, "__init__", slow)
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("jobs", 2, priorities=2)
            admin.add_subscriber("jobs", "worker")  # registered, away: work piles up
        with HQueue("jobs", url) as queue:
            for _ in range(5):
                queue.put([Message("t", b"low")] * 100, priority=0)
                queue.put([Message("t", b"high")] * 100, priority=1)
            listener = Collect()
            with queue.create_subscriber(Subscription("worker"), [listener]):
                wait_for(lambda: len(listener.messages) == 1000, 20, "everything to arrive")
        values = listener.values()
        assert values[0] == b"high"  # the high tier's partition went first
        assert values.index(b"low") > 0 and values.count(b"low") == 500  # and the low tier all the same
    finally:
        server.stop()
