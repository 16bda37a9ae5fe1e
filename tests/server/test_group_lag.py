"""Consumer-group lag through a server (issue 19.1, 19.2): ``describe_group`` and the
``hqueue_group_lag_messages`` gauge agree, count only what is not acked, and cover
every group and partition the server owns, from its start."""

from __future__ import annotations

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.server import HQueueServer

from ..processes import drain
from .test_metrics import scrape


def lag_series(group: str, partition: int) -> str:
    return f'hqueue_group_lag_messages{{group="{group}",partition="{partition}",queue="q"}}'


def described_lag(url: str, group: str) -> dict[int, int]:
    with HQueueAdmin(url) as admin:
        partitions = admin.describe_group("q", group)["partitions"]
    return {pid: p["lag_messages"] for pid, p in partitions.items()}


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server
    server.stop()


def test_acks_ahead_of_the_cursor_are_not_lag_in_describe_or_the_gauge(server):
    # Given 20 messages, 10 received, and the 5 at odd positions acked
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("g", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
        got = drain(consumer, 10)
        assert consumer.ack(got[1::2]) == 5
        # Then both say 15
        assert described_lag(url, "g")[0] == 15
        key = lag_series("g", 0)
        assert scrape(server)[key] == 15  # the first scrape: no wait for a background count


def test_a_new_group_has_exact_series_before_its_first_receive(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"x")] * 3, 1)
        queue.consumer("fresh", member="m").close()  # made, never received from
    keys = [lag_series("fresh", p) for p in (0, 1)]
    metrics = scrape(server)  # the first scrape: the group is loaded as it is made, and counted for it
    assert [metrics[k] for k in keys] == [0, 3]
    assert described_lag(url, "fresh") == {0: 0, 1: 3}


def test_after_receiving_from_one_partition_the_gauge_equals_describe_on_each(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("g", member="m") as consumer:
        # Given a member that received from partition 1 only, and acked 6 of its 10
        queue.put([Message("t", b"%d" % i) for i in range(10)], 1)
        got = drain(consumer, 10)
        assert {d.partition_id for d in got} == {1}
        consumer.ack(got[:6])
        # And 10 messages in partition 0 written since, never received
        queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
        keys = [lag_series("g", p) for p in (0, 1)]
        # Then each partition's gauge says what describe_group says
        assert described_lag(url, "g") == {0: 10, 1: 4}
        metrics = scrape(server)
        assert [metrics[k] for k in keys] == [10, 4]


def test_after_a_restart_every_group_has_its_series_before_a_member_returns(tmp_path):
    data = f"local://{tmp_path}/data"
    server = HQueueServer(data, port=0, metrics_port=0).start()
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    with HQueue("q", url) as queue, queue.consumer("g", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(8)], 0)
        consumer.ack(drain(consumer, 8)[:5])
        queue.put([Message("t", b"x")] * 2, 1)
    server.stop()
    # When the server starts again, and no member comes back
    again = HQueueServer(data, port=0, metrics_port=0).start()
    try:
        keys = [lag_series("g", p) for p in (0, 1)]
        metrics = scrape(again)
        # Then the first scrape has the series, exact
        assert [metrics[k] for k in keys] == [3, 2]
        assert described_lag(f"hqueue://{again.address}", "g") == {0: 3, 1: 2}
    finally:
        again.stop()
