"""The server's Prometheus metrics (--metrics-port): counts, times, lag."""

import re
import urllib.request

import pytest

from hqueue import HQueue, HQueueAdmin, Message, MessageListener, Subscription
from hqueue.server import HQueueServer

from ..processes import wait_for


def scrape(server) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r"^(hqueue_\S+) (\S+)$", text, re.M)}


class Refuse(MessageListener):
    def on_messages(self, messages):
        raise RuntimeError("not today")


class Take(MessageListener):
    def __init__(self):
        self.count = 0

    def on_messages(self, messages):
        self.count += len(messages)


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server
    server.stop()


def test_puts_connections_and_partitions_are_counted(server):
    with HQueue("q", f"hqueue://{server.address}") as queue:
        queue.put([Message("t", b"x")] * 7, partition_id=0)
        queue.put(Message("t", b"y"), partition_id=1)
        metrics = scrape(server)
    assert metrics['hqueue_put_messages_total{queue="q"}'] == 8
    assert metrics['hqueue_put_seconds_count{queue="q"}'] == 2
    assert metrics['hqueue_owned_partitions{queue="q"}'] == 2
    assert metrics["hqueue_connections"] >= 1
    assert metrics["hqueue_inflight_request_bytes"] == 0  # nothing under way between calls


def test_delivery_and_lag_per_subscriber_and_partition(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        taker = Take()
        with (
            queue.create_subscriber(Subscription("taker"), [taker]),
            queue.create_subscriber(Subscription("refuser"), [Refuse()]),
        ):
            queue.put([Message("t", b"x")] * 5, partition_id=1)
            wait_for(lambda: taker.count == 5, 20, "delivery")
            key = '{partition="1",queue="q",subscriber="%s"}'
            failures = 'hqueue_delivery_failures_total{queue="q",subscriber="refuser"}'
            wait_for(lambda: scrape(server).get(failures, 0) > 0, 20, "a refused push")
            lag = "hqueue_subscriber_lag_seconds" + key % "refuser"
            wait_for(lambda: scrape(server).get(lag, 0) > 0, 20, "lag in time")
            metrics = scrape(server)
    assert metrics['hqueue_delivered_messages_total{queue="q",subscriber="taker"}'] == 5
    assert metrics["hqueue_subscriber_lag_messages" + key % "taker"] == 0
    assert metrics["hqueue_subscriber_lag_seconds" + key % "taker"] == 0
    assert metrics["hqueue_subscriber_lag_messages" + key % "refuser"] == 5  # one waiting batch: lag, not 0
    assert metrics['hqueue_delivery_seconds_count{queue="q",subscriber="taker"}'] >= 1


def test_a_taken_metrics_port_fails_before_anything_starts(server, tmp_path):
    with pytest.raises(OSError, match=f"metrics port {server.metrics_port}"):
        HQueueServer(f"local://{tmp_path}/other", port=0, metrics_port=server.metrics_port)


def test_consumer_groups_are_counted_per_group_and_partition(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("workers", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
        got = []
        while len(got) < 5:
            got += consumer.receive(5, wait=1)
        consumer.ack(got[:3])
        consumer.nack(got[3:4], delay=60)
        metrics = scrape(server)
    group, partition = 'group="workers",queue="q"', 'group="workers",partition="0",queue="q"'
    assert metrics[f"hqueue_group_received_messages_total{{{group}}}"] == 5
    assert metrics[f"hqueue_group_acked_messages_total{{{group}}}"] == 3
    assert metrics[f"hqueue_group_nacked_messages_total{{{group}}}"] == 1
    assert metrics[f"hqueue_group_members{{{group}}}"] == 1
    assert metrics[f"hqueue_group_in_flight_messages{{{partition}}}"] == 1
    assert metrics[f"hqueue_group_retrying_messages{{{partition}}}"] == 1
    assert metrics[f"hqueue_group_lag_messages{{{partition}}}"] == 2
    assert metrics[f"hqueue_group_lag_seconds{{{partition}}}"] >= 0


def test_acks_of_receipts_a_group_never_handed_out_are_counted(server):
    from hqueue.api import groups_of
    from hqueue.message import MessageID, encode_rowkey

    with HQueue("q", f"hqueue://{server.address}") as queue, queue.consumer("workers") as consumer:
        queue.put([Message("t", b"x")], 0)
        (real,) = wait_for(lambda: consumer.receive(1, wait=1), 10, "a delivery")
        made_up = [encode_rowkey(0, MessageID(4_000_000_000_000, i)) for i in range(7)]
        assert groups_of(queue.engine).ack("q", "workers", [real.rowkey, *made_up]) == 1
        metrics = scrape(server)
    assert metrics['hqueue_group_unknown_acks_total{group="workers",queue="q"}'] == 7
    assert metrics['hqueue_group_acked_messages_total{group="workers",queue="q"}'] == 1
