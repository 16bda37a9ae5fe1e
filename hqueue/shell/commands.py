"""The shell's commands: the HQueue seed's, with their argument orders, and more.

Each command is a function ``(shell, *args) -> (text, rows)`` registered
with its usage, help and examples; the shell prints ``text`` and the
timing line. Arguments are checked here, so a mistake is one ERROR line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Durability
from ..errors import HQueueError
from ..message import Message, MessageID
from ..scanner import Scan
from .output import printable, table

if TYPE_CHECKING:
    from .repl import Shell

Result = tuple[str, int | None]


class UsageError(HQueueError):
    """Wrong arguments for a command; the message shows its usage."""


@dataclass(frozen=True)
class Command:
    name: str
    run: Callable[..., Result]
    usage: str
    help: str
    examples: tuple[str, ...]
    group: str


COMMANDS: dict[str, Command] = {}


def command(usage: str, help: str, *examples: str, group: str = "queues"):
    def register(run: Callable[..., Result]) -> Callable[..., Result]:
        name = usage.split()[0]
        COMMANDS[name] = Command(name, run, usage, help, examples, group)
        return run

    return register


# -- argument checks ------------------------------------------------------------------------


def _arity(name: str, args: tuple, low: int, high: int) -> None:
    if not low <= len(args) <= high:
        expected = low if low == high else f"{low} to {high}"
        raise UsageError(f"{name} takes {expected} argument(s), got {len(args)}; usage: {COMMANDS[name].usage}")


def _str(name: str, value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{name}: {what} must be a quoted string, got {value!r}; usage: {COMMANDS[name].usage}")
    return value


def _int(name: str, value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{name}: {what} must be an integer, got {value!r}; usage: {COMMANDS[name].usage}")
    return value


def to_bytes(text: str) -> bytes:
    """UTF-8, with \\xNN escapes as the raw bytes they name (see the parser)."""
    return text.encode("utf-8", "surrogateescape")


def _position(name: str, value: Any) -> MessageID:
    """A time ('2026-11-22 10:00', UTC unless it says otherwise), an ID ('ts:seq') or epoch ms."""
    if isinstance(value, int) and not isinstance(value, bool):
        return MessageID(value)
    if isinstance(value, str):
        try:
            return MessageID.parse(value)
        except ValueError as e:
            raise UsageError(f"{name}: {e}") from None
    raise UsageError(f"{name}: expected a time, an ID or epoch milliseconds, got {value!r}")


# -- queues ---------------------------------------------------------------------------------


@command(
    "create 'queue', partitions, ttl[, {config}]",
    "Create a queue. TTL is in seconds (0 keeps messages forever). Config may hold "
    "'hbase.hqueue.partitionsPerRegion', DURABILITY ('SYNC_WAL', 'ASYNC_WAL', 'SKIP_WAL') "
    "and MAX_MESSAGE_BYTES; other keys are stored with the queue.",
    "create 'q1', 32, 86400",
    "create 'q1', 32, 86400, {'hbase.hqueue.partitionsPerRegion' => '4', 'hbase.hstore.compaction.min' => '16'}",
)
def create(shell: Shell, *args: Any) -> Result:
    _arity("create", args, 3, 4)
    name = _str("create", args[0], "the queue name")
    partitions, ttl = _int("create", args[1], "partitions"), _int("create", args[2], "the TTL")
    config = args[3] if len(args) == 4 else {}
    if not isinstance(config, dict):
        raise UsageError(f"create: the config must be a {{'key' => 'value'}} dictionary, got {config!r}")
    settings = {str(k): printable(v) for k, v in config.items()}
    durability = settings.pop("DURABILITY", settings.pop("hqueue.durability", Durability.SYNC_WAL))
    max_bytes = settings.pop("MAX_MESSAGE_BYTES", None)
    extra = {"max_message_bytes": int(max_bytes)} if max_bytes else {}
    shell.admin.create_queue(name, partitions, ttl, settings, durability=durability, **extra)
    return f"Created queue {name!r}: {partitions} partitions, ttl {ttl}s, {durability}", None


@command("truncate_queue 'queue'", "Delete every message; keep the queue and its partitions.", "truncate_queue 'q1'")
def truncate_queue(shell: Shell, *args: Any) -> Result:
    _arity("truncate_queue", args, 1, 1)
    shell.admin.truncate_queue(_str("truncate_queue", args[0], "the queue name"))
    return f"Truncated {args[0]!r}", None


@command("disable_queue 'queue'", "Refuse puts and scans until enable_queue.", "disable_queue 'q1'")
def disable_queue(shell: Shell, *args: Any) -> Result:
    _arity("disable_queue", args, 1, 1)
    shell.admin.disable_queue(_str("disable_queue", args[0], "the queue name"))
    return f"Disabled {args[0]!r}", None


@command("enable_queue 'queue'", "Accept puts and scans again.", "enable_queue 'q1'")
def enable_queue(shell: Shell, *args: Any) -> Result:
    _arity("enable_queue", args, 1, 1)
    shell.admin.enable_queue(_str("enable_queue", args[0], "the queue name"))
    return f"Enabled {args[0]!r}", None


@command(
    "drop_queue 'queue'",
    "Delete a queue and its messages; it must be disabled first.",
    "disable_queue 'q1'",
    "drop_queue 'q1'",
)
def drop_queue(shell: Shell, *args: Any) -> Result:
    _arity("drop_queue", args, 1, 1)
    shell.admin.delete_queue(_str("drop_queue", args[0], "the queue name"))
    return f"Dropped {args[0]!r}", None


@command("list", "List the queues.", "list")
def list_(shell: Shell, *args: Any) -> Result:
    _arity("list", args, 0, 0)
    infos = shell.admin.list_queues()
    rows = [(i.name, i.partitions, i.ttl, i.state, i.durability) for i in infos]
    return table(["QUEUE", "PARTITIONS", "TTL", "STATE", "DURABILITY"], rows) if rows else "", len(rows)


@command("describe 'queue'", "Show a queue's settings and each partition's last message ID.", "describe 'q1'")
def describe(shell: Shell, *args: Any) -> Result:
    _arity("describe", args, 1, 1)
    d = shell.admin.describe_queue(_str("describe", args[0], "the queue name"))
    count = d["message_count_estimate"]
    settings = [
        ("partitions", d["partitions"]),
        ("ttl", f"{d['ttl']}s"),
        ("state", d["state"]),
        ("durability", d["durability"]),
        ("max_message_bytes", d["max_message_bytes"]),
        ("messages (estimate)", "unknown" if count is None else count),
        *((k, v) for k, v in sorted(d["config"].items())),
    ]
    last = [
        (pid, str(i) if i else "-", i.datetime.isoformat(timespec="milliseconds") if i else "")
        for pid, i in d["last_ids"].items()
    ]
    text = table(["PROPERTY", "VALUE"], settings) + "\n\n" + table(["PARTITION", "LAST ID", "LAST WRITE (UTC)"], last)
    return text, len(last)


@command(
    "put 'queue', 'topic', 'value'[, partition]",
    "Put one message (to a random partition unless one is given) and print its ID.",
    "put 'q1', 'crawler', 'http://example.com'",
    "put 'q1', 'crawler', 'http://example.com/\\x00', 3",
)
def put(shell: Shell, *args: Any) -> Result:
    _arity("put", args, 3, 4)
    name = _str("put", args[0], "the queue name")
    topic, value = _str("put", args[1], "the topic"), _str("put", args[2], "the value")
    partition = _int("put", args[3], "the partition") if len(args) == 4 else None
    (message_id,) = shell.queue(name).put(Message(to_bytes(topic), to_bytes(value)), partition)
    return f"Put {message_id} ({message_id.datetime.isoformat(timespec='milliseconds')})", None


SCAN_OPTIONS = {"LIMIT", "TOPICS", "STARTTIME", "STOPTIME", "STARTID", "STOPID", "PARTITION"}


@command(
    "scan 'queue'[, {LIMIT => n, TOPICS => ['t'], STARTTIME => 'time', STOPTIME => 'time', PARTITION => p}]",
    "Print messages in ID order. Times are 'YYYY-MM-DD HH:MM[:SS]' in UTC unless they carry "
    "an offset; STARTID/STOPID take 'millis:sequence'. Start is inclusive, stop exclusive.",
    "scan 'q1', {LIMIT => 10}",
    "scan 'q1', {LIMIT => 10, TOPICS => ['t1'], STARTTIME => '2026-11-22 10:00', PARTITION => 3}",
)
def scan(shell: Shell, *args: Any) -> Result:
    _arity("scan", args, 1, 2)
    name = _str("scan", args[0], "the queue name")
    options = (
        {str(k).upper(): v for k, v in (args[1] if len(args) == 2 else {}).items()}
        if len(args) < 2 or isinstance(args[1], dict)
        else None
    )
    if options is None:
        raise UsageError(f"scan: options must be a {{KEY => value}} dictionary; usage: {COMMANDS['scan'].usage}")
    unknown = set(options) - SCAN_OPTIONS
    if unknown:
        raise UsageError(
            f"scan: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(SCAN_OPTIONS))}"
        )
    start = (
        _position("scan", options.get("STARTID", options.get("STARTTIME")))
        if {"STARTID", "STARTTIME"} & set(options)
        else None
    )
    stop = (
        _position("scan", options.get("STOPID", options.get("STOPTIME")))
        if {"STOPID", "STOPTIME"} & set(options)
        else None
    )
    topics = options.get("TOPICS")
    if topics is not None and not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
        raise UsageError("scan: TOPICS must be a list of quoted strings, as ['t1', 't2']")
    limit = _int("scan", options["LIMIT"], "LIMIT") if "LIMIT" in options else None
    partition = _int("scan", options["PARTITION"], "PARTITION") if "PARTITION" in options else None
    messages = shell.queue(name).scan(
        start, stop, [to_bytes(t) for t in topics or ()] or None, partition_id=partition, limit=limit
    )
    rows = [
        (m.partition_id, str(i), i.datetime.isoformat(timespec="milliseconds"), m.topic, m.value)
        for m in messages
        for i in (m.id,)
        if i
    ]
    return table(["PARTITION", "ID", "TIME (UTC)", "TOPIC", "VALUE"], rows) if rows else "", len(rows)


@command("count 'queue'", "Count the messages (reads them all).", "count 'q1'")
def count(shell: Shell, *args: Any) -> Result:
    _arity("count", args, 1, 1)
    with shell.queue(_str("count", args[0], "the queue name")).get_queue_scanner(Scan()) as scanner:
        total = sum(1 for _ in scanner)
    return str(total), total


@command("status", "Where the shell is connected, and what is there.", "status", group="general")
def status(shell: Shell, *args: Any) -> Result:
    _arity("status", args, 0, 0)
    infos = shell.admin.list_queues()
    lines = [f"store: {shell.admin.url}", f"{len(infos)} queue(s), {sum(i.partitions for i in infos)} partition(s)"]
    locations = getattr(shell.admin.engine, "locations", None)
    if locations is not None:
        owners: dict[str, int] = {}
        for info in infos:
            for owner in locations(info.name, fresh=True):
                owners[owner or "(none)"] = owners.get(owner or "(none)", 0) + 1
        lines.append(table(["SERVER", "PARTITIONS OWNED"], sorted(owners.items())))
    return "\n".join(lines), None


# -- subscribers ------------------------------------------------------------------------------


@command(
    "add_subscriber 'queue', 'subscriber'",
    "Register a subscriber now: nothing written after this is missed, even before it starts.",
    "add_subscriber 'queue_name', 'subscriber_name'",
    group="subscribers",
)
def add_subscriber(shell: Shell, *args: Any) -> Result:
    _arity("add_subscriber", args, 2, 2)
    queue, name = (
        _str("add_subscriber", args[0], "the queue name"),
        _str("add_subscriber", args[1], "the subscriber name"),
    )
    shell.admin.add_subscriber(queue, name)
    return f"Added subscriber {name!r} to {queue!r}", None


@command(
    "delete_subscriber 'subscriber', 'queue'",
    "Forget a subscriber and its checkpoints (note the argument order, as in HQueue).",
    "delete_subscriber 'subscriber_name', 'queue_name'",
    group="subscribers",
)
def delete_subscriber(shell: Shell, *args: Any) -> Result:
    _arity("delete_subscriber", args, 2, 2)
    name, queue = (
        _str("delete_subscriber", args[0], "the subscriber name"),
        _str("delete_subscriber", args[1], "the queue name"),
    )
    shell.admin.delete_subscriber(name, queue)
    return f"Deleted subscriber {name!r} from {queue!r}", None


@command("list_subscribers 'queue'", "List a queue's subscribers.", "list_subscribers 'q1'", group="subscribers")
def list_subscribers(shell: Shell, *args: Any) -> Result:
    _arity("list_subscribers", args, 1, 1)
    names = shell.admin.list_subscribers(_str("list_subscribers", args[0], "the queue name"))
    return "\n".join(names), len(names)


@command(
    "describe_subscriber 'subscriber', 'queue'",
    "Show a subscriber's address, topics, and per partition its checkpoint and lag.",
    "describe_subscriber 'sub', 'q1'",
    group="subscribers",
)
def describe_subscriber(shell: Shell, *args: Any) -> Result:
    _arity("describe_subscriber", args, 2, 2)
    d = shell.admin.describe_subscriber(
        _str("describe_subscriber", args[0], "the subscriber name"),
        _str("describe_subscriber", args[1], "the queue name"),
    )
    topics = ", ".join(printable(t) for t in sorted(d["topics"])) if d["topics"] else "all"
    head = f"address: {d['address'] or '(away)'}\ntopics: {topics}\n\n"
    rows = [
        (pid, str(checkpoint), d["lag_messages"].get(pid, 0), d["lag_millis"].get(pid, 0))
        for pid, checkpoint in sorted(d["checkpoints"].items())
    ]
    return head + table(["PARTITION", "CHECKPOINT", "LAG (MESSAGES)", "LAG (MS)"], rows), len(rows)


@command(
    "set_checkpoint 'subscriber', 'queue', 'time'[, partition]",
    "Replay: deliver again from a time or 'millis:sequence' ID (every partition unless one is given).",
    "set_checkpoint 'sub', 'q1', '2026-11-22 10:00'",
    "set_checkpoint 'sub', 'q1', '1795316153036:0', 3",
    group="subscribers",
)
def set_checkpoint(shell: Shell, *args: Any) -> Result:
    _arity("set_checkpoint", args, 3, 4)
    name, queue = (
        _str("set_checkpoint", args[0], "the subscriber name"),
        _str("set_checkpoint", args[1], "the queue name"),
    )
    start = _position("set_checkpoint", args[2])
    partition = _int("set_checkpoint", args[3], "the partition") if len(args) == 4 else "all"
    shell.admin.set_checkpoint(queue, name, partition, start)
    return (
        f"Subscriber {name!r} on {queue!r} replays from {start} ({start.datetime.isoformat(timespec='milliseconds')})",
        None,
    )


# -- the shell itself ---------------------------------------------------------------------------


@command(
    "help ['command']",
    "List the commands, or show one command's usage and examples.",
    "help",
    "help 'scan'",
    group="general",
)
def help_(shell: Shell, *args: Any) -> Result:
    _arity("help", args, 0, 1)
    if args:
        name = _str("help", args[0], "the command name")
        if name not in COMMANDS:
            raise UsageError(f"no command {name!r}; type help for the list")
        c = COMMANDS[name]
        return f"{c.usage}\n\n  {c.help}\n\nExamples:\n" + "\n".join(f"  {e}" for e in c.examples), None
    groups: dict[str, list[Command]] = {}
    for c in COMMANDS.values():
        groups.setdefault(c.group, []).append(c)
    parts = []
    for group in ("general", "queues", "subscribers"):
        parts.append(f"Group: {group}\n" + "\n".join(f"  {c.usage}" for c in groups.get(group, [])))
    parts.append("Type help 'command' for details and examples. Strings take 'single' or \"double\" quotes.")
    return "\n\n".join(parts), None


@command("exit", "Leave the shell (Ctrl-D does too).", "exit", group="general")
def exit_(shell: Shell, *args: Any) -> Result:
    shell.done = True
    return "", None


COMMANDS["quit"] = Command("quit", exit_, "quit", "Leave the shell.", ("quit",), "general")
