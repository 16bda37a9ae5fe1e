"""The queue commands: create, list, describe, truncate, disable, enable, delete; status; cancel (timers)."""

from __future__ import annotations

from ..config import DEFAULT_MAX_MESSAGE_BYTES, Durability
from ..deadletters import dead_letter_queue
from ..errors import InvalidArgument
from ..keys.timers import timer_of
from .declare import NotAllDone, Output, Param, Session, command
from .render import printable, stamp, table

QUEUE = Param("queue", "The queue's name.")
LEGACY_DURABILITY = "hqueue.durability"
#: Said by the front ends (CLI, shell) when a timer is put on an embedded store.
LOCAL_TIMERS_NOTE = (
    "on a local:// store a timer fires only while a process has the store open; to have it fire on time, "
    "serve the store with `hqueue server` and put through hqueue:// (docs/timers.md)"
)


@command(
    "create",
    "Create a queue. TTL is in seconds (0 keeps messages forever).",
    QUEUE,
    Param("partitions", "Partitions, fixed for the queue's life.", "int", low=1, high=32767),
    Param("ttl", "Seconds messages stay visible; 0 keeps them forever.", "int", 0, low=0, high=2**31 - 1,
          positional=True),
    Param("durability", "When a put is acknowledged.", "choice", Durability.SYNC_WAL, choices=Durability.ALL),
    Param("max_message_bytes", "Largest topic + value accepted.", "int", DEFAULT_MAX_MESSAGE_BYTES, low=1,
          high=2**31 - 1),
    Param("topic_index", "Keep a per-topic index (reads of few topics cost their rows only).", "flag", False),
    Param("priorities", "Priority tiers; must divide the partitions (default 1).", "int", None, low=1,
          high=32767),
    Param("config", "Extra settings, KEY=VALUE (e.g. hbase.hqueue.partitionsPerRegion=4).", "settings", None,
          short="-c"),
    examples=(
        "create 'q1', 32, 86400",
        "create 'q1', 32, 86400, {DURABILITY => 'ASYNC_WAL', 'hbase.hqueue.partitionsPerRegion' => '4'}",
    ),
)  # fmt: skip
def create(session: Session, queue, partitions, ttl, durability, max_message_bytes, topic_index, priorities, config):
    config = dict(config or {})
    if LEGACY_DURABILITY in config:  # the key older shells took for the durability
        durability = Durability.validate(config.pop(LEGACY_DURABILITY))
    info = session.admin.create_queue(
        queue,
        partitions,
        ttl,
        config,
        durability=durability,
        max_message_bytes=max_message_bytes,
        topic_index=topic_index,
        priorities=priorities,
    )
    text = f"Created queue {info.name!r}: {info.partitions} partitions, ttl {info.ttl}s, {info.durability}"
    return Output(text, {"queue": info.name, "partitions": info.partitions, "ttl": info.ttl})


@command("list", "List the queues.", examples=("list",), read_only=True)
def list_(session: Session) -> Output:
    infos = session.admin.list_queues()
    rows = [(i.name, i.partitions, i.ttl, i.state, i.durability) for i in infos]
    text = table(["QUEUE", "PARTITIONS", "TTL", "STATE", "DURABILITY"], rows) if rows else ""
    data = [{"queue": i.name, "partitions": i.partitions, "ttl": i.ttl, "state": i.state,
             "durability": i.durability} for i in infos]  # fmt: skip
    return Output(text, data, len(rows))


@command(
    "describe",
    "Show a queue's settings and each partition's last message ID.",
    QUEUE,
    examples=("describe 'q1'",),
    aliases=("desc",),
    cli_format="json",
    read_only=True,
)
def describe(session: Session, queue: str) -> Output:
    d = session.admin.describe_queue(queue)
    count = d["message_count_estimate"]
    settings = [
        ("partitions", d["partitions"]),
        ("ttl", f"{d['ttl']}s"),
        ("state", d["state"]),
        ("durability", d["durability"]),
        ("max_message_bytes", d["max_message_bytes"]),
        ("messages (estimate)", "unknown" if count is None else count),
        *sorted(d["config"].items()),
    ]
    last = [(pid, str(i) if i else "-", stamp(i) if i else "") for pid, i in d["last_ids"].items()]
    text = table(["PROPERTY", "VALUE"], settings) + "\n\n" + table(["PARTITION", "LAST ID", "LAST WRITE (UTC)"], last)
    # "queue" as in list's rows and describe_group's (the API's dict calls it "name")
    return Output(text, {"queue": d["name"], **d}, len(last))


def _one_queue_command(name: str, method: str, done: str, help: str, aliases: tuple[str, ...]) -> None:
    """truncate_queue, disable_queue and enable_queue: one admin call each."""

    def run(session: Session, queue: str) -> Output:
        getattr(session.admin, method)(queue)
        return Output(f"{done} {queue!r}", {"queue": queue})

    command(name, help, QUEUE, examples=(f"{name} 'q1'",), aliases=aliases)(run)


_one_queue_command("truncate_queue", "truncate_queue", "Truncated",
                   "Delete every message; keep the queue and its partitions.", ("truncate",))  # fmt: skip
_one_queue_command("disable_queue", "disable_queue", "Disabled", "Refuse puts and scans until enable_queue.",
                   ("disable",))  # fmt: skip
_one_queue_command("enable_queue", "enable_queue", "Enabled", "Accept puts and scans again.", ("enable",))


@command(
    "delete_queue",
    "Delete a queue and its messages. It must be disabled first (or give force).",
    QUEUE,
    Param("force", "Disable the queue first if it is enabled.", "flag", False),
    examples=("disable_queue 'q1'", "delete_queue 'q1'", "delete_queue 'q1', {FORCE => true}"),
    aliases=("drop", "drop_queue"),
)
def delete_queue(session: Session, queue: str, force: bool) -> Output:
    session.admin.delete_queue(queue, force=force)
    dlq = dead_letter_queue(queue)
    if not session.admin.queue_exists(dlq):
        return Output(f"Deleted queue {queue!r}", {"queue": queue})
    text = f"Deleted queue {queue!r}; its dead letters stay in {dlq!r} (delete that queue too if they are not needed)"
    return Output(text, {"queue": queue, "dead_letter_queue": dlq})


@command(
    "status",
    "Where this is connected, who owns the partitions, and how far behind each subscriber is.",
    examples=("status",),
    group="general",
    read_only=True,
)
def status(session: Session) -> Output:
    admin = session.admin
    infos = admin.list_queues()
    lines = [f"store: {admin.url}", f"{len(infos)} queue(s), {sum(i.partitions for i in infos)} partition(s)"]
    owners: dict[str, int] = {}
    for info in infos:
        for owner in admin.engine.partition_locations(info.name):
            owners[owner or "(this process)"] = owners.get(owner or "(this process)", 0) + 1
    if owners:
        lines.append(table(["SERVER", "PARTITIONS OWNED"], sorted(owners.items())))
    lag = []
    for info in infos:
        for name in admin.list_subscribers(info.name):
            d = admin.describe_subscriber(info.name, name)
            behind = max(d["lag_millis"].values(), default=0) / 1000
            lag.append((name, info.name, d["address"] or "(away)", sum(d["lag_messages"].values()), f"{behind:.1f}"))
    if lag:
        lines.append(table(["SUBSCRIBER", "QUEUE", "ADDRESS", "LAG (MESSAGES)", "LAG (S, OLDEST)"], lag))
    data = {
        "store": admin.url,
        "queues": len(infos),
        "partitions_owned": owners,
        "subscribers": [
            dict(zip(("subscriber", "queue", "address", "lag_messages"), row[:4], strict=True)) for row in lag
        ],
    }
    return Output("\n".join(lines), data)  # fmt: skip


@command(
    "cancel",
    "Cancel pending timer messages (the handles a put with a delay printed).",
    QUEUE,
    Param("timers", "Timer handles.", many=True),
    examples=("cancel 'q1', '0/1795316153036/1795316150000:0'",),
    group="timers",
)
def cancel(session: Session, queue: str, timers: list[str]) -> Output:
    queue_handle = session.queue(queue)
    for handle in timers:  # every handle read before any is cancelled: one refused cancels none
        if not isinstance(handle, str):
            raise InvalidArgument(f"a timer handle is a string, got {printable(handle)!r}")
        timer_of(queue, handle)
    done = [(handle, queue_handle.cancel(handle)) for handle in timers]
    rows = [(h, "cancelled" if ok else "not pending (fired or cancelled already)") for h, ok in done]
    output = Output(
        "\n".join("\t".join(row) for row in rows), [{"timer": h, "cancelled": ok} for h, ok in done], len(rows)
    )
    missed = sum(1 for _, ok in done if not ok)
    if missed:
        raise NotAllDone(f"{missed} of {len(done)} timer(s) not pending: fired or cancelled already", output)
    return output
