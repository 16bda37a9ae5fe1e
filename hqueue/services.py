"""What a process that serves partitions attaches to its engine.

The engine core (engine.py) validates, assigns IDs, writes and reads. The
services are built on it and attached to it, as kazoo binds its recipes to
its client: the timer loop (timers.py) and the consumer groups
(groups/service.py) for the partitions a coordinator says this process
owns, and push subscriptions (subscriptions/) as ``engine.subscriptions``.

Two kinds of process serve partitions: ``hqueue server`` (server/app.py,
with ZooKeeper or alone), and any process that opens a store itself
(embedded, memory, or hbase:// directly), which owns every partition of it
(:func:`open_local`).
"""

from __future__ import annotations

import threading
import weakref

from .coordination import Coordinator
from .coordination.local import LocalCoordinator
from .deadletters import forget_notes
from .engine import Engine
from .groups.limits import GroupLimits
from .groups.service import GroupService
from .subscriptions.local import local_subscriptions
from .timers import TimerService

_served: weakref.WeakKeyDictionary[Engine, tuple[TimerService, GroupService]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_opening = threading.Lock()


def serve_partitions(engine: Engine, coordinator: Coordinator, limits: GroupLimits | None = None) -> GroupService:
    """Fire the timers and keep the consumer groups of the partitions ``coordinator``
    says this process owns (replacing what served them before), with ``limits``
    on what one group member may take; writes follow ``coordinator`` too."""
    engine.writers.follow(coordinator)
    timers = TimerService(engine, coordinator, lambda: [(q.name, q.partitions) for q in engine.list_queues()])
    groups = GroupService(engine, coordinator, limits=limits)
    with _lock:
        old = _served.get(engine)
        _served[engine] = timers, groups
        engine.groups = groups
    for service in old or ():
        service.stop()
    if old is None:
        engine.on_close(lambda: _stop(engine))
        # a dead-letter queue's notes go with its messages
        engine.events.on_truncate(lambda queue: forget_notes(engine, queue))
        engine.events.on_drop(lambda queue: forget_notes(engine, queue))
    timers.start()
    groups.start()
    return groups


def _stop(engine: Engine) -> None:
    with _lock:
        services = _served.pop(engine, ())
    for service in services:
        service.stop()


def stop_serving(engine: Engine) -> None:
    """A server stops serving ``engine``'s partitions: stop and detach its timers, groups
    and subscriptions. If something else in the process still holds the engine (an
    ``HQueue`` on the same store), the process serves the store itself again, as
    :func:`open_local` would have."""
    with _opening:
        _stop(engine)
        engine.groups = None
        engine.subscriptions = None
        if engine._refs > 1:  # the server's reference is released after this
            serve_partitions(engine, LocalCoordinator("in-process"))
            engine.subscriptions = local_subscriptions(engine)


def open_local(url: str, group_limits: GroupLimits | None = None) -> Engine:
    """The process's engine for a store it opens itself (``local://``, ``memory://``,
    or ``hbase://`` opened directly), serving every partition in this process,
    unless something (a server) already serves them. Release it with
    ``engine.release()``.

    ``group_limits``: what one consumer-group member may take; the process
    serves the store once, so they apply to every handle on it (given again,
    the latest apply).
    """
    engine = Engine.acquire(url)
    with _opening:  # two threads opening one store at once attach one set of services
        if engine not in _served:
            serve_partitions(engine, LocalCoordinator("in-process"), group_limits)
        elif group_limits is not None:
            _served[engine][1].limits = group_limits
        if engine.subscriptions is None:
            engine.subscriptions = local_subscriptions(engine)
    return engine
