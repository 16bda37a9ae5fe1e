"""Prometheus metrics of one hqueue server (X6), served with ``--metrics-port``.

Counted as things happen: messages put and the time each put call takes
(validation, IDs, the write: the enqueue time), messages pushed to each
subscriber, failed pushes, the subscriber's ``consumeMessages`` round trip
(its processing time), partitions gained and lost (rebalances).

Read when Prometheus scrapes: open connections and scanners, owned
partitions, each push worker's buffer, and each subscriber's lag per
partition this server delivers: undelivered messages (counted up to 100,000)
and the age in seconds of the oldest undelivered one (0 when none waits).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class ServerMetrics:
    """The counters a server updates, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        queue, subscriber = ["queue"], ["queue", "subscriber"]
        self.put_messages = Counter("hqueue_put_messages", "Messages written through this server.", queue, registry=r)
        self.put_seconds = Histogram(
            "hqueue_put_seconds", "One put call: checks, IDs, the write.", queue, buckets=_BUCKETS, registry=r
        )
        self.delivered = Counter("hqueue_delivered_messages", "Messages subscribers took.", subscriber, registry=r)
        self.delivery_failures = Counter(
            "hqueue_delivery_failures", "Pushes that failed or were refused (retried).", subscriber, registry=r
        )
        self.delivery_seconds = Histogram(
            "hqueue_delivery_seconds",
            "consumeMessages round trip: the subscriber's processing of a batch.",
            subscriber,
            buckets=_BUCKETS,
            registry=r,
        )
        self.dead_lettered = Counter(
            "hqueue_dead_lettered_messages",
            "Messages moved to <queue>.dlq after the subscriber refused them too often.",
            subscriber,
            registry=r,
        )
        group = ["queue", "group"]
        self.group_received = Counter(
            "hqueue_group_received_messages", "Messages handed to consumer-group members.", group, registry=r
        )
        self.group_acked = Counter("hqueue_group_acked_messages", "Messages consumer groups acked.", group, registry=r)
        self.group_unknown_acks = Counter(
            "hqueue_group_unknown_acks",
            "Acked receipts a consumer group never handed out (ignored).",
            group,
            registry=r,
        )
        self.group_nacked = Counter(
            "hqueue_group_nacked_messages", "Messages consumer-group members gave back.", group, registry=r
        )
        self.partition_changes = Counter(
            "hqueue_partition_changes", "Partitions this server gained or lost (rebalances).", ["change"], registry=r
        )
        self._server: Any = None

    def watch(self, collect: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        """Add gauges read at scrape time."""
        self.registry.register(_Collector(collect))

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` over HTTP in a thread; returns the port (0: a free one)."""
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise OSError(e.errno, f"metrics port {port} on {host}: {e.strerror}") from e
        bound = self._server.server_address[1]
        logger.info("metrics on http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Collector(Collector):
    def __init__(self, collect: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            yield from self._collect()
        except Exception:  # a scrape never takes the server down
            logger.warning("collecting metrics failed", exc_info=True)

    def describe(self) -> list:
        return []  # collected fresh on each scrape


def gauge(name: str, help: str, labels: list[str], samples: Sequence[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family
