"""What a server's metrics read at each scrape: from memory only, never a row.

Lag comes from the :class:`~hqueue.lag.LagBook` (counts kept as messages are
written, acked and delivered); a reader not yet counted once (a group just
made, a server just started) has no lag series until the book's thread has
counted it: a scrape that meets one waits for the count, at most
``SCRAPE_WAIT`` seconds, and renders again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ..coordination import Coordinator
from ..engine import Engine
from ..groups.service import GroupService
from ..groups.state import PartitionState
from ..groups.views import GroupSnapshot
from ..ids import wall_clock_ms
from ..lag import Ahead, LagBook, none_ahead
from ..metrics import Family, escape, gauge
from ..subscriptions.delivery import PartitionWorker
from ..subscriptions.manager import SubscriptionManager
from .scanners import ScannerRegistry


class Served(Protocol):
    """What the gauges read of a server (app.py's HQueueServer)."""

    engine: Engine
    coordinator: Coordinator
    scanners: ScannerRegistry
    subscriptions: SubscriptionManager | None
    groups: GroupService | None

    @property
    def connections(self) -> int: ...
    @property
    def inflight_bytes(self) -> int: ...


#: The longest a scrape waits for the lag book to count readers it has not counted yet.
SCRAPE_WAIT = 2.0


def server_gauges(server: Served, book: LagBook) -> Callable[[], list[Family]]:
    """The collect function of ``server``'s scrape-time series: every series, the lag of
    every reader included, unless counting them takes more than ``SCRAPE_WAIT``."""

    def collect() -> list[Family]:
        deadline = time.monotonic() + SCRAPE_WAIT
        while True:
            families = render()
            if book.wait_counted(0) or not book.wait_counted(deadline - time.monotonic()):
                return families

    def render() -> list[Family]:
        families = [
            gauge("hqueue_connections", "Open client connections.", [], [([], server.connections)]),
            gauge("hqueue_scanners", "Open server-side scanners.", [], [([], len(server.scanners))]),
            gauge(
                "hqueue_inflight_request_bytes",
                "Bytes of request frames under way and replies not yet taken (the --max-inflight-bytes budget).",
                [],
                [([], server.inflight_bytes)],
            ),
        ]
        owned = [([q.name], len(server.coordinator.owned(q.name, q.partitions))) for q in server.engine.list_queues()]
        families.append(gauge("hqueue_owned_partitions", "Partitions this server writes.", ["queue"], owned))
        families += subscriber_families(server, book)
        families += group_families(server.groups.snapshot() if server.groups else [], book)
        return families

    return collect


def subscriber_families(server: Served, book: LagBook) -> list[Family]:
    buffers = Family("hqueue_push_buffer_messages", "Messages read and waiting to be pushed.")
    lag = Family("hqueue_subscriber_lag_messages", "Messages not yet delivered (see lag.py for the bounds).")
    age = Family("hqueue_subscriber_lag_seconds", "Age of the oldest message not yet delivered.")
    now = wall_clock_ms()
    for w in server.subscriptions.running() if server.subscriptions else []:
        labels = f'partition="{w.partition_id}",queue="{escape(w.queue)}",subscriber="{escape(w.name)}"'
        buffers.add(labels, len(w.buffer))
        cursor, finished = w.progress
        known = book.lag(w, w.queue, w.partition_id, w.registration.effective_topics, cursor, finished, _worker)
        if known is not None:
            lag.add(labels, known.messages)
            age.add(labels, known.age(now))
    return [buffers, lag, age]


def group_families(groups: list[GroupSnapshot], book: LagBook) -> list[Family]:
    members = Family(
        "hqueue_group_members", "Live members of a consumer group (a receive or a heartbeat within the member timeout)."
    )
    dead = Family("hqueue_group_dead_lettered_messages", "Messages a group moved to <queue>.dlq.")
    in_flight = Family("hqueue_group_in_flight_messages", "Messages leased to members.")
    retrying = Family("hqueue_group_retrying_messages", "Failed messages waiting to go out again (not to the DLQ).")
    lag = Family("hqueue_group_lag_messages", "Messages not yet acked (see lag.py for the bounds).")
    age = Family("hqueue_group_lag_seconds", "Age of the oldest message not yet acked.")
    leased, ready, behind, old = in_flight.lines.append, retrying.lines.append, lag.lines.append, age.lines.append
    now = wall_clock_ms()
    for snapshot in groups:
        group = snapshot.group
        queue, name = group.queue, group.name
        labels = f'group="{escape(name)}",queue="{escape(queue)}"'
        members.add(labels, snapshot.members)
        dead.add(labels, group.dead_lettered)
        # The hot loop of a scrape (tens of thousands of partitions, most of them idle):
        # a partition whose counts did not move since the last scrape reuses its lines,
        # and only the age of its oldest waiting message is written anew.
        for pid, state in snapshot.partitions:
            seed = state.lag_seed
            if seed is not None and not seed.tally.live:
                seed = None
            total, done, finished = seed.tally.total if seed else 0, state.done, state.finished
            if state.behind:  # lag runs from the oldest unfinished message the cursor moved past
                oldest, _, gone = snapshot.behind(state)
                done, finished = oldest or done, finished + gone  # (one gone is finished: GroupSnapshot.behind)
            leases, waiting = len(state.leases), len(state.ready) - len(state.unburied)
            lines = state.metric_lines  # compared field by field: no tuple made per partition
            if (
                lines is None
                or lines[0] is not seed
                or lines[1] != total
                or lines[2] != done
                or lines[3] != finished
                or lines[4] != leases
                or lines[5] != waiting
            ):
                key = (seed, total, done, finished, leases, waiting)
                lines = _partition_lines(snapshot, pid, state, key, book)
            leased_line, ready_line, lag_line, age_line, oldest = lines[6:]
            leased(leased_line)
            ready(ready_line)
            if lag_line is not None:
                behind(lag_line)
                if oldest:
                    waited = now - oldest
                    age_line = f"{age_line}{waited / 1000 if waited > 0 else 0.0}\n"
                old(age_line)
    return [members, dead, in_flight, retrying, lag, age]


#: What a scrape wrote of one group's partition: the counts it was written from (the
#: seed, the tally's total, done, finished, leases, ready), then the in-flight line, the
#: retrying line, the lag line (None while the partition has not been counted), and the
#: age line or, when the oldest message's time (ms) follows, its start.
PartitionLines = tuple[Any, int, bytes, int, int, int, str, str, str | None, str, int]


def _partition_lines(
    snapshot: GroupSnapshot, pid: int, state: PartitionState, key: tuple, book: LagBook
) -> PartitionLines:
    group = snapshot.group
    labels = f'{{group="{escape(group.name)}",partition="{pid}",queue="{escape(group.queue)}"}} '
    known = book.lag(state, group.queue, pid, group.config.topics, key[2], key[3], snapshot.progress)
    lines: PartitionLines = (
        *key,
        f"hqueue_group_in_flight_messages{labels}{key[4]}\n",
        f"hqueue_group_retrying_messages{labels}{key[5]}\n",
        None if known is None else f"hqueue_group_lag_messages{labels}{known.messages}\n",
        f"hqueue_group_lag_seconds{labels}" + ("" if known and known.oldest_ms else "0.0\n"),
        known.oldest_ms if known else 0,
    )
    if known is not None and known.settled:  # else counted again at the next scrape
        state.metric_lines = lines
    return lines


def _worker(worker: PartitionWorker) -> tuple[bytes, int, Ahead]:
    return (*worker.progress, none_ahead)
