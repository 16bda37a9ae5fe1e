"""Prometheus metrics of one hqueue server (X6), served with ``--metrics-port``.

Counted as things happen: messages put and the time each put call takes
(validation, IDs, the write: the enqueue time), messages pushed to each
subscriber, failed pushes, the subscriber's push (``consumePacked``) round trip
(its processing time), partitions gained and lost (rebalances), messages
consumer groups received, acked and gave back; and prometheus_client's
``process_*`` series of the server process (RSS, CPU seconds, open files).

Read when Prometheus scrapes, from what the server keeps in memory (a scrape
reads no row: its cost is O(series)): open connections and scanners, owned
partitions, each push worker's buffer, each consumer group's members, and
per group or subscriber and partition the messages not yet acked (or
delivered) and the age of the oldest of them (kept by lag.py's LagBook, with
the bounds its docstring states).

The per-group and per-partition series can number tens of thousands, so
they are written here by hand (:class:`Family`, about 0.3 µs a sample),
not through prometheus_client's registry (about 6 µs a sample), which
keeps the per-subscriber counters and histograms.

What a put updates is on the hot path of every put call, so it costs what a
counter does: :meth:`ServerMetrics.puts` gives a queue's :class:`PutSeries`
(its counter and histogram, bound once and kept), and a put is one bisect
and one lock (about 1 µs), where ``Histogram.labels(queue).observe()`` and
``Counter.labels(queue).inc()`` looked the label children up on each call
(5 to 20 µs, the most of any one step of an unbatched put).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest

from .endpoint import MetricsEndpoint

logger = logging.getLogger(__name__)

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


def escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Family:
    """A series family written by hand: ``add(labels, value)`` with ``labels`` already
    in the text format (``group="g",partition="0",queue="q"``: sorted, escaped)."""

    __slots__ = ("name", "help", "kind", "lines", "_series")

    def __init__(self, name: str, help: str, kind: str = "gauge") -> None:
        self.name, self.help, self.kind = name, help, kind
        self._series = name + "_total" if kind == "counter" else name
        self.lines: list[str] = []

    def add(self, labels: str, value: float) -> None:
        self.lines.append(f"{self._series}{{{labels}}} {value}\n" if labels else f"{self._series} {value}\n")

    def header(self) -> str:
        return f"# HELP {self._series} {self.help}\n# TYPE {self._series} {self.kind}\n"


class LabelledCounts:
    """A counter per label set, written by hand (see :class:`Family`)."""

    def __init__(self, name: str, help: str, labels: tuple[str, ...]) -> None:
        self.name, self.help, self.labels = name, help, labels
        self._counts: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, values: tuple[str, ...], amount: float = 1) -> None:
        with self._lock:
            self._counts[values] = self._counts.get(values, 0) + amount

    def value(self, values: tuple[str, ...]) -> float:
        return self._counts.get(values, 0)

    def total(self) -> float:
        """Every label set's count together."""
        with self._lock:
            return sum(self._counts.values())

    def keep(self, wanted: Callable[[tuple[str, ...]], bool]) -> None:
        """Drop the label sets ``wanted`` says no to (what they counted is gone: a deleted
        group's series no longer take memory, nor lines in every scrape)."""
        with self._lock:
            for values in [v for v in self._counts if not wanted(v)]:
                del self._counts[values]

    def family(self) -> Family:
        family = Family(self.name, self.help, "counter")
        with self._lock:
            counts = list(self._counts.items())
        order = sorted(range(len(self.labels)), key=self.labels.__getitem__)
        for values, count in counts:
            family.add(",".join(f'{self.labels[i]}="{escape(values[i])}"' for i in order), count)
        return family


class PutSeries:
    """One queue's put counter and put-time histogram, written by hand (see :class:`Family`).

    :meth:`observe` is the whole cost of counting a put: a bisect over the
    bucket bounds and one lock around four additions.
    """

    __slots__ = ("queue", "messages", "buckets", "calls", "seconds", "_lock")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.messages = 0
        #: Calls per bucket (not cumulative; the last is +Inf).
        self.buckets = [0] * (len(_BUCKETS) + 1)
        self.calls, self.seconds = 0, 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float, messages: int) -> None:
        """Count one put call of ``messages`` that took ``seconds``."""
        bucket = bisect.bisect_left(_BUCKETS, seconds)
        with self._lock:
            self.buckets[bucket] += 1
            self.calls += 1
            self.seconds += seconds
            self.messages += messages

    def samples(self) -> tuple[int, list[int], int, float]:
        """(messages, cumulative bucket counts, calls, seconds), read together."""
        with self._lock:
            messages, buckets, calls, seconds = self.messages, list(self.buckets), self.calls, self.seconds
        cumulative, total = [], 0
        for count in buckets:
            total += count
            cumulative.append(total)
        return messages, cumulative, calls, seconds


def _put_families(series: list[PutSeries]) -> list[Family]:
    messages = Family("hqueue_put_messages", "Messages written through this server.", "counter")
    seconds = Family("hqueue_put_seconds", "One put call: checks, IDs, the write.", "histogram")
    for one in series:
        label = f'queue="{escape(one.queue)}"'
        count, cumulative, calls, total = one.samples()
        messages.add(label, float(count))  # as prometheus_client wrote it: 1.0
        lines = seconds.lines
        for bound, calls_under in zip((*_BUCKETS, float("inf")), cumulative, strict=True):
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'hqueue_put_seconds_bucket{{le="{le}",{label}}} {float(calls_under)}\n')
        lines.append(f"hqueue_put_seconds_count{{{label}}} {float(calls)}\n")
        lines.append(f"hqueue_put_seconds_sum{{{label}}} {total}\n")
    return [messages, seconds]


class ServerMetrics:
    """The counters a server updates, and what it reads at each scrape."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # process_resident_memory_bytes, process_cpu_seconds_total, open fds: read from /proc at a scrape
        ProcessCollector(registry=r)
        subscriber = ["queue", "subscriber"]
        self._puts: dict[str, PutSeries] = {}
        self._puts_lock = threading.Lock()
        self.delivered = Counter("hqueue_delivered_messages", "Messages subscribers took.", subscriber, registry=r)
        self.delivery_failures = Counter(
            "hqueue_delivery_failures", "Pushes that failed or were refused (retried).", subscriber, registry=r
        )
        self.delivery_seconds = Histogram(
            "hqueue_delivery_seconds",
            "Push round trip (consumePacked or consumeMessages): the subscriber's processing of a batch.",
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
        self.partition_changes = Counter(
            "hqueue_partition_changes", "Partitions this server gained or lost (rebalances).", ["change"], registry=r
        )
        for change in ("gained", "lost"):  # (0 from the start: a single server's never move, and a
            self.partition_changes.labels(change)  # family with no sample read as a missing series)
        group = ("queue", "group")
        self.group_received = LabelledCounts(
            "hqueue_group_received_messages", "Messages handed to consumer-group members.", group
        )
        self.group_acked = LabelledCounts("hqueue_group_acked_messages", "Messages consumer groups acked.", group)
        self.group_unknown_acks = LabelledCounts(
            "hqueue_group_unknown_acks", "Acked receipts a consumer group never handed out (ignored).", group
        )
        self.group_nacked = LabelledCounts(
            "hqueue_group_nacked_messages", "Messages consumer-group members gave back.", group
        )
        self._group_counts = (self.group_received, self.group_acked, self.group_unknown_acks, self.group_nacked)
        #: The consumer groups there are now (the server sets it): the series of any other
        #: are dropped at a scrape, so a client that makes and deletes groups grows nothing.
        self.groups_now: Callable[[], Collection[tuple[str, str]]] | None = None
        self._families: list[Callable[[], Iterable[Family]]] = [
            lambda: _put_families(list(self._puts.values())),
            self._group_families,
        ]
        self._render_lock = threading.Lock()
        self._endpoint: Any = None

    def puts(self, queue: str) -> PutSeries:
        """``queue``'s put series, made on its first put and kept (one dict read after that)."""
        series = self._puts.get(queue)
        if series is None:
            with self._puts_lock:
                series = self._puts.setdefault(queue, PutSeries(queue))
        return series

    def _group_families(self) -> list[Family]:
        if self.groups_now is not None:
            live = set(self.groups_now())
            for counts in self._group_counts:
                counts.keep(live.__contains__)
        return [counts.family() for counts in self._group_counts]

    def forget_queue(self, queue: str) -> None:
        """Drop a deleted queue's series: its puts' and its groups'."""
        with self._puts_lock:
            self._puts.pop(queue, None)
        for counts in self._group_counts:
            counts.keep(lambda values: values[0] != queue)

    def forget_subscriber(self, queue: str, subscriber: str) -> None:
        """Drop the series of a subscriber this server no longer pushes to (deleted, detached
        or moved: they start again from 0 if it comes back, as a counter may)."""
        for metric in (self.delivered, self.delivery_failures, self.delivery_seconds, self.dead_lettered):
            with contextlib.suppress(KeyError):
                metric.remove(queue, subscriber)

    def put_counts(self) -> dict[str, int]:
        """Messages put so far per queue (the ``hqueue_put_messages`` counters)."""
        return {queue: series.messages for queue, series in list(self._puts.items())}

    def delivered_total(self) -> float:
        """Messages subscribers took so far, all together (``hqueue_delivered_messages``)."""
        return sum(s.value for m in self.delivered.collect() for s in m.samples if s.name.endswith("_total"))

    def watch(self, collect: Callable[[], Iterable[Family]]) -> None:
        """Add series read at scrape time."""
        self._families.append(collect)

    def render(self) -> bytes:
        """The text format of every series (one scrape at a time: a second waits)."""
        with self._render_lock:
            # Tens of thousands of lines make no garbage cycles: the cycle collector's
            # passes over the whole heap meanwhile would cost more than the render.
            paused = gc.isenabled()
            gc.disable()
            try:
                parts = [generate_latest(self.registry).decode()]
                for collect in self._families:
                    try:
                        for family in collect():  # one join of every line: no copy per family
                            parts.append(family.header())
                            parts += family.lines
                    except Exception:  # a scrape never takes the server down
                        logger.warning("collecting metrics failed", exc_info=True)
                return "".join(parts).encode()
            finally:
                if paused:
                    gc.enable()

    def serve(
        self, port: int, host: str = "127.0.0.1", allows: Callable[[str | None, str], bool | int] | None = None
    ) -> int:
        """Serve ``/metrics`` over HTTP in a thread; returns the port (0: a free one).

        Args:
            allows: Whether a request's ``Authorization`` header (None: none), from a
                peer host, may read; None lets every request read.
        """
        self._endpoint = MetricsEndpoint(self.render, host, port, allows)
        logger.info("metrics on http://%s:%d/metrics", host, self._endpoint.port)
        return self._endpoint.port

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()


def gauge(name: str, help: str, labels: list[str], samples: Iterable[tuple[list[str], float]]) -> Family:
    """A family of a few series, labels given by name (sorted and escaped here)."""
    family = Family(name, help)
    order = sorted(range(len(labels)), key=labels.__getitem__)
    for values, value in samples:
        family.add(",".join(f'{labels[i]}="{escape(values[i])}"' for i in order), value)
    return family
