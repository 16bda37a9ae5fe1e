"""The console's pages and their JSON (the charts' data): views over the calls the CLI makes.

Every page reads through the console's :class:`~hqueue.HQueueAdmin` and the
queue handles it makes, with the same methods ``hqueue list``, ``describe``,
``list-groups``, ``describe-group``, ``pending``, ``scan`` and the rest
call: the console counts no lag and lists nothing of its own. Each list is
paged (forms.PAGE rows) and searched by name, so a store of 10,000 queues
and 1,000 groups costs a page what a page shows.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Flask, abort, g, jsonify, render_template, request

from ..config import QueueInfo
from ..deadletters import dead_letter_queue
from ..keys.timers import Timer
from ..message import MAX_SEQUENCE, MessageID
from ..printed import as_text
from .forms import PAGE, field, moment, number, topic_field
from .reads import read_page
from .series import TOTALS

#: Queues whose owners the overview counts (the rest are left out, and it says so).
OVERVIEW_QUEUES = 500
#: Queues one page of groups walks through at most, and timers' queues a page.
GROUP_WALK = 200
TIMER_PAGE = 20
#: Pending timers counted per partition (more shows as "N+"): each is read, value and all.
TIMER_COUNT = 100
#: Dead letters the page shows (each read whole).
DLQ_SHOWN = 20
#: Bytes of a value a page shows.
VALUE_SHOWN = 4096


def register(app: Flask) -> None:
    for rule, view in (
        ("/", overview),
        ("/queues", queues),
        ("/queues/<queue>", queue_page),
        ("/groups", groups),
        ("/queues/<queue>/groups/<group>", group_page),
        ("/queues/<queue>/subscribers/<name>", subscriber_page),
        ("/queues/<queue>/dlq", dlq_page),
        ("/messages", messages),
        ("/timers", timers),
        ("/audit", audit),
        ("/api/overview", overview_data),
        ("/api/queues/<queue>", queue_data),
        ("/api/queues/<queue>/groups/<group>", group_data),
    ):
        app.add_url_rule(rule, view.__name__, view)


def page(template: str, **values: Any) -> str:
    """A page, or only its live part when the page's refresh asks (``X-Live: 1``)."""
    return render_template(template, live_only=request.headers.get("X-Live") == "1", **values)


def visible(infos: list[QueueInfo]) -> list[QueueInfo]:
    return [i for i in infos if g.login.may_see(i.name)]


def seen(queue: str) -> str:
    """``queue`` if the login may see it; 403 otherwise (before anything is read)."""
    if not g.login.may_see(queue):
        abort(403, f"token {g.login.who!r} may not see queue {queue!r}")
    return queue


def readable(queue: str) -> str:
    """``queue`` if the login may read its messages, groups and subscribers (the consumer
    role, as over the Thrift port); 403 otherwise (before anything is read)."""
    seen(queue)
    if not g.login.may_read(queue):
        abort(403, f"token {g.login.who!r} may not read queue {queue!r} (needs role 'consumer')")
    return queue


def paged(items: list, size: int = PAGE) -> tuple[list, int, int]:
    """(this page's items, page number, pages) of ``items`` by ``?page=``."""
    pages = max(1, -(-len(items) // size))
    number_ = number("page", 1, 1, pages)
    return items[(number_ - 1) * size : number_ * size], number_, pages


def search(infos: list[QueueInfo]) -> tuple[list[QueueInfo], str]:
    text = field("q", "").strip()
    return ([i for i in infos if text.lower() in i.name.lower()] if text else infos), text


# -- the pages -----------------------------------------------------------------------


def overview() -> str:
    infos = visible(g.console.admin.list_queues())
    owners: dict[str, int] = {}
    for info in infos[:OVERVIEW_QUEUES]:
        for owner in g.console.locations(info.name, info.partitions):
            owners[owner or "(this process)"] = owners.get(owner or "(this process)", 0) + 1
    latest = {name: g.console.sampler.latest(name) for name in TOTALS}
    return page("overview.html", queues=len(infos), partitions=sum(i.partitions for i in infos),
                owners=sorted(owners.items()), cut=len(infos) > OVERVIEW_QUEUES, latest=latest,
                limit=OVERVIEW_QUEUES)  # fmt: skip


def queues() -> str:
    found, text = search(visible(g.console.admin.list_queues()))
    shown, number_, pages = paged(found)
    rows = [(info, g.console.admin.describe_queue(info.name)) for info in shown]
    return page("queues.html", rows=rows, q=text, page=number_, pages=pages, total=len(found))


def queue_page(queue: str) -> str:
    d = g.console.admin.describe_queue(seen(queue))
    owners = g.console.locations(queue, d["partitions"])
    partitions = [(pid, last, owners[pid] if pid < len(owners) else "") for pid, last in sorted(d["last_ids"].items())]
    shown, number_, pages = paged(partitions, 256)
    last_write = max((last for _, last, _ in partitions if last), default=None)
    return page("queue.html", queue=queue, d=d, partitions=shown, page=number_, pages=pages, last_write=last_write)


def groups() -> str:
    """Groups and subscribers, a page at a time: ``?after=QUEUE/N`` resumes at the N-th of that
    queue's names. ``?q=`` matches ``queue/name``; with a ``/`` in it, the part before filters the
    queues first (``orders/`` is every group of the queues named like orders)."""
    admin, text = g.console.admin, field("q", "").strip().lower()
    queue_part, slash, name_part = text.partition("/")
    after_queue, _, skip_text = field("after", "").rpartition("/")
    skip = int(skip_text) if skip_text.isascii() and skip_text.isdigit() else 0  # ('²' is a digit to isdigit)
    infos = [i for i in admin.list_queues() if i.name >= after_queue and g.login.may_read(i.name)]
    if slash and queue_part:
        infos = [i for i in infos if queue_part in i.name.lower()]
    found: list[tuple[str, str, str]] = []  # (kind, queue, name)
    next_after = None
    for walked, info in enumerate(infos):
        if walked >= GROUP_WALK:
            next_after = f"{info.name}/0"
            break
        names = sorted([(n, "group") for n in admin.list_groups(info.name)]
                       + [(n, "subscriber") for n in admin.list_subscribers(info.name)])  # fmt: skip
        first = skip if info.name == after_queue else 0
        for index in range(first, len(names)):
            name, kind = names[index]
            wanted = name_part in name.lower() if slash else text in f"{info.name}/{name}".lower()
            if wanted:
                found.append((kind, info.name, name))
            if len(found) >= PAGE:
                next_after = f"{info.name}/{index + 1}"
                break
        if next_after is not None:
            break
    rows = [_group_row(queue, name, g.console.describe_group(queue, name)) if kind == "group"
            else _subscriber_row(queue, name, admin.describe_subscriber(queue, name))
            for kind, queue, name in found]  # fmt: skip
    return page("groups.html", rows=rows, q=text, next_after=next_after)


def _group_row(queue: str, name: str, d: dict[str, Any]) -> dict[str, Any]:
    parts = d["partitions"].values()
    return {"kind": "group", "queue": queue, "name": name, "members": len(d["members"]),
            "in_flight": sum(p["in_flight"] for p in parts), "retrying": sum(p["retrying"] for p in parts),
            "lag_messages": sum(p["lag_messages"] for p in parts),
            "lag_millis": max((p["lag_millis"] for p in parts), default=0),
            "dead_letters": d["dead_letters"]}  # fmt: skip


def _subscriber_row(queue: str, name: str, d: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "subscriber", "queue": queue, "name": name, "members": 1 if d["address"] else 0,
            "in_flight": None, "retrying": None, "lag_messages": sum(d["lag_messages"].values()),
            "lag_millis": max(d["lag_millis"].values(), default=0), "dead_letters": None}  # fmt: skip


def group_page(queue: str, group: str) -> str:
    admin = g.console.admin
    d = g.console.describe_group(readable(queue), group)
    with admin.queue(queue) as handle:
        pending = handle.pending(group, limit=number("limit", 200, 1, 10_000))
    return page("group.html", queue=queue, group=group, d=d, pending=pending, dlq=dead_letter_queue(queue),
                may_admin=g.login.may_admin(queue))  # fmt: skip


def subscriber_page(queue: str, name: str) -> str:
    d = g.console.admin.describe_subscriber(readable(queue), name)
    return page("subscriber.html", queue=queue, name=name, d=d)


def dlq_page(queue: str) -> str:
    """The dead letters (the dry run of a replay: what it would put back, and where)."""
    admin = g.console.admin
    start, stop = moment("start", ""), moment("stop", "")
    dlq = readable(dead_letter_queue(readable(queue)))  # (its own queue: read as over the Thrift port)
    admin.engine.queue_info(queue)  # (404 for a queue that is not there: its page was an empty 200)
    letters, size = [], 0
    if admin.queue_exists(dlq):
        letters = admin.dead_letters(queue, start, stop, limit=DLQ_SHOWN)
        size = admin.describe_queue(dlq)["message_count_estimate"]
    return page("dlq.html", queue=queue, dlq=dlq,
                letters=[(m, origin, note, shown(m.value)) for m, origin, note in letters],
                size=size, start=field("start", ""), stop=field("stop", ""), may_admin=g.login.may_admin(queue),
                replaying=queue in g.console.replays)  # fmt: skip


def messages() -> str:
    """One partition's messages in a time range, by topic, a page at a time (``?after=`` the last ID)."""
    queue = field("queue", "")
    values = {"queue": queue, "partition": field("partition", "0"), "topic": field("topic", ""),
              "start": field("start", ""), "stop": field("stop", ""), "format": field("format", "text")}  # fmt: skip
    if values["format"] not in ("text", "hex"):
        abort(400, "'format' must be text or hex")
    if not queue:
        return page("messages.html", v=values, rows=None, next_after=None)
    partition = number("partition", 0, 0, 32766)
    after = moment("after", "")
    start = _following(after) if after else moment("start", "")
    with g.console.admin.queue(readable(queue)) as handle:
        topics = [topic_field(values["topic"])] if values["topic"] else None
        found, more = read_page(handle, partition, start, moment("stop", ""), topics, PAGE)
    rows = [(m, shown(m.value, values["format"])) for m in found]
    next_after = str(found[-1].id) if more and found else None
    return page("messages.html", v=values, rows=rows, next_after=next_after)


def _following(last: MessageID) -> MessageID:
    """The first ID after ``last``."""
    if last.sequence == MAX_SEQUENCE:
        return MessageID(last.timestamp + 1)
    return MessageID(last.timestamp, last.sequence + 1)


def shown(value: bytes, form: str = "text") -> str:
    r"""A value as a page shows it: text (escaped by the template; lines as they are, a byte
    that is not UTF-8 as ``\xNN``, a backslash doubled, as the CLI prints it) or hex, cut at
    VALUE_SHOWN bytes. (A byte that was not UTF-8 showed as U+FFFD: lost.)"""
    cut = value[:VALUE_SHOWN]
    text = cut.hex(" ") if form == "hex" else as_text(cut)
    return text + (f" … ({len(value)} bytes)" if len(value) > VALUE_SHOWN else "")


def timers() -> str:
    found, text = search([i for i in visible(g.console.admin.list_queues()) if not i.name.endswith(".dlq")])
    shown_, number_, pages = paged(found, TIMER_PAGE)
    rows = []
    for info in shown_:
        with g.console.admin.queue(info.name) as handle:
            count, capped = handle.count_timers(limit=TIMER_COUNT)
            rows.append((info.name, f"{count}+" if capped else count, handle.next_due()))
    handle_text, queue = field("handle", "").strip(), field("queue", "").strip()
    hit = _find_timer(queue, handle_text) if handle_text and queue else None
    return page("timers.html", rows=rows, q=text, page=number_, pages=pages, queue=queue, handle=handle_text, hit=hit,
                now=int(time.time() * 1000))  # fmt: skip


def _find_timer(queue: str, handle: str) -> dict[str, Any]:
    timer = Timer.parse(handle)
    with g.console.admin.queue(seen(queue)) as q:
        message = q.find_timer(timer)
    may_read = g.login.may_read(queue)  # a producer learns whether it is pending, not what it holds
    return {"timer": timer, "message": message, "value": shown(message.value) if message and may_read else None,
            "may_read": may_read, "may_cancel": g.login.may_cancel_timers(queue)}  # fmt: skip


def audit() -> str:
    """The newest admin actions on the queues the login may see."""
    entries = g.console.audit.recent(lambda e: g.login.may_see(str(e.get("queue", ""))))
    return page("audit.html", entries=entries)


# -- the charts' data ----------------------------------------------------------------


def overview_data() -> Any:
    return jsonify(g.console.sampler.chart(g.console.sampler.totals))


def queue_data(queue: str) -> Any:
    g.console.admin.engine.queue_info(seen(queue))  # an unknown queue: 404, as its page
    return jsonify(g.console.sampler.queue_chart(queue))


def group_data(queue: str, group: str) -> Any:
    """The group's lag chart; reading it notes a new point (the page's refresh keeps it going)."""
    d = g.console.describe_group(readable(queue), group)
    chart = g.console.sampler.group_chart(queue, group)
    totals = {"lag_messages": sum(p["lag_messages"] for p in d["partitions"].values())}
    return jsonify(chart=chart, now=totals)
