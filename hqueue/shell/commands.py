"""The shell's commands: the shared table's (``hqueue/commands/``), and the shell's own.

The shared commands follow the table's rules: required arguments in
order, the queue first; then optional ones, positionally or as a trailing
``{KEY => value}`` dictionary. ``put``, ``scan`` and ``count`` (the data
commands, which the CLI has in its own shape) and ``help``/``exit`` are
the shell's own. Every command is a function ``(shell, *args) -> (text,
rows)``; its arguments are checked before it runs, so a mistake is one
ERROR line that shows the usage.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from ..commands import COMMANDS as SHARED
from ..commands import Command as SharedCommand
from ..commands import Param, as_delay, as_due, as_time, stamp, table
from ..commands.queues import LOCAL_TIMERS_NOTE
from ..commands.render import printable
from ..errors import HQueueError, InvalidArgument
from ..message import Message, MessageID

if TYPE_CHECKING:
    from ..admin import HQueueAdmin
    from ..queue import HQueue


class Shell(Protocol):
    """What a command needs of the shell running it (repl.py's Shell)."""

    done: bool
    timers_noted: bool
    err: TextIO

    @property
    def admin(self) -> HQueueAdmin: ...

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
class Command:
    """A shell command: its usage line, help, examples, and how to run it."""

    name: str
    run: Callable[[Shell, list[Any]], Result]
    usage: str
    help: str
    examples: tuple[str, ...]
    group: str
    read_only: bool = False

    def __call__(self, shell: Shell, args: list[Any]) -> Result:
        return self.run(shell, args)


COMMANDS: dict[str, Command] = {}
#: Other names of commands (older ones, and HBase's short ones); help lists them.
ALIASES: dict[str, str] = {}


def to_bytes(text: str) -> bytes:
    """UTF-8, with \\xNN escapes as the raw bytes they name (see the parser)."""
    return text.encode("utf-8", "surrogateescape")


# -- the shared commands -------------------------------------------------------------------

_KINDS = {"text": "a quoted string", "int": "an integer", "float": "a number", "flag": "true or false",
          "choice": "a quoted string", "texts": "a list of quoted strings, as ['a', 'b']",
          "time": "a time, an ID or epoch milliseconds"}  # fmt: skip

#: Commands whose subscriber came first in HQueue's shell: the old order is still
#: read (with a note) when the first name is no queue and the second is one.
SUBSCRIBER_FIRST = {"delete_subscriber", "describe_subscriber", "set_checkpoint"}


def _check(command: SharedCommand, param: Param, value: Any, in_options: bool = False) -> Any:
    """A shell value for ``param``, converted; UsageError if it has the wrong type."""
    kind = param.kind
    quoted_number = isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,30}", value.strip())
    if kind == "int" and in_options and quoted_number:
        value = int(value)  # HBase writes settings as strings: {'MAX_MESSAGE_BYTES' => '1024'}
    ok = {
        "text": isinstance(value, str),
        "choice": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "flag": isinstance(value, bool),
        "time": isinstance(value, (str, int)) and not isinstance(value, bool),
        "texts": isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }.get(kind, True)
    if not ok:
        raise UsageError(f"{command.name}: {param.name} must be {_KINDS[kind]}, got {value!r}; usage: {command.usage}")
    if kind == "texts":
        return [to_bytes(v) for v in ([value] if isinstance(value, str) else value)]
    try:
        return param.convert(value)
    except InvalidArgument as e:
        raise UsageError(f"{command.name}: {e}; usage: {command.usage}") from None


def bind(command: SharedCommand, args: list[Any]) -> dict[str, Any]:
    """The shell's arguments as the command's keywords (positional, then a trailing dictionary)."""
    params = list(command.params)
    takes_options = bool(params) and not params[-1].required
    options = args.pop() if takes_options and args and isinstance(args[-1], dict) else None
    values: dict[str, Any] = {}
    required = [p for p in params if p.required]
    many = next((p for p in required if p.many), None)
    low = len(required)
    positional = [p for p in params if p.kind != "settings"]
    high = None if many else len(positional)
    if len(args) < low or (high is not None and len(args) > high):
        expected = low if low == high else f"{low} or more" if high is None else f"{low} to {high}"
        raise UsageError(f"{command.name} takes {expected} argument(s), got {len(args)}; usage: {command.usage}")
    position = 0
    for param in positional:
        if position >= len(args):
            break
        if param.many:
            values[param.name] = [_check(command, param, v) for v in args[position:]]
            position = len(args)
        else:
            values[param.name] = _check(command, param, args[position])
            position += 1
    settings = next((p for p in params if p.kind == "settings"), None)
    for key, value in (options or {}).items():
        named = next((p for p in params if not p.required and p.key == str(key).upper()), None)
        if named is not None and named.kind != "settings":
            if named.name in values:
                raise UsageError(f"{command.name}: {named.key} is given twice; usage: {command.usage}")
            values[named.name] = _check(command, named, value, in_options=True)
        elif settings is not None:
            if isinstance(value, (list, dict)):  # (it was stored as its Python text: "['a', {'b': 1}]")
                raise UsageError(f"{command.name}: setting {key!r} takes a string or a number, got {value!r}")
            values.setdefault(settings.name, {})[str(key)] = "" if value is None else str(value)
        else:
            known = ", ".join(p.key for p in params if not p.required)
            raise UsageError(f"{command.name}: unknown option {key!r}; known: {known}")
    for param in params:
        values.setdefault(param.name, param.default)
    return values


def _is_queue(admin: HQueueAdmin, name: str) -> bool:
    """Whether ``name`` is a queue this connection may see (a refused look is a no)."""
    try:
        return admin.queue_exists(name)
    except HQueueError:
        return False


def _shared(command: SharedCommand) -> Callable[[Shell, list[Any]], Result]:
    def run(shell: Shell, args: list[Any]) -> Result:
        args, note = list(args), ""
        if command.name in SUBSCRIBER_FIRST and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
            admin = shell.admin
            if not _is_queue(admin, args[0]) and _is_queue(admin, args[1]):
                args[0], args[1] = args[1], args[0]
                note = f"note: {command.name} takes the queue first now: {command.name} {args[0]!r}, {args[1]!r}\n"
        output = command.run(shell, **bind(command, args))
        return note + output.text, output.rows

    return run


for _command in SHARED.values():
    COMMANDS[_command.name] = Command(
        _command.name, _shared(_command), _command.usage, _command.help, _command.examples, _command.group,
        _command.read_only,
    )  # fmt: skip
    for _alias in _command.aliases:
        ALIASES[_alias.replace("-", "_")] = _command.name


# -- the shell's own: put, scan, count, help, exit ---------------------------------------------


def own(
    usage: str,
    help: str,
    *examples: str,
    arity: tuple[int, int] = (0, 0),
    group: str = "queues",
    read_only: bool = False,
):
    """Declare a shell-only command; ``arity`` is (fewest, most) arguments."""

    def register(function: Callable[..., Result]) -> Callable[..., Result]:
        name = usage.split()[0]

        def run(shell: Shell, args: list[Any]) -> Result:
            low, high = arity
            if not low <= len(args) <= high:
                expected = low if low == high else f"{low} to {high}"
                raise UsageError(f"{name} takes {expected} argument(s), got {len(args)}; usage: {usage}")
            return function(shell, *args)

        COMMANDS[name] = Command(name, run, usage, help, examples, group, read_only)
        return function

    return register


def _text(command: str, what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{command}: {what} must be a quoted string, got {value!r}")
    return value


def _options(command: str, given: Any, known: set[str], ints: tuple[str, ...] = ()) -> dict[str, Any]:
    """A trailing ``{KEY => value}`` dictionary's options, keys upper-cased: unknown ones, and
    ``ints`` that are not integers, are usage errors."""
    if given is not None and not isinstance(given, dict):
        raise UsageError(f"{command}: the options must be a {{KEY => value}} dictionary, got {given!r}")
    options = {str(k).upper(): v for k, v in (given or {}).items()}
    if len(options) < len(given or {}):  # ('partition' and 'PARTITION': the last one won, unsaid)
        counts = Counter(str(k).upper() for k in given or {})
        twice = ", ".join(printable(k) for k, n in sorted(counts.items()) if n > 1)
        raise UsageError(f"{command}: an option given twice (keys are not case-sensitive): {twice}")
    unknown = set(options) - known
    empty = sorted(k for k, v in options.items() if v is None and k in known)
    if empty:  # (DELAY => nil put a message now, unsaid, where a timer was meant: a helper's pass)
        raise UsageError(f"{command}: {empty[0]} => nil: give it a value, or leave it out")
    if unknown:  # (escaped: a key's control characters reached the terminal)
        raise UsageError(
            f"{command}: unknown option(s) {', '.join(map(printable, sorted(unknown)))}; "
            f"known: {', '.join(sorted(known))}"
        )
    for option in ints:
        if option in options and (not isinstance(options[option], int) or isinstance(options[option], bool)):
            raise UsageError(f"{command}: {option} must be an integer, got {options[option]!r}")
    return options


def _time(command: str, option: str, value: Any, read: Callable[[str, Any], MessageID] = as_time) -> MessageID | None:
    """An option's time (None: not given), as ``read`` takes it; a bad one is a usage error naming the option."""
    if value is None:
        return None
    try:
        return read(option, value)
    except InvalidArgument as e:
        raise UsageError(f"{command}: {e}") from None


PUT_OPTIONS = {"PARTITION", "KEY", "PRIORITY", "DELAY", "AT"}


@own(
    "put 'queue', 'topic', 'value'[, partition | {PARTITION => p, KEY => 'k', PRIORITY => n, DELAY => s, "
    "AT => 'time'}]",
    "Put one message (to a random partition unless one is given, or by KEY) and print its ID; "
    "with DELAY (seconds) or AT (a time) it is a timer: print its handle, for cancel.",
    "put 'q1', 'crawler', 'http://example.com'",
    "put 'q1', 'crawler', 'http://example.com/\\x00', 3",
    "put 'q1', 'crawler', 'http://example.com', {KEY => 'example.com', DELAY => 60}",
    arity=(3, 4),
)
def put(shell: Shell, name: Any, topic: Any, value: Any, given: Any = None) -> Result:
    name, topic, value = (
        _text("put", w, v) for w, v in (("the queue", name), ("the topic", topic), ("the value", value))
    )
    given = {"PARTITION": given} if given is not None and not isinstance(given, dict) else given
    options = _options("put", given, PUT_OPTIONS, ints=("PARTITION", "PRIORITY"))
    key, delay, at = options.get("KEY"), options.get("DELAY"), options.get("AT")
    if key is not None:
        key = to_bytes(_text("put", "KEY", key))  # (\xNN escapes: the bytes they name, as in topics and values)
    if delay is not None:
        try:
            delay = as_delay("DELAY", delay)
        except InvalidArgument as e:
            raise UsageError(f"put: {e}") from None
    if delay is not None and at is not None:
        raise UsageError("put: give AT or DELAY, not both")
    when = _time("put", "AT", at, as_due)
    due = None if when is None else when.timestamp
    (written,) = shell.queue(name).put(
        Message(to_bytes(topic), to_bytes(value)), options.get("PARTITION"),
        key=key, priority=options.get("PRIORITY"), delay=delay, deliver_at=due,
    )  # fmt: skip
    if isinstance(written, MessageID):
        return f"Put {written} ({stamp(written)})", None
    if not shell.timers_noted and shell.queue(name).engine.url.startswith("local://"):
        shell.timers_noted = True  # (once a session)
        print(f"note: {LOCAL_TIMERS_NOTE}", file=shell.err)
    return f"Timer {written} (due {stamp(MessageID(written.due))}; cancel '{name}', '{written}')", None


SCAN_OPTIONS = {"LIMIT", "TOPICS", "STARTTIME", "STOPTIME", "STARTID", "STOPID", "PARTITION"}


@own(
    "scan 'queue'[, {LIMIT => n, TOPICS => ['t'], STARTTIME => 'time', STOPTIME => 'time', PARTITION => p}]",
    "Print messages in ID order. Times are 'YYYY-MM-DD HH:MM[:SS]' in UTC unless they carry "
    "an offset; STARTID/STOPID take 'millis:sequence'. Start is inclusive, stop exclusive.",
    "scan 'q1', {LIMIT => 10}",
    "scan 'q1', {LIMIT => 10, TOPICS => ['t1'], STARTTIME => '2026-11-22 10:00', PARTITION => 3}",
    arity=(1, 2),
    read_only=True,
)
def scan(shell: Shell, name: Any, given: Any = None) -> Result:
    name = _text("scan", "the queue", name)
    options = _options("scan", given, SCAN_OPTIONS, ints=("LIMIT", "PARTITION"))
    return Streamed(_scan_chunks(_read(shell, "scan", name, options, limit=options.get("LIMIT")))), None


def _read(shell: Shell, command: str, name: str, options: dict, limit: int | None = None) -> Iterator[Message]:
    """The messages of ``scan``'s and ``count``'s options (TOPICS, the edges, PARTITION)."""
    topics = options.get("TOPICS")
    if topics is not None and not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
        raise UsageError(f"{command}: TOPICS must be a list of quoted strings, as ['t1', 't2']")
    for edge in ("START", "STOP"):
        if f"{edge}ID" in options and f"{edge}TIME" in options:  # (the ID won, silently)
            raise UsageError(f"{command}: give {edge}ID or {edge}TIME, not both")
    first, last = (
        _time(command, key, options.get(key))
        for edge in ("START", "STOP")
        for key in (f"{edge}ID" if f"{edge}ID" in options else f"{edge}TIME",)
    )
    return shell.queue(name).scan(
        first, last, [to_bytes(t) for t in topics] if topics else None,
        partition_id=options.get("PARTITION"), limit=limit,
    )  # fmt: skip


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


@own(
    "count 'queue'[, {TOPICS => ['t'], STARTTIME => 'time', STOPTIME => 'time', PARTITION => p}]",
    "Count the messages (reads them all); the options are scan's.",
    "count 'q1'",
    "count 'q1', {TOPICS => ['t1'], PARTITION => 3}",
    arity=(1, 2),
    read_only=True,
)
def count(shell: Shell, name: Any, given: Any = None) -> Result:
    name = _text("count", "the queue", name)
    options = _options("count", given, SCAN_OPTIONS - {"LIMIT"}, ints=("PARTITION",))
    total = sum(1 for _ in _read(shell, "count", name, options))
    return str(total), total


#: The order help lists the groups in.
GROUPS = ("general", "queues", "timers", "subscribers", "groups")


@own(
    "help ['command']", "List the commands, or show one command's usage and examples.", "help", "help 'scan'",
    arity=(0, 1), group="general",
)  # fmt: skip
def help_(shell: Shell, name: Any = None) -> Result:
    if name is not None:
        if not isinstance(name, str) or (name not in COMMANDS and name not in ALIASES):
            raise UsageError(f"no command {name!r}; type help for the list")
        c = COMMANDS[ALIASES.get(name, name)]
        return f"{c.usage}\n\n  {c.help}\n\nExamples:\n" + "\n".join(f"  {e}" for e in c.examples), None
    parts = []
    aliases: dict[str, list[str]] = {}
    for alias, target in ALIASES.items():
        aliases.setdefault(target, []).append(alias)
    for group in GROUPS:
        usages = [
            c.usage + (f"   (or {', '.join(aliases[c.name])})" if c.name in aliases else "")
            for c in COMMANDS.values()
            if c.group == group
        ]
        parts.append(f"Group: {group}\n" + "\n".join(f"  {u}" for u in usages))
    parts.append("Type help 'command' for details and examples. Strings take 'single' or \"double\" quotes.")
    return "\n\n".join(parts), None


@own("exit", "Leave the shell (Ctrl-D does too).", "exit", group="general")
def exit_(shell: Shell) -> Result:
    shell.done = True
    return "", None


ALIASES["quit"] = "exit"
ALIASES["desc"] = "describe"
