"""How a command is declared once for both front ends.

A :class:`Command` names its parameters (:class:`Param`) and runs against a
:class:`Session` (an admin handle, and queue handles made from it). The
CLI (``hqueue/cli/``) turns each one into a click command, the shell
(``hqueue/shell/``) into a shell command, by the same rules:

* a required parameter is positional in both, in the declared order; the
  queue is always the first;
* an optional parameter is an option in the CLI (``--max-retries``) and, in
  the shell, either the next positional argument or a key of a trailing
  dictionary (``{MAX_RETRIES => 3}``), as the HBase shell writes options;
* names are the same, with ``-`` in the CLI where the shell has ``_``;
  the CLI accepts either spelling of a command's name (its options are
  spelled with ``-`` only), and the old names stay as aliases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import HQueueError, InvalidArgument
from ..ids import wall_clock_ms
from ..message import LATEST_MS, MessageID

if TYPE_CHECKING:
    from ..admin import HQueueAdmin
    from ..queue import HQueue

#: A parameter with no default: positional, and required.
REQUIRED: Any = object()

#: Parameter kinds: what the value is, and how each front end reads it.
KINDS = ("text", "int", "float", "time", "flag", "choice", "texts", "settings")


class Session(Protocol):
    """What a command runs against: the CLI's context and the shell both provide it."""

    @property
    def admin(self) -> HQueueAdmin: ...

    def queue(self, name: str) -> HQueue: ...


@dataclass(frozen=True)
class Param:
    """One parameter of a command.

    Attributes:
        name: The Python keyword; ``--name-with-dashes`` in the CLI,
            ``NAME_IN_CAPITALS`` as a shell option key.
        help: One line for both front ends' help.
        kind: One of :data:`KINDS`. ``time`` takes an ISO time, an ID
            (``millis:seq``) or epoch ms; ``texts`` is a repeatable option
            (a list in the shell); ``settings`` collects ``KEY=VALUE``
            (``--config`` in the CLI, unknown dictionary keys in the shell).
        default: :data:`REQUIRED` for a positional parameter.
        low, high: The range of an int or float (inclusive).
        choices: The values a ``choice`` may take.
        short: A one-letter CLI option (``-p``).
        many: A required positional that takes one value or more.
        positional: An optional parameter that stays positional in the CLI too.
    """

    name: str
    help: str
    kind: str = "text"
    default: Any = REQUIRED
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    short: str | None = None
    many: bool = False
    positional: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown parameter kind {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def key(self) -> str:
        """The shell's option key."""
        return self.name.upper()

    def convert(self, value: Any) -> Any:
        """A value as the command's code takes it; InvalidArgument names the parameter."""
        if self.kind == "time":
            return as_time(self.name, value)
        if self.kind in ("int", "float"):
            return self.in_range(value)
        if self.kind == "choice" and value not in self.choices:
            raise InvalidArgument(f"'{self.name}' must be one of {', '.join(self.choices)}, got {value!r}")
        return value

    def in_range(self, value: Any) -> Any:
        wanted = int if self.kind == "int" else (int, float)
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise InvalidArgument(
                f"'{self.name}' must be {'an integer' if self.kind == 'int' else 'a number'}, got {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"'{self.name}' must be a finite number, got {value!r}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise InvalidArgument(f"'{self.name}' must be in {describe_range(self.low, self.high)}, got {value!r}")
        return value


def describe_range(low: float | None, high: float | None) -> str:
    """``low..high``, exactly ('2147483647', not '2.14748e+09'; floats as short as they read)."""
    return f"{'-inf' if low is None else _bound(low)}..{'inf' if high is None else _bound(high)}"


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(value).removesuffix(".0")


def as_time(name: str, value: Any) -> MessageID:
    """A time ('2026-11-22 10:00', UTC unless it says otherwise), an ID ('ts:seq') or epoch ms,
    up to the end of the year 9999."""
    found = _as_time(name, value)
    if found.timestamp > LATEST_MS:
        raise InvalidArgument(f"'{name}': {found} is after the year 9999 (epoch ms up to {LATEST_MS})")
    return found


#: The earliest due time a command takes (2001-09-09): one before it is a mistake, seconds
#: given for milliseconds or a time of day ("10:00" reads as 10 ms, sequence 0).
EARLIEST_DUE_MS = 10**12


def as_due(name: str, value: Any) -> MessageID:
    """A timer's due time, as :func:`as_time` takes times, refusing what can only be a
    mistake: a sequence (a due time has none), or a time before :data:`EARLIEST_DUE_MS`
    other than 0 written as a number, which is now (at once)."""
    found = as_time(name, value)
    why = (
        "a due time has no sequence" if found.sequence
        else f"{found.timestamp} ms after 1970 is {found.datetime:%Y-%m-%d %H:%M:%S} UTC"
        if 0 < found.timestamp < EARLIEST_DUE_MS or (found.timestamp == 0 and not _is_zero(value)) else None
    )  # fmt: skip
    if why is not None:
        raise InvalidArgument(
            f"'{name}': {value!r}: {why}; give an ISO time (UTC unless it has an offset, as in "
            "2026-11-23T10:00+01:00) or epoch milliseconds (seconds x 1000), or a delay"
        )
    return MessageID(wall_clock_ms()) if found.timestamp == 0 else found  # 0: now (on a queue with a TTL too)


def _is_zero(value: Any) -> bool:
    """``value`` is 0 written as a number (now), not a time that comes to 0 (1970-01-01T00:00)."""
    return isinstance(value, MessageID) or (isinstance(value, str) and value.strip() == "0") or value == 0


#: The longest delay a command takes (ten years): the CLI's --delay, the shell's DELAY.
MAX_DELAY_SECONDS = 10 * 365 * 86400.0


def as_delay(name: str, value: Any) -> float:
    """A timer's delay in seconds, as every front end takes it: a number in
    0..:data:`MAX_DELAY_SECONDS` (the shell took any, past the year 9999 too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_DELAY_SECONDS:
        raise InvalidArgument(f"{name} must be a number of seconds in 0..{MAX_DELAY_SECONDS:.0f}, got {value!r}")
    return float(value)


def _as_time(name: str, value: Any) -> MessageID:
    if isinstance(value, MessageID):
        return value
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:  # MessageID checks the range itself
            return MessageID(value) if isinstance(value, int) else MessageID.parse(value)
        except ValueError as e:
            raise InvalidArgument(f"'{name}': {e}") from None
    raise InvalidArgument(f"'{name}': expected a time, an ID or epoch milliseconds, got {value!r}")


@dataclass
class Output:
    """What a command made: text for people, ``data`` for ``--format json``, and a row count."""

    text: str
    data: Any = None
    rows: int | None = None


class NotAllDone(HQueueError):
    """A command did part of what it was asked (cancel: some timers were not pending):
    the front end prints ``output``, then this error, and fails (exit status 1)."""

    def __init__(self, message: str, output: Output) -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Command:
    """One command, for both front ends.

    Attributes:
        name: The shell's name (``delete_queue``); the CLI's has ``-`` for ``_``.
        run: ``run(session, **params) -> Output``.
        help: The first line is the summary.
        params: In order; required ones first.
        examples: Shell lines (the CLI's follow by the naming rule).
        group: Where help lists it: general, queues, timers, subscribers, groups.
        aliases: Older names, still accepted by both front ends.
        cli_format: The CLI's default output (``text`` or ``json``).
        read_only: It changes nothing, so it never creates a store either.
    """

    name: str
    run: Callable[..., Output]
    help: str
    params: tuple[Param, ...] = ()
    examples: tuple[str, ...] = ()
    group: str = "queues"
    aliases: tuple[str, ...] = ()
    cli_format: str = "text"
    read_only: bool = False

    @property
    def cli_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def usage(self) -> str:
        """The shell's usage line: ``describe_group 'queue', 'group'[, {LIMIT => n}]``."""
        required = [p for p in self.params if p.required]
        optional = [p for p in self.params if not p.required]
        shown = [_shell_placeholder(p) for p in required]
        text = self.name + (" " + ", ".join(shown) if shown else "")
        leading = [p for p in optional if p.positional]
        for param in leading:
            text += f"[, {_shell_placeholder(param)}"
        text += "]" * len(leading)
        rest = [p for p in optional if not p.positional]
        if rest:
            text += f"[, {{{', '.join(_shell_option(p) for p in rest)}}}]"
        return text


def _shell_option(param: Param) -> str:
    if param.kind == "settings":
        return "'key' => 'value'"
    if param.default is None:
        shown = {"texts": "['t']", "time": "'time'", "int": "n", "float": "x"}.get(param.kind, "'…'")
    elif isinstance(param.default, bool):
        shown = str(param.default).lower()
    else:
        shown = repr(param.default)
    return f"{param.key} => {shown}"


def _shell_placeholder(param: Param) -> str:
    text = param.name if param.kind in ("int", "float") else f"'{param.name}'"
    return text + (", …" if param.many else "")


#: Every command both front ends have, by name.
COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    *params: Param,
    examples: tuple[str, ...] = (),
    group: str = "queues",
    aliases: tuple[str, ...] = (),
    cli_format: str = "text",
    read_only: bool = False,
) -> Callable[[Callable[..., Output]], Callable[..., Output]]:
    """Declare a command (a decorator on its ``run``)."""

    def register(run: Callable[..., Output]) -> Callable[..., Output]:
        seen_optional = False
        for param in params:
            if param.required and seen_optional:
                raise TypeError(f"{name}: required parameter {param.name!r} after an optional one")
            seen_optional = seen_optional or not param.required
        COMMANDS[name] = Command(name, run, help, params, examples, group, aliases, cli_format, read_only)
        return run

    return register


def find(name: str) -> Command | None:
    """A command by its name, its CLI name, or an alias."""
    wanted = name.replace("-", "_")
    if wanted in COMMANDS:
        return COMMANDS[wanted]
    for candidate in COMMANDS.values():
        if wanted in (a.replace("-", "_") for a in candidate.aliases):
            return candidate
    return None
