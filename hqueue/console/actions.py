"""The console's actions: reset a group's position, replay dead letters, cancel a timer.

Each is a POST carrying the session's CSRF token (app.py refuses any other),
checked against the login's roles before anything is read (a position reset
and a replay need ``admin`` on the queue; a timer cancel ``admin`` or
``producer``), and done in two steps: the first shows what will happen (the
messages a reset redelivers or skips, the dead letters a replay puts back),
and only a second POST with ``confirm=yes`` does it. Every action done, and
every one that failed, goes to the audit log (audit.py) with who, what, when
and the outcome.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from flask import Flask, abort, g, redirect, render_template, url_for

from ..deadletters import dead_letter_queue
from ..errors import HQueueError
from ..keys.timers import Timer
from ..message import MessageID, successor
from . import reads
from .forms import field, moment, number, require
from .reads import first_ids

logger = logging.getLogger(__name__)

#: Messages a preview counts per partition (more shows as "1000+"), partitions it looks at, IDs it lists.
PREVIEW_COUNT = 1000
PREVIEW_PARTITIONS = 64
PREVIEW_IDS = 20
#: Dead letters a dry run counts at most, and shows (each read whole: a few, whatever their size).
DRY_RUN_COUNT = 10_000
DRY_RUN_SHOWN = 20
#: The fastest replay the console asks for (messages a second).
MAX_RATE = 100_000
#: Seconds a replay's dry run may be confirmed within, and the most kept unconfirmed.
DRY_RUN_SECONDS = 15 * 60
DRY_RUNS_KEPT = 1000


class DryRun(NamedTuple):
    """A replay's dry run, to be confirmed once, by the session that ran it."""

    session: str  # its CSRF token: one per session
    queue: str
    start: MessageID | None
    stop: MessageID | None  # pinned: past the newest dead letter the dry run saw, if no stop was given
    rate: int
    counted: str  # how many it counted
    made: float


class DryRuns:
    """Replays' dry runs by one-time handle: a confirmation replays what its dry run showed, once.
    (The form's fields were replayed as sent: a stop left empty read on to the live end, and a
    confirmation sent twice replayed twice, once the first replay was through: a helper's pass.)"""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, DryRun] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, run: DryRun) -> str:
        handle = secrets.token_urlsafe(16)
        with self._lock:
            self._runs[handle] = run
            while len(self._runs) > DRY_RUNS_KEPT:
                self._runs.popitem(last=False)
        return handle

    def take(self, handle: str, session: str, queue: str) -> DryRun | None:
        """The dry run ``handle`` names, if ``session`` ran it for ``queue`` within
        DRY_RUN_SECONDS and it was not confirmed yet; forgotten once taken."""
        with self._lock:
            run = self._runs.get(handle)
            if run is None or run.session != session or run.queue != queue:
                return None
            del self._runs[handle]
        return run if time.monotonic() - run.made <= DRY_RUN_SECONDS else None


def register(app: Flask) -> None:
    app.add_url_rule("/queues/<queue>/groups/<group>/reset", "reset", reset, methods=["POST"])
    app.add_url_rule("/queues/<queue>/dlq/replay", "replay", replay, methods=["POST"])
    app.add_url_rule("/timers/cancel", "cancel_timer", cancel_timer, methods=["POST"])


def confirmed() -> bool:
    answer = field("confirm", "")
    if answer not in ("", "yes"):
        abort(400, "'confirm' must be yes (or left out for a preview)")
    return answer == "yes"


def audited(what: str, queue: str, target: str, details: dict[str, Any], act: Any) -> Any:
    """Record that the action starts (an action the log cannot hold is not done: the user
    sees why), run ``act()``, and record how it went. (Recorded after only, an action done
    whose entry failed was reported failed, and was in no log: a helper's pass.)"""
    console, who = g.console, g.login.who
    console.audit.record(who, what, queue, target, details, "started")
    try:
        result = act()
    except HQueueError as e:
        _outcome(console, who, what, queue, target, details, f"failed: {e}")
        raise
    _outcome(console, who, what, queue, target, details, f"done: {result}")
    return result


def _outcome(console: Any, who: str, what: str, queue: str, target: str, details: dict, outcome: str) -> None:
    """Record how an action ended; a failure to is logged (the action's start is in the log)."""
    try:
        console.audit.record(who, what, queue, target, details, outcome)
    except Exception:
        logger.error("console: the audit log missed how %s of %s ended: %s", what, queue, outcome, exc_info=True)


# -- a group's position --------------------------------------------------------------


def reset(queue: str, group: str) -> Any:
    require(lambda login: login.may_admin(queue), f"move consumer group {group!r} of queue {queue!r} (needs admin)")
    position = moment("time")
    if position is None:
        abort(400, "'time' is required: where the group starts again (a time, an ID or epoch ms)")
    which = field("partition", "all").strip()
    partition = None if which in ("", "all") else number("partition", 0, 0, 32766)
    admin = g.console.admin
    described = admin.describe_group(queue, group)["partitions"]
    if partition is not None and partition not in described:
        abort(400, f"'partition' {partition} is not a partition of {queue!r} served here")
    if not confirmed():
        rows = _preview(queue, described, partition, position)
        return render_template("reset.html", queue=queue, group=group, time=field("time"), which=which,
                               position=position, rows=rows,
                               left_out=0 if partition is not None else len(described) - len(rows))  # fmt: skip
    details = {"time": str(position), "partition": which or "all"}
    audited("reset group position", queue, group, details,
            lambda: admin.set_group_position(queue, group, partition, position) or "moved")  # fmt: skip
    return redirect(url_for("group_page", queue=queue, group=group))


def _preview(queue: str, described: dict[int, Any], partition: int | None, position: MessageID) -> list[dict]:
    """Per partition: where the group is, and the messages between there and ``position``
    (redelivered when it goes back, skipped when it goes ahead), counted up to PREVIEW_COUNT."""
    rows = []
    pids = [partition] if partition is not None else sorted(described)[:PREVIEW_PARTITIONS]
    with g.console.admin.queue(queue) as handle:
        for pid in pids:
            done = described[pid]["done"]
            back = position < done
            low, high = (position, done) if back else (done, position)
            counted, ids = first_ids(handle, pid, low, high, PREVIEW_COUNT, PREVIEW_IDS)
            count = f"{PREVIEW_COUNT}+" if counted > PREVIEW_COUNT else str(counted)
            rows.append({"partition": pid, "done": done, "effect": "redelivers" if back else "skips",
                         "count": count, "ids": ids})  # fmt: skip
    return rows


# -- dead letters --------------------------------------------------------------------


def replay(queue: str) -> Any:
    dlq = dead_letter_queue(queue)
    require(
        lambda login: login.may_admin(queue) and login.may_read(dlq),
        f"replay the dead letters of queue {queue!r} (needs admin, and consumer on {dlq})",
    )
    admin, console = g.console.admin, g.console
    admin.describe_queue(queue)  # (404 for a queue that is not there)
    if confirmed():
        return _confirmed_replay(queue, dlq)
    start, stop = moment("start", ""), moment("stop", "")
    rate = number("rate", 1000, 1, MAX_RATE)
    # The dry run: what would be put back, and where (none without a .dlq, as the CLI says).
    # Without a stop, the replay ends past the newest dead letter seen now (none: it replays none).
    count, shown, newest = 0, [], None
    if admin.queue_exists(dlq):
        if stop is None:
            newest = max(filter(None, admin.describe_queue(dlq)["last_ids"].values()), default=None)
        with admin.queue(dlq) as letters:
            for pid in range(letters.partitions):
                if count <= DRY_RUN_COUNT:
                    count += reads.count(letters, pid, start, stop, DRY_RUN_COUNT - count)
        shown = admin.dead_letters(queue, start, stop, limit=DRY_RUN_SHOWN)
    if stop is None:
        stop = successor(newest) if newest is not None else MessageID(0)
    counted = f"{DRY_RUN_COUNT}+" if count > DRY_RUN_COUNT else str(count)
    handle = console.dry_runs.add(DryRun(g.login.csrf, queue, start, stop, rate, counted, time.monotonic()))
    return render_template("replay.html", queue=queue, dlq=dlq, rate=rate, start=field("start", ""),
                           stop=field("stop", ""), letters=shown, count=counted, dry_run=handle)  # fmt: skip


def _confirmed_replay(queue: str, dlq: str) -> Any:
    """The replay its dry run showed (``dry_run`` names it), once, in a thread of its own."""
    console, who = g.console, g.login.who
    if queue in console.replays:  # (before the dry run is taken: it may be confirmed once this one is through)
        abort(409, f"a replay of {dlq} is under way: wait for it (see the audit log)")
    run = console.dry_runs.take(field("dry_run", ""), g.login.csrf, queue)
    if run is None:
        abort(409, "this replay's dry run was confirmed already, or is more than 15 minutes old, "
                   "or is not this session's: run the dry run again")  # fmt: skip
    details = {"start": str(run.start or ""), "stop": str(run.stop), "rate": run.rate, "dry run": run.counted}
    with console.replays_lock:
        if queue in console.replays:
            abort(409, f"a replay of {dlq} is under way: wait for it (see the audit log)")
        console.audit.record(who, "replay dead letters", queue, dlq, details, "started")
        thread = threading.Thread(target=_replay, args=(console, who, queue, run.start, run.stop, run.rate, details),
                                  name=f"hqueue-console-replay-{queue}", daemon=True)  # fmt: skip
        console.replays[queue] = thread
    thread.start()
    return redirect(url_for("dlq_page", queue=queue))


def _replay(console: Any, who: str, queue: str, start: Any, stop: Any, rate: int, details: dict) -> None:
    """A replay in its own thread (at ``rate`` it may take long: no request waits for it)."""
    try:
        count = console.admin.replay_dead_letters(queue, start, stop, rate=rate)
        outcome = f"done: {count} replayed"
    except Exception as e:  # recorded, never lost in a thread
        logger.warning("console: replaying %s's dead letters failed", queue, exc_info=True)
        outcome = f"failed: {e}"
    finally:
        with console.replays_lock:
            console.replays.pop(queue, None)
    _outcome(console, who, "replay dead letters", queue, dead_letter_queue(queue), details, outcome)


# -- timers --------------------------------------------------------------------------


def cancel_timer() -> Any:
    queue, handle = field("queue").strip(), field("handle").strip()
    require(lambda login: login.may_cancel_timers(queue), f"cancel timers of queue {queue!r} (needs admin or producer)")
    timer = Timer.parse(handle)
    with g.console.admin.queue(queue) as q:  # (an unknown queue: 404, before a confirmation is offered)
        if timer.partition_id >= q.partitions:
            abort(400, f"timer {handle} is of partition {timer.partition_id}: queue {queue!r} has {q.partitions}")
        if not confirmed():
            return render_template("cancel.html", queue=queue, handle=handle)
        # A timer not pending is no action: not in the log (anyone who may cancel flooded it with those).
        if q.find_timer(timer) is None:
            return redirect(url_for("timers", queue=queue, handle=handle, cancelled="not pending"))
        done = audited("cancel timer", queue, handle, {}, lambda: "cancelled" if q.cancel(timer) else "not pending")
    return redirect(url_for("timers", queue=queue, handle=handle, cancelled=done))
