"""The commands on who reads a queue: push subscribers, consumer groups, dead letters."""

from __future__ import annotations

from ..deadletters import dead_letter_queue
from .declare import Output, Param, Session, command
from .queues import QUEUE
from .render import printable, seconds, stamp, table

SUBSCRIBER = Param("subscriber", "The subscriber's name.")
GROUP = Param("group", "The consumer group's name.")
TIME = Param("time", "A time ('2026-11-22 10:00', UTC unless it says otherwise), an ID or epoch ms.", "time")
PARTITION = Param("partition", "Only this partition (default: every one).", "int", None, low=0, high=32766,
                  short="-p")  # fmt: skip


def _topics(topics) -> str:
    return ", ".join(printable(t) for t in sorted(topics)) if topics else "all"


def _or_unknown(count: int | None) -> str:
    return "unknown (the queue cannot be read: disabled?)" if count is None else str(count)


# -- push subscribers (SPEC C7) ------------------------------------------------------------------


@command(
    "add_subscriber",
    "Register a subscriber now: nothing written after this is missed, even before it starts.",
    QUEUE,
    SUBSCRIBER,
    Param("topics", "Only this topic; repeatable (default: all).", "texts", None, short="-t"),
    examples=("add_subscriber 'q1', 'indexer'", "add_subscriber 'q1', 'indexer', {TOPICS => ['crawler']}"),
    group="subscribers",
)
def add_subscriber(session: Session, queue: str, subscriber: str, topics) -> Output:
    session.admin.add_subscriber(queue, subscriber, topics)
    return Output(f"Added subscriber {subscriber!r} to {queue!r}", {"queue": queue, "subscriber": subscriber})


@command(
    "delete_subscriber",
    "Forget a subscriber and its checkpoints.",
    QUEUE,
    SUBSCRIBER,
    examples=("delete_subscriber 'q1', 'indexer'",),
    group="subscribers",
)
def delete_subscriber(session: Session, queue: str, subscriber: str) -> Output:
    session.admin.delete_subscriber(queue, subscriber)
    return Output(f"Deleted subscriber {subscriber!r} from {queue!r}", {"queue": queue, "subscriber": subscriber})


@command("list_subscribers", "List a queue's subscribers: address, topics, and how far behind each is.", QUEUE,
         examples=("list_subscribers 'q1'",), group="subscribers", read_only=True)  # fmt: skip
def list_subscribers(session: Session, queue: str) -> Output:
    rows, data = [], []
    for name in session.admin.list_subscribers(queue):
        d = session.admin.describe_subscriber(queue, name)
        lag, lag_ms = sum(d["lag_messages"].values()), max(d["lag_millis"].values(), default=0)
        rows.append((name, d["address"] or "(away)", _topics(d["topics"]), lag, seconds(lag_ms / 1000)))
        data.append({"subscriber": name, "address": d["address"], "topics": d["topics"], "lag_messages": lag,
                     "lag_millis": lag_ms})  # fmt: skip
    columns = ["SUBSCRIBER", "ADDRESS", "TOPICS", "LAG (MESSAGES)", "LAG (S, OLDEST)"]
    return Output(table(columns, rows) if rows else "", data, len(rows))


@command(
    "describe_subscriber",
    "Show a subscriber's address, topics, and per partition its checkpoint and lag.",
    QUEUE,
    SUBSCRIBER,
    examples=("describe_subscriber 'q1', 'indexer'",),
    group="subscribers",
    cli_format="json",
    read_only=True,
)
def describe_subscriber(session: Session, queue: str, subscriber: str) -> Output:
    d = session.admin.describe_subscriber(queue, subscriber)
    head = f"address: {d['address'] or '(away)'}\ntopics: {_topics(d['topics'])}\n\n"
    rows = [
        (pid, str(checkpoint), d["lag_messages"].get(pid, 0), d["lag_millis"].get(pid, 0))
        for pid, checkpoint in sorted(d["checkpoints"].items())
    ]
    return Output(head + table(["PARTITION", "CHECKPOINT", "LAG (MESSAGES)", "LAG (MS)"], rows), d, len(rows))


@command(
    "set_checkpoint",
    "Replay a subscriber: deliver again from a time or ID (every partition unless one is given).",
    QUEUE,
    SUBSCRIBER,
    TIME,
    PARTITION,
    examples=(
        "set_checkpoint 'q1', 'indexer', '2026-11-22 10:00'",
        "set_checkpoint 'q1', 'indexer', '1795316153036:0', 3",
    ),
    group="subscribers",
)
def set_checkpoint(session: Session, queue: str, subscriber: str, time, partition) -> Output:
    session.admin.set_checkpoint(queue, subscriber, partition, time)
    which = "every partition" if partition is None else f"partition {partition}"
    return Output(f"Subscriber {subscriber!r} on {queue!r} replays {which} from {time} ({stamp(time)})", {"from": time})


# -- consumer groups (SPEC X3) --------------------------------------------------------------------


@command(
    "list_groups",
    "List a queue's consumer groups: members, messages in flight and retrying, lag, and the dead letters.",
    QUEUE,
    examples=("list_groups 'q1'",),
    group="groups",
    aliases=("groups",),
    read_only=True,
)
def list_groups(session: Session, queue: str) -> Output:
    rows, data = [], []
    dead = 0
    for name in session.admin.list_groups(queue):
        d = session.admin.describe_group(queue, name)
        parts = d["partitions"].values()
        row = {
            "group": name,
            "members": len(d["members"]),
            "in_flight": sum(p["in_flight"] for p in parts),
            "retrying": sum(p["retrying"] for p in parts),
            "lag_messages": sum(p["lag_messages"] for p in parts),
            "lag_millis": max((p["lag_millis"] for p in parts), default=0),
            "dead_lettered": sum(p.get("dead_lettered", 0) for p in parts),
            "dead_letters": d["dead_letters"],
        }
        dead = d["dead_letters"]
        data.append(row)
        rows.append((name, row["members"], row["in_flight"], row["retrying"], row["lag_messages"],
                     seconds(row["lag_millis"] / 1000), row["dead_lettered"]))  # fmt: skip
    if not rows:
        return Output("", data, 0)
    columns = ["GROUP", "MEMBERS", "IN FLIGHT", "RETRYING", "LAG (MESSAGES)", "LAG (S, OLDEST)", "DEAD-LETTERED"]
    footer = (
        f"\ndead letters: {_or_unknown(dead)} in {dead_letter_queue(queue)} now (the queue's, shared by its "
        "groups; DEAD-LETTERED: what each group moved there, ever)"
    )
    return Output(table(columns, rows) + footer, data, len(rows))


@command(
    "describe_group",
    "Show a consumer group's members, and per partition its cursors, messages in flight and retrying, and lag.",
    QUEUE,
    GROUP,
    examples=("describe_group 'q1', 'billing'",),
    group="groups",
    cli_format="json",
    read_only=True,
)
def describe_group(session: Session, queue: str, group: str) -> Output:
    d = session.admin.describe_group(queue, group)
    head = (
        f"members: {', '.join(d['members']) or '(none)'}\ntopics: {_topics(d['topics'])}\n"
        f"max retries: {d['max_retries']}\n"
        f"dead letters: {_or_unknown(d['dead_letters'])} (in {dead_letter_queue(queue)})\n\n"
    )
    rows = [
        (
            pid, str(p["done"]), str(p["scan"]), p["in_flight"], p["retrying"], p["dead_letter_waiting"],
            p["lag_messages"], p["lag_millis"],
        )
        for pid, p in sorted(d["partitions"].items())
    ]  # fmt: skip
    columns = [
        "PARTITION", "DONE BELOW", "SCANNED TO", "IN FLIGHT", "RETRYING", "WAITING FOR DLQ",
        "LAG (MESSAGES)", "LAG (MS)",
    ]  # fmt: skip
    return Output(head + table(columns, rows), d, len(rows))


#: The columns of a consumer group's pending messages.
PENDING_COLUMNS = ["PARTITION", "ID", "MEMBER", "ATTEMPT", "LEASE LEFT (S)", "RETRY IN (S)"]


@command(
    "pending",
    "Show a consumer group's messages in flight: who holds each, its attempt, and the seconds its lease "
    "has left (or before it goes out again).",
    QUEUE,
    GROUP,
    Param("limit", "At most this many.", "int", 1000, low=1, high=10_000, short="-n"),
    examples=("pending 'q1', 'billing'", "pending 'q1', 'billing', {LIMIT => 10}"),
    group="groups",
    read_only=True,
)
def pending(session: Session, queue: str, group: str, limit: int) -> Output:
    found = session.queue(queue).pending(group, limit=limit)
    rows = [
        (p.partition_id, str(p.id), p.member or "(waiting)", p.attempt, seconds(p.lease_left), seconds(p.retry_in))
        for p in found
    ]
    return Output(table(PENDING_COLUMNS, rows), [p._asdict() for p in found], len(rows))


@command(
    "replay_group",
    "Replay a consumer group from a time (or skip ahead to it), for every partition or one.",
    QUEUE,
    GROUP,
    TIME,
    PARTITION,
    examples=("replay_group 'q1', 'billing', '2026-11-22 10:00'", "replay_group 'q1', 'billing', 0, {PARTITION => 2}"),
    group="groups",
)
def replay_group(session: Session, queue: str, group: str, time, partition) -> Output:
    session.admin.set_group_position(queue, group, partition, time)
    which = "every partition" if partition is None else f"partition {partition}"
    return Output(f"Group {group!r} of {queue!r} takes {which} from {time} ({stamp(time)})", {"from": time})


@command(
    "delete_group",
    "Forget a consumer group and all its progress.",
    QUEUE,
    GROUP,
    examples=("delete_group 'q1', 'billing'",),
    group="groups",
)
def delete_group(session: Session, queue: str, group: str) -> Output:
    session.admin.delete_group(queue, group)
    return Output(f"Deleted group {group!r} of {queue!r}", {"queue": queue, "group": group})


@command(
    "replay_dlq",
    "Put a queue's dead letters (the queue 'queue.dlq') back on it; they stay in queue.dlq.",
    QUEUE,
    Param("start", "First dead letter to replay: ID or time (inclusive).", "time", None),
    Param("stop", "Dead letter ID or time to stop before.", "time", None),
    Param("rate", "At most this many messages a second (default: as fast as the store takes them).", "float",
          None, low=0.001, high=1e9),
    examples=("replay_dlq 'q1'", "replay_dlq 'q1', {START => '2026-11-22 10:00', RATE => 100}"),
    group="groups",
)  # fmt: skip
def replay_dlq(session: Session, queue: str, start, stop, rate) -> Output:
    count = session.admin.replay_dead_letters(queue, start, stop, rate=rate)
    dlq = dead_letter_queue(queue)
    if count == 0 and not session.admin.queue_exists(dlq):  # (made by the first dead letter)
        text = f"Replayed 0 messages: {queue!r} has no dead letters ({dlq!r} is made by the first one)"
    else:
        text = f"Replayed {count} message(s) from {dlq} onto {queue!r} (truncate it when done)"
    return Output(text, {"replayed": count}, count)
