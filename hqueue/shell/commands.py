"""The shell's commands: the HQueue seed's, with their argument orders, and more.

Each command is a function ``(shell, *args) -> (text, rows)``, registered
with its usage, help, examples and argument specs. The registry checks the
count and the types of the arguments before the function runs, so a
mistake is one ERROR line that shows the usage; the shell prints ``text``
and a timing line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from ..config import DEFAULT_MAX_MESSAGE_BYTES, Durability
from ..deadletters import dead_letter_queue
from ..errors import HQueueError
from ..message import Message, MessageID
from ..scanner import Scan
from .output import PENDING_COLUMNS, pending_rows, printable, table

if TYPE_CHECKING:
    from ..admin import HQueueAdmin
    from ..queue import HQueue


class Shell(Protocol):
    """What a command needs of the shell running it (repl.py's Shell)."""

    admin: HQueueAdmin
    done: bool

    def queue(self, name: str) -> HQueue: ...


class Streamed:
    """Output printed as it is made (a big scan); ``rows`` counts what came out."""

    def __init__(self, parts: Iterator[tuple[str, int]]) -> None:
        self.parts, self.rows = parts, 0

    def __iter__(self) -> Iterator[str]:
        for text, rows in self.parts:
            self.rows += rows
            yield text


Result = tuple[str | Streamed, int | None]
#: Rows formatted together when a scan streams.
SCAN_CHUNK = 1000


class UsageError(HQueueError):
    """Wrong arguments for a command; the message shows its usage."""


@dataclass(frozen=True)
class Arg:
    """One argument: what it is (for messages) and the type it must have."""

    what: str
    kind: type = str
    optional: bool = False


QUEUE, SUBSCRIBER = Arg("the queue name"), Arg("the subscriber name")
_KINDS = {str: "a quoted string", int: "an integer", dict: "a {'key' => value} dictionary", object: "a value"}


@dataclass(frozen=True)
class Command:
    name: str
    run: Callable[..., Result]
    usage: str
    help: str
    examples: tuple[str, ...]
    group: str
    args: tuple[Arg, ...] = ()

    def __call__(self, shell: Shell, args: list[Any]) -> Result:
        """Check the arguments against their specs, then run."""
        low = sum(not a.optional for a in self.args)
        if not low <= len(args) <= len(self.args):
            expected = low if low == len(self.args) else f"{low} to {len(self.args)}"
            raise UsageError(f"{self.name} takes {expected} argument(s), got {len(args)}; usage: {self.usage}")
        for spec, value in zip(self.args, args, strict=False):
            if not isinstance(value, spec.kind) or (spec.kind is int and isinstance(value, bool)):
                kind = _KINDS[spec.kind]
                raise UsageError(f"{self.name}: {spec.what} must be {kind}, got {value!r}; usage: {self.usage}")
        return self.run(shell, *args)


COMMANDS: dict[str, Command] = {}


def command(usage: str, help: str, *examples: str, args: tuple[Arg, ...] = (), group: str = "queues"):
    def register(run: Callable[..., Result]) -> Callable[..., Result]:
        name = usage.split()[0]
        COMMANDS[name] = Command(name, run, usage, help, examples, group, args)
        return run

    return register


def to_bytes(text: str) -> bytes:
    """UTF-8, with \\xNN escapes as the raw bytes they name (see the parser)."""
    return text.encode("utf-8", "surrogateescape")


def position(name: str, value: Any) -> MessageID:
    """A time ('2026-11-22 10:00', UTC unless it says otherwise), an ID ('ts:seq') or epoch ms."""
    if isinstance(value, int) and not isinstance(value, bool):
        return MessageID(value)
    if isinstance(value, str):
        try:
            return MessageID.parse(value)
        except ValueError as e:
            raise UsageError(f"{name}: {e}") from None
    raise UsageError(f"{name}: expected a time, an ID or epoch milliseconds, got {value!r}")


def stamp(message_id: MessageID) -> str:
    return message_id.datetime.isoformat(timespec="milliseconds")


# -- queues ---------------------------------------------------------------------------------


@command(
    "create 'queue', partitions, ttl[, {config}]",
    "Create a queue. TTL is in seconds (0 keeps messages forever). Config may hold "
    "'hbase.hqueue.partitionsPerRegion', DURABILITY ('SYNC_WAL', 'ASYNC_WAL', 'SKIP_WAL') "
    "and MAX_MESSAGE_BYTES; other keys are stored with the queue.",
    "create 'q1', 32, 86400",
    "create 'q1', 32, 86400, {'hbase.hqueue.partitionsPerRegion' => '4', 'hbase.hstore.compaction.min' => '16'}",
    args=(QUEUE, Arg("partitions", int), Arg("the TTL", int), Arg("the config", dict, optional=True)),
)
def create(shell: Shell, name: str, partitions: int, ttl: int, config: dict | None = None) -> Result:
    settings = {str(k): printable(v) for k, v in (config or {}).items()}
    durability = settings.pop("DURABILITY", settings.pop("hqueue.durability", Durability.SYNC_WAL))
    max_bytes = int(settings.pop("MAX_MESSAGE_BYTES", None) or DEFAULT_MAX_MESSAGE_BYTES)
    shell.admin.create_queue(name, partitions, ttl, settings, durability=durability, max_message_bytes=max_bytes)
    return f"Created queue {name!r}: {partitions} partitions, ttl {ttl}s, {durability}", None


def _one_queue_command(name: str, method: str, done: str, help: str, *examples: str) -> None:
    """truncate_queue, disable_queue, enable_queue and drop_queue: one admin call each."""

    def run(shell: Shell, queue: str) -> Result:
        getattr(shell.admin, method)(queue)
        return f"{done} {queue!r}", None

    command(f"{name} 'queue'", help, *examples, args=(QUEUE,))(run)


_one_queue_command(
    "truncate_queue", "truncate_queue", "Truncated", "Delete every message; keep the queue and its partitions.",
    "truncate_queue 'q1'",
)  # fmt: skip
_one_queue_command(
    "disable_queue", "disable_queue", "Disabled", "Refuse puts and scans until enable_queue.", "disable_queue 'q1'"
)
_one_queue_command("enable_queue", "enable_queue", "Enabled", "Accept puts and scans again.", "enable_queue 'q1'")
_one_queue_command(
    "drop_queue", "delete_queue", "Dropped", "Delete a queue and its messages; it must be disabled first.",
    "disable_queue 'q1'", "drop_queue 'q1'",
)  # fmt: skip


@command("list", "List the queues.", "list")
def list_(shell: Shell) -> Result:
    rows = [(i.name, i.partitions, i.ttl, i.state, i.durability) for i in shell.admin.list_queues()]
    return table(["QUEUE", "PARTITIONS", "TTL", "STATE", "DURABILITY"], rows) if rows else "", len(rows)


@command(
    "describe 'queue'", "Show a queue's settings and each partition's last message ID.", "describe 'q1'", args=(QUEUE,)
)
def describe(shell: Shell, name: str) -> Result:
    d = shell.admin.describe_queue(name)
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
    return text, len(last)


#: Short names, as the HBase shell has them; help lists them beside their command.
ALIASES = {"desc": "describe"}


@command(
    "put 'queue', 'topic', 'value'[, partition]",
    "Put one message (to a random partition unless one is given) and print its ID.",
    "put 'q1', 'crawler', 'http://example.com'",
    "put 'q1', 'crawler', 'http://example.com/\\x00', 3",
    args=(QUEUE, Arg("the topic"), Arg("the value"), Arg("the partition", int, optional=True)),
)
def put(shell: Shell, name: str, topic: str, value: str, partition: int | None = None) -> Result:
    (message_id,) = shell.queue(name).put(Message(to_bytes(topic), to_bytes(value)), partition)
    return f"Put {message_id} ({stamp(message_id)})", None


SCAN_OPTIONS = {"LIMIT", "TOPICS", "STARTTIME", "STOPTIME", "STARTID", "STOPID", "PARTITION"}


@command(
    "scan 'queue'[, {LIMIT => n, TOPICS => ['t'], STARTTIME => 'time', STOPTIME => 'time', PARTITION => p}]",
    "Print messages in ID order. Times are 'YYYY-MM-DD HH:MM[:SS]' in UTC unless they carry "
    "an offset; STARTID/STOPID take 'millis:sequence'. Start is inclusive, stop exclusive.",
    "scan 'q1', {LIMIT => 10}",
    "scan 'q1', {LIMIT => 10, TOPICS => ['t1'], STARTTIME => '2026-11-22 10:00', PARTITION => 3}",
    args=(QUEUE, Arg("the options", dict, optional=True)),
)
def scan(shell: Shell, name: str, given: dict | None = None) -> Result:
    options = {str(k).upper(): v for k, v in (given or {}).items()}
    unknown = set(options) - SCAN_OPTIONS
    if unknown:
        known = ", ".join(sorted(SCAN_OPTIONS))
        raise UsageError(f"scan: unknown option(s) {', '.join(sorted(unknown))}; known: {known}")
    start, stop = (options.get(f"{edge}ID", options.get(f"{edge}TIME")) for edge in ("START", "STOP"))
    topics = options.get("TOPICS")
    if topics is not None and not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
        raise UsageError("scan: TOPICS must be a list of quoted strings, as ['t1', 't2']")
    for option in ("LIMIT", "PARTITION"):
        if option in options and (not isinstance(options[option], int) or isinstance(options[option], bool)):
            raise UsageError(f"scan: {option} must be an integer, got {options[option]!r}")
    messages = shell.queue(name).scan(
        position("scan", start) if start is not None else None,
        position("scan", stop) if stop is not None else None,
        [to_bytes(t) for t in topics] if topics else None,
        partition_id=options.get("PARTITION"),
        limit=options.get("LIMIT"),
    )
    return Streamed(_scan_chunks(messages)), None


def _scan_chunks(messages: Iterable[Message]) -> Iterator[tuple[str, int]]:
    """The scan's table, SCAN_CHUNK rows at a time (text, rows): the first rows
    show at once, and memory stays flat. Only the first part has the header."""
    headers = ["PARTITION", "ID", "TIME (UTC)", "TOPIC", "VALUE"]
    widths: list[int] = []
    iterator, first = iter(messages), True
    while chunk := list(islice(iterator, SCAN_CHUNK)):
        rows = [(m.partition_id, str(i), stamp(i), m.topic, m.value) for m in chunk for i in (m.id,) if i]
        text = table(headers, rows, widths)
        yield (text if first else text.split("\n", 1)[1]), len(rows)
        first = False


@command("count 'queue'", "Count the messages (reads them all).", "count 'q1'", args=(QUEUE,))
def count(shell: Shell, name: str) -> Result:
    with shell.queue(name).get_queue_scanner(Scan()) as scanner:
        total = sum(1 for _ in scanner)
    return str(total), total


@command(
    "status",
    "Where the shell is connected, who owns the partitions, and how far behind each subscriber is.",
    "status",
    group="general",
)
def status(shell: Shell) -> Result:
    admin = shell.admin
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
            seconds = max(d["lag_millis"].values(), default=0) / 1000
            lag.append((name, info.name, d["address"] or "(away)", sum(d["lag_messages"].values()), f"{seconds:.1f}"))
    if lag:
        lines.append(table(["SUBSCRIBER", "QUEUE", "ADDRESS", "LAG (MESSAGES)", "LAG (S, OLDEST)"], lag))
    return "\n".join(lines), None


# -- subscribers ------------------------------------------------------------------------------


@command(
    "add_subscriber 'queue', 'subscriber'",
    "Register a subscriber now: nothing written after this is missed, even before it starts.",
    "add_subscriber 'queue_name', 'subscriber_name'",
    args=(QUEUE, SUBSCRIBER),
    group="subscribers",
)
def add_subscriber(shell: Shell, queue: str, name: str) -> Result:
    shell.admin.add_subscriber(queue, name)
    return f"Added subscriber {name!r} to {queue!r}", None


@command(
    "delete_subscriber 'subscriber', 'queue'",
    "Forget a subscriber and its checkpoints (note the argument order, as in HQueue).",
    "delete_subscriber 'subscriber_name', 'queue_name'",
    args=(SUBSCRIBER, QUEUE),
    group="subscribers",
)
def delete_subscriber(shell: Shell, name: str, queue: str) -> Result:
    shell.admin.delete_subscriber(queue, name)
    return f"Deleted subscriber {name!r} from {queue!r}", None


@command(
    "list_subscribers 'queue'",
    "List a queue's subscribers.",
    "list_subscribers 'q1'",
    args=(QUEUE,),
    group="subscribers",
)
def list_subscribers(shell: Shell, queue: str) -> Result:
    return listing(shell.admin.list_subscribers(queue))


@command(
    "describe_subscriber 'subscriber', 'queue'",
    "Show a subscriber's address, topics, and per partition its checkpoint and lag.",
    "describe_subscriber 'sub', 'q1'",
    args=(SUBSCRIBER, QUEUE),
    group="subscribers",
)
def describe_subscriber(shell: Shell, name: str, queue: str) -> Result:
    d = shell.admin.describe_subscriber(queue, name)
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
    args=(SUBSCRIBER, QUEUE, Arg("the time", object), Arg("the partition", int, optional=True)),
    group="subscribers",
)
def set_checkpoint(shell: Shell, name: str, queue: str, when: Any, partition: int | None = None) -> Result:
    start = position("set_checkpoint", when)
    shell.admin.set_checkpoint(queue, name, "all" if partition is None else partition, start)
    return f"Subscriber {name!r} on {queue!r} replays from {start} ({stamp(start)})", None


@command(
    "replay_dlq 'queue'",
    "Put the dead letters of a queue (the queue 'queue.dlq') back on it; they stay in queue.dlq.",
    "replay_dlq 'q1'",
    args=(QUEUE,),
    group="subscribers",
)
def replay_dlq(shell: Shell, queue: str) -> Result:
    count = shell.admin.replay_dead_letters(queue)
    return f"Replayed {count} message(s) from {queue}.dlq onto {queue!r}", count


@command(
    "list_groups 'queue'",
    "List a queue's consumer groups.",
    "list_groups 'q1'",
    args=(QUEUE,),
    group="groups",
)
def list_groups(shell: Shell, queue: str) -> Result:
    return listing(shell.admin.list_groups(queue))


def listing(names: list[str]) -> Result:
    """One name a line, and how many."""
    return "\n".join(names), len(names)


@command(
    "describe_group 'queue', 'group'",
    "Show a consumer group's members, and per partition its cursors, messages in flight and retrying, and lag.",
    "describe_group 'q1', 'billing'",
    args=(QUEUE, Arg("the group name")),
    group="groups",
)
def describe_group(shell: Shell, queue: str, group: str) -> Result:
    d = shell.admin.describe_group(queue, group)
    topics = ", ".join(printable(t) for t in sorted(d["topics"])) if d["topics"] else "all"
    head = (
        f"members: {', '.join(d['members']) or '(none)'}\ntopics: {topics}\nmax retries: {d['max_retries']}\n"
        f"dead letters: {d['dead_letters']} (in {dead_letter_queue(queue)})\n\n"
    )
    rows = [
        (pid, str(p["done"]), str(p["scan"]), p["in_flight"], p["retrying"], p["lag_messages"], p["lag_millis"])
        for pid, p in sorted(d["partitions"].items())
    ]
    columns = ["PARTITION", "DONE BELOW", "SCANNED TO", "IN FLIGHT", "RETRYING", "LAG (MESSAGES)", "LAG (MS)"]
    return head + table(columns, rows), len(rows)


@command(
    "pending 'queue', 'group'",
    "Show a consumer group's messages in flight: who holds each, its attempt, and the seconds its lease "
    "has left (or before it goes out again).",
    "pending 'q1', 'billing'",
    args=(QUEUE, Arg("the group name")),
    group="groups",
)
def pending(shell: Shell, queue: str, group: str) -> Result:
    rows = pending_rows(shell.queue(queue).pending(group))
    return table(PENDING_COLUMNS, rows), len(rows)


# -- the shell itself ---------------------------------------------------------------------------


@command(
    "help ['command']", "List the commands, or show one command's usage and examples.", "help", "help 'scan'",
    args=(Arg("the command name", optional=True),), group="general",
)  # fmt: skip
def help_(shell: Shell, name: str | None = None) -> Result:
    if name is not None:
        if name not in COMMANDS and name not in ALIASES:
            raise UsageError(f"no command {name!r}; type help for the list")
        c = COMMANDS[ALIASES.get(name, name)]
        return f"{c.usage}\n\n  {c.help}\n\nExamples:\n" + "\n".join(f"  {e}" for e in c.examples), None
    parts = []
    aliases = {command: alias for alias, command in ALIASES.items()}
    for group in ("general", "queues", "subscribers", "groups"):
        usages = [
            c.usage + (f"   (or {aliases[c.name]})" if c.name in aliases else "")
            for c in COMMANDS.values()
            if c.group == group
        ]
        parts.append(f"Group: {group}\n" + "\n".join(f"  {u}" for u in usages))
    parts.append("Type help 'command' for details and examples. Strings take 'single' or \"double\" quotes.")
    return "\n\n".join(parts), None


@command("exit", "Leave the shell (Ctrl-D does too).", "exit", group="general")
def exit_(shell: Shell) -> Result:
    shell.done = True
    return "", None


COMMANDS["quit"] = Command("quit", exit_, "quit", "Leave the shell.", ("quit",), "general")
