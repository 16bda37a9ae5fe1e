"""What a server's metrics read at each scrape: from memory only, never a row.

Lag comes from the :class:`~hqueue.lag.LagBook` (counts kept as messages are
written, acked and delivered); a reader not yet counted once has no lag
series until the book's thread has counted it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..coordination import Coordinator
from ..engine import Engine
from ..groups.service import GroupService
from ..groups.views import GroupSnapshot
from ..ids import wall_clock_ms
from ..lag import LagBook
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


def server_gauges(server: Served, book: LagBook) -> Callable[[], list[Family]]:
    """The collect function of ``server``'s scrape-time series."""

    def collect() -> list[Family]:
        families = [
            gauge("hqueue_connections", "Open client connections.", [], [([], server.connections)]),
            gauge("hqueue_scanners", "Open server-side scanners.", [], [([], len(server.scanners))]),
            gauge(
                "hqueue_inflight_request_bytes", "Bytes of request frames under way.", [], [([], server.inflight_bytes)]
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
        known = book.lag(w, w.queue, w.partition_id, w.registration.effective_topics, cursor, finished, _worker, now)
        if known is not None:
            lag.add(labels, known[0])
            age.add(labels, known[1])
    return [buffers, lag, age]


def group_families(groups: list[GroupSnapshot], book: LagBook) -> list[Family]:
    members = Family("hqueue_group_members", "Live members of a consumer group.")
    dead = Family("hqueue_group_dead_lettered_messages", "Messages a group moved to <queue>.dlq.")
    in_flight = Family("hqueue_group_in_flight_messages", "Messages leased to members.")
    retrying = Family("hqueue_group_retrying_messages", "Failed messages waiting to go out again.")
    lag = Family("hqueue_group_lag_messages", "Messages not yet acked (see lag.py for the bounds).")
    age = Family("hqueue_group_lag_seconds", "Age of the oldest message not yet acked.")
    leased, ready, behind, old = in_flight.lines.append, retrying.lines.append, lag.lines.append, age.lines.append
    now = wall_clock_ms()
    for snapshot in groups:
        group = snapshot.group
        queue, name, topics = group.queue, group.name, group.config.topics
        head, tail = f'group="{escape(name)}"', f'queue="{escape(queue)}"'
        members.add(f"{head},{tail}", snapshot.members)
        dead.add(f"{head},{tail}", group.dead_lettered)
        head, tail = "{" + head + ',partition="', '",' + tail
        progress = snapshot.progress
        # The hot loop of a scrape (tens of thousands of partitions): lines appended here,
        # not through Family.add.
        for pid, state in snapshot.partitions:
            labels = f"{head}{pid}{tail}}} "
            leased(f"hqueue_group_in_flight_messages{labels}{len(state.leases)}\n")
            ready(f"hqueue_group_retrying_messages{labels}{len(state.ready)}\n")
            known = book.lag(state, queue, pid, topics, state.done, state.finished, progress, now)
            if known is not None:
                behind(f"hqueue_group_lag_messages{labels}{known[0]}\n")
                old(f"hqueue_group_lag_seconds{labels}{known[1]}\n")
    return [members, dead, in_flight, retrying, lag, age]


def _worker(worker: PartitionWorker) -> tuple[bytes, int, int]:
    return (*worker.progress, 0)
