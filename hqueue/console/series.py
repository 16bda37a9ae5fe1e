"""The console's charts: an hour of samples kept in memory, in compact arrays.

A :class:`Sampler` thread reads counters every ``interval`` seconds (5 by
default) and keeps the last hour (720 points) of each series in a ring of
``array('f')`` (4 bytes a point, about 2.9 KB a series):

* the totals (messages put, delivered to subscribers, acked by groups, per
  second; connections; RSS), always;
* the put rate of each queue that was written in the last hour, at most
  :data:`MAX_QUEUE_SERIES` (the busiest of a sample get one; the least
  recently written goes first);
* the lag of each consumer group the console was asked about (its pages and
  their live refresh), per partition, at most :data:`MAX_GROUP_SERIES` groups
  of :data:`MAX_PARTITION_SERIES` partitions (the least recently viewed goes).

So memory stays under about 2 MB for queue series and 6 MB for group series
whatever the number of queues and groups. Rates come from the counters the
Prometheus metrics read (:class:`Counters`), never from rows.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

#: Seconds between samples, and how many are kept (an hour).
INTERVAL = 5.0
POINTS = 720
#: Queues with a put-rate series; groups, and partitions per group, with a lag series.
MAX_QUEUE_SERIES = 500
MAX_GROUP_SERIES = 50
MAX_PARTITION_SERIES = 32


class Ring:
    """The last ``size`` values of one series, with their times (shared by a :class:`Clock`)."""

    __slots__ = ("values", "start")

    def __init__(self, size: int, start: int) -> None:
        self.values = array("f", [float("nan")] * size)
        #: The tick of the first point this series holds (earlier ticks show as gaps).
        self.start = start

    def put(self, tick: int, value: float) -> None:
        self.values[tick % len(self.values)] = value


@dataclass
class Counters:
    """Where the sampler reads cumulative counts and gauges (each may be None: not known here).

    Attributes:
        puts: Messages put per queue so far (the ``hqueue_put_messages`` counters).
        delivered: Messages subscribers took so far, all together.
        acked: Messages consumer groups acked so far, all together.
        connections: Open client connections.
    """

    puts: Callable[[], Mapping[str, float]] | None = None
    delivered: Callable[[], float] | None = None
    acked: Callable[[], float] | None = None
    connections: Callable[[], int] | None = None


TOTALS = ("put_rate", "delivered_rate", "acked_rate", "connections", "rss_mb")


@dataclass
class _Previous:
    puts: dict[str, float] = field(default_factory=dict)
    delivered: float | None = None
    acked: float | None = None


class Sampler:
    """Samples :class:`Counters` every ``interval`` seconds into hour-long rings."""

    def __init__(self, counters: Counters, interval: float = INTERVAL, points: int = POINTS) -> None:
        self.counters, self.interval, self.points = counters, interval, points
        self.tick = 0
        self._times = array("d", [0.0] * points)
        self.totals = {name: Ring(points, 0) for name in TOTALS}
        self.queues: OrderedDict[str, Ring] = OrderedDict()
        self.groups: OrderedDict[tuple[str, str], dict[str, Ring]] = OrderedDict()
        self._group_ticks: dict[tuple[str, str], int] = {}
        self._previous = _Previous()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="hqueue-console-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # one bad read never stops the charts
                logger.warning("console sample failed", exc_info=True)

    def sample(self) -> None:
        """Take one sample of every counter (the thread calls it; tests may too)."""
        now = time.time()
        with self._lock:
            self.tick += 1
            tick = self.tick
            elapsed = now - self._times[(tick - 1) % self.points] if tick > 1 else 0.0
            self._times[tick % self.points] = now
            c, previous = self.counters, self._previous
            puts = dict(c.puts()) if c.puts else {}
            self.totals["put_rate"].put(tick, _rate(sum(puts.values()), sum(previous.puts.values()), elapsed))
            written = []
            for queue, count in puts.items():
                # A queue's counter starts at 0 with its first put: one not there at the
                # last sample counts from 0 (at the first sample, nothing is known yet).
                before = previous.puts.get(queue, 0 if tick > 1 else None)
                if before is not None and count != before:
                    written.append((_rate(count, before, elapsed), queue))
                elif queue in self.queues:
                    self.queues[queue].put(tick, 0.0 if before is not None else float("nan"))
            if len(written) > MAX_QUEUE_SERIES:  # the busiest keep (or get) a series
                written = heapq.nlargest(MAX_QUEUE_SERIES, written)
            for rate, queue in written:
                self._queue_ring(queue, tick).put(tick, rate)
            previous.puts = puts
            previous.delivered = self._total("delivered_rate", c.delivered, previous.delivered, tick, elapsed)
            previous.acked = self._total("acked_rate", c.acked, previous.acked, tick, elapsed)
            self.totals["connections"].put(tick, float(c.connections()) if c.connections else float("nan"))
            self.totals["rss_mb"].put(tick, rss_bytes() / 2**20)

    def _total(self, name: str, read: Callable[[], float] | None, before: float | None, tick: int, elapsed: float):
        value = read() if read else None
        self.totals[name].put(tick, float("nan") if value is None else _rate(value, before, elapsed))
        return value

    def _queue_ring(self, queue: str, tick: int) -> Ring:
        ring = self.queues.get(queue)
        if ring is None:
            if len(self.queues) >= MAX_QUEUE_SERIES:
                self.queues.popitem(last=False)
            ring = self.queues[queue] = Ring(self.points, tick)
        self.queues.move_to_end(queue)
        return ring

    def record_lag(self, queue: str, group: str, partitions: Mapping[int, Mapping[str, float]]) -> None:
        """Note a group's lag (``describe_group``'s partitions) as the console read it, at most one
        point per tick."""
        key = (queue, group)
        with self._lock:
            tick = self.tick
            if self._group_ticks.get(key) == tick:
                return
            series = self.groups.get(key)
            if series is None:
                if len(self.groups) >= MAX_GROUP_SERIES:
                    old, _ = self.groups.popitem(last=False)
                    self._group_ticks.pop(old, None)
                series = self.groups[key] = {}
            self.groups.move_to_end(key)
            self._group_ticks[key] = tick
            for pid in sorted(partitions)[:MAX_PARTITION_SERIES]:
                for kind in ("lag_messages", "lag_millis"):
                    name = f"{kind}:{pid}"
                    ring = series.get(name) or series.setdefault(name, Ring(self.points, tick))
                    ring.put(tick, float(partitions[pid].get(kind, 0)))

    def chart(self, rings: Mapping[str, Ring]) -> dict[str, list]:
        """``{"t": [epoch s…], name: [value or None…]}`` of the hour kept, oldest first."""
        with self._lock:
            first = max(1, self.tick - self.points + 1)
            ticks = range(first, self.tick + 1)
            out: dict[str, list] = {"t": [round(self._times[t % self.points], 3) for t in ticks]}
            for name, ring in rings.items():
                out[name] = [_point(ring.values[t % self.points]) if t >= ring.start else None for t in ticks]
        return out

    def latest(self, name: str) -> float | None:
        """The last sample of total ``name`` (None: not known here)."""
        with self._lock:
            return _point(self.totals[name].values[self.tick % self.points])

    def queue_chart(self, queue: str) -> dict[str, list]:
        ring = self.queues.get(queue)
        return self.chart({"put_rate": ring} if ring else {})

    def group_chart(self, queue: str, group: str) -> dict[str, list]:
        return self.chart(dict(self.groups.get((queue, group), {})))


def _rate(now: float, before: float | None, elapsed: float) -> float:
    if before is None or elapsed <= 0 or now < before:  # a restart or the first sample
        return 0.0
    return (now - before) / elapsed


def _point(value: float) -> float | None:
    return None if value != value else round(value, 3)  # NaN: no point (a gap in the chart)


def rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
