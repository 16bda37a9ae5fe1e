"""The ``hqueue`` group, and what its commands share: the store, errors, progress."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from .. import __version__
from ..admin import HQueueAdmin
from ..auth import split_credentials
from ..commands import as_due, as_time, find, unescape
from ..connection import MAKE_A_STORE, missing_store, store_exists
from ..errors import (
    HQueueError,
    InvalidArgument,
    InvalidMessage,
    LimitExceeded,
    NotAuthorized,
    QueueDisabled,
    QueueEnabled,
    StorageLocked,
)
from ..message import MessageID, topic_filter
from ..queue import HQueue
from ..storage.lockholder import command_words


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class Command(click.Command):
    """A command whose arguments may be negative numbers (``hqueue create neg -1``
    reaches the range check, instead of "No such option '-1'")."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if any(a.startswith("-") and _is_number(a) for a in args):
            args = self._numbers_as_arguments(args)
        return super().parse_args(ctx, args)

    def _numbers_as_arguments(self, args: list[str]) -> list[str]:
        """Options (with their values) first, then ``--``, then the arguments in their order."""
        takes_value = {
            opt
            for p in self.params
            if isinstance(p, click.Option) and not p.is_flag and not p.count
            for opt in p.opts + p.secondary_opts
        }
        options: list[str] = []
        arguments: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                arguments += args[i + 1 :]
                break
            if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
                options.append(arg)
                if arg in takes_value and i + 1 < len(args):  # its value, whatever it looks like
                    options.append(args[i + 1])
                    i += 1
            else:
                arguments.append(arg)
            i += 1
        return [*options, "--", *arguments]


def _urls(words: list[str]) -> list[str]:
    """The values of the ``--url`` options among ``words`` (the group's options)."""
    urls = [value for word, value in zip(words, words[1:], strict=False) if word == "--url"]
    return urls + [word.partition("=")[2] for word in words if word.startswith("--url=")]


class _Group(click.Group):
    """Turns hqueue's own errors into one readable line and exit status 1.

    A command may be named as the shell names it (``delete_queue``) or by an
    older name (``drop``). ``--url`` may also follow the command (``hqueue
    scan q --url …``): it is moved in front before parsing.
    """

    command_class = Command

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None:
            declared = find(cmd_name)
            if declared is not None:
                found = super().get_command(ctx, declared.cli_name)
            elif "_" in cmd_name:
                found = super().get_command(ctx, cmd_name.replace("_", "-"))
        return found

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = list(args)
        command_at = next((i for i, a in enumerate(args) if self.get_command(ctx, a) is not None), None)
        if command_at is not None:
            before, after = _urls(args[:command_at]), []
            i = command_at + 1
            while i < len(args):
                if args[i] == "--url" and i + 1 < len(args):
                    moved = args[i : i + 2]
                    del args[i : i + 2]
                    args[0:0] = moved
                    after.append(moved[1])
                    command_at += 2
                    i += 2
                elif args[i].startswith("--url="):
                    args.insert(0, args.pop(i))
                    after.append(args[0].partition("=")[2])
                    command_at += 1
                    i += 1
                elif args[i] == "--":
                    break
                else:
                    i += 1
            after = [url for url in after if url not in before]
            if before and after:  # (click kept the last it read: the one before the command, silently)
                raise click.UsageError(
                    f"--url given before the command and after it ({before[-1]!r}, {after[0]!r}): give one", ctx
                )
        ctx.meta["hqueue.args"] = args  # (the words the command's options were given in: _bad_option)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        given = ctx.meta.get("hqueue.args", [])
        try:
            return super().invoke(ctx)
        except (HQueueError, ValueError, TypeError) as e:
            bad = self._bad_option(ctx, e, given)
            if bad is not None:
                raise bad from e
            url = (ctx.obj or {}).get("url")
            said = _with_cli_hint(e, ctx.invoked_subcommand, url)
            if isinstance(e, InvalidArgument) and not isinstance(e, (InvalidMessage, LimitExceeded)):
                raise ValueRefused(said) from e
            raise click.ClickException(said) from e

    def _bad_option(self, ctx: click.Context, e: Exception, given: list[str]) -> click.UsageError | None:
        """A refusal of what options on the command line gave ("'partition_id' must be in
        0..3 …", "give 'partition_id' or 'key', not both"), as click's own (exit status 2),
        naming the options (``--partition``), not the API's parameters."""
        command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
        if command is None or not isinstance(e, (InvalidArgument, TypeError)):
            return None

        def option(api_name: str) -> click.Option | None:
            names = (api_name, _CLI_OPTION.get(api_name, api_name))  # (put's --at is deliver_at)
            found = next((p for p in command.params if p.name in names), None)
            if not isinstance(found, click.Option) or not any(_gives(arg, found.opts) for arg in given):
                return None  # (a value it did not give: --config's, say)
            return found

        said = _API_REFUSAL.match(str(e))
        if said is not None:
            refused = option(said[1])
            return None if refused is None else click.BadParameter(said[2], param=refused)
        either = _EITHER.fullmatch(str(e))
        named = [option(either[1]), option(either[2])] if either is not None else [None]
        if None in named:
            return None
        first, second = (max(o.opts, key=len) for o in named if o is not None)
        return click.UsageError(f"give {first} or {second}, not both")


class ValueRefused(click.ClickException):
    """A value given (an argument, an option, the URL) that hqueue refuses: one line, exit
    status 2, as click's own usage errors. A message refused (data, not usage) stays 1."""

    exit_code = 2


def _gives(arg: str, opts: list[str]) -> bool:
    """Whether command-line word ``arg`` gives one of the option's ``opts`` (``-p 3``,
    ``--partition=3``, ``-p3``)."""
    return any(arg == o or arg.startswith(o + "=") or (len(o) == 2 and arg.startswith(o)) for o in opts)


#: "'<API parameter>' must …": a library refusal of one argument.
_API_REFUSAL = re.compile(r"'(\w+)' (must .*)", re.S)
#: "give 'a' or 'b', not both": a library refusal of two arguments together.
_EITHER = re.compile(r"give '(\w+)' or '(\w+)', not both")
#: The API's parameter names that the commands' options name otherwise.
_CLI_OPTION = {"partition_id": "partition", "deliver_at": "at", "max_messages": "max"}


def _with_cli_hint(e: Exception, command: str | None = None, url: str | None = None) -> str:
    """The error's text, with the command to run where the library names a Python call."""
    if isinstance(e, StorageLocked):
        return _locked_hint(e, command)
    if isinstance(e, QueueDisabled):
        return f"queue {e.name!r} is disabled (enable it: hqueue enable-queue {e.name})"
    if isinstance(e, QueueEnabled):
        return f"queue {e.name!r} is enabled: disable it first (hqueue disable-queue {e.name}), or pass --force"
    if isinstance(e, NotAuthorized) and not (url or "").startswith("local://"):  # (a store's socket: no tokens)
        return _token_hint(e, url)
    return str(e)


def _token_hint(e: NotAuthorized, url: str | None) -> str:
    """A refusal, with what to do about the token: give one, or check the one given."""
    given = split_credentials(url or "")[1] or os.environ.get("HQUEUE_TOKEN")
    if not given:
        return f"{e} (give a token: set $HQUEUE_TOKEN; --url hqueue://TOKEN@host:port shows it to every local user)"
    if "may not" in str(e) or "no role" in str(e):
        return f"{e} (the token was accepted; its roles are in the server's --auth-file)"
    return f"{e} (check the token given in --url or $HQUEUE_TOKEN)"


def _locked_hint(e: StorageLocked, command: str | None) -> str:
    """The store is held by a process that does not share it: what to do, in CLI terms
    (one line; the holder's address when it is an ``hqueue server`` whose port its command names)."""
    by = f" ({e.holder})" if e.holder else ""
    text = f"the embedded store {e.path} is open in another process{by}"
    if command == "server":
        return text + ": stop that process first (hqueue server opens an embedded store alone)"
    served = _served_at(e.holder)
    if served:
        return (
            f"{text} that does not share it with local processes: it serves {served}; give every "
            f"command --url {served} (or set HQUEUE_URL), or stop it"
        )
    return (
        f"{text} that does not share it with local processes: if it is hqueue server --storage "
        f"local://{e.path} --no-local-socket, give every command --url hqueue://HOST:PORT, its "
        "address (or set HQUEUE_URL); if the store's hqueue.sock was removed under it, restart it; else stop it"
    )


def _served_at(holder: str | None) -> str | None:
    """The hqueue:// address of a holder that is ``hqueue server`` with a fixed port (its
    ``--host``, ``--port``, or their defaults), read from its command line; None otherwise."""
    words = _holder_words(holder)
    commands = [w for i, w in enumerate(words[1:], 1) if not w.startswith("-") and words[i - 1] != "--url"]
    if words[:1] != ["hqueue"] or commands[:1] != ["server"]:  # (not `hqueue tail server`: a queue)
        return None
    given = {}
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name in ("--host", "--port"):
            given[name] = value if equals else (words[index + 1] if index + 1 < len(words) else "")
    if words[-1:] and words[-1].endswith("…") and not {"--host", "--port"} <= given.keys():
        return None  # (its command line was cut short: a --host or --port may be past the cut)
    host, port = given.get("--host", "127.0.0.1"), given.get("--port", "9700")
    if not port.isdigit() or int(port) == 0:  # (0: a port picked at start, not on its command line)
        return None
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"hqueue://{host}:{port}"


def _holder_words(holder: str | None) -> list[str]:
    """The holder's command line as words, ``hqueue`` first: whole from /proc where the process
    is still there (the text shown is cut at 120 characters), else as shown."""
    pid, _, shown = (holder or "").partition(": ")
    whole = command_words(int(pid[4:])) if pid.startswith("pid ") and pid[4:].isdigit() else []
    return whole or shown.split()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="hqueue")
@click.option(
    "--url",
    envvar="HQUEUE_URL",
    help="Store: local:///path (default ./hqueue-data or $HQUEUE_DATA), hbase://host:9090, "
    "or hqueue://[TOKEN@]host:9700 servers. May also follow the command.",
)
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """hqueue: a partitioned, persistent message queue.

    \b
    Tab completion, in ~/.bashrc (zsh: zsh_source, in ~/.zshrc):
      eval "$(_HQUEUE_COMPLETE=bash_source hqueue)"
    """
    check_url(url, "--url")
    ctx.obj = {"url": url}


def check_url(url: str | None, option: str) -> None:
    """A usage error unless ``url`` (given as ``option``) is None or a store URL with a known scheme."""
    if url is not None and "://" not in url:
        where = os.path.abspath(url) if url else "/path"
        raise click.BadParameter(
            f"{url!r} has no scheme: for a store in a directory use {option} local://{where}; "
            f"for servers, {option} hqueue://host:port",
            param_hint=f"'{option}'",
        )
    scheme = None if url is None else url.partition("://")[0]
    if scheme is not None and scheme not in ("local", "memory", "hbase", "hqueue"):
        raise click.BadParameter(
            f"unknown scheme {scheme!r} in {url!r}: use local:///path, hqueue://host:port, hbase://host:port "
            "or memory://name",
            param_hint=f"'{option}'",
        )


class Session:
    """What a shared command runs against (``hqueue.commands.Session``): the
    store of ``--url``, opened on first use and closed with the command."""

    def __init__(self, ctx: click.Context, read_only: bool = False) -> None:
        self.ctx, self.read_only = ctx, read_only
        self._admin: HQueueAdmin | None = None

    @property
    def admin(self) -> HQueueAdmin:
        if self._admin is None:
            self._admin = open_admin(self.ctx, self.read_only)
        return self._admin

    def queue(self, name: str) -> HQueue:
        return self.ctx.with_resource(self.admin.queue(name))


def open_admin(ctx: click.Context, read_only: bool = False) -> HQueueAdmin:
    if read_only or ctx.info_name not in MAKE_A_STORE:
        store_must_exist(ctx.obj["url"])
    return ctx.with_resource(HQueueAdmin(ctx.obj["url"]))


def open_queue(ctx: click.Context, name: str, read_only: bool = False) -> HQueue:
    if read_only or ctx.info_name not in MAKE_A_STORE:
        store_must_exist(ctx.obj["url"])
    return ctx.with_resource(HQueue(name, ctx.obj["url"]))


def store_must_exist(url: str | None) -> None:
    """A command that needs a queue never creates an embedded store where none is."""
    if not store_exists(url):
        raise click.ClickException(missing_store(url))


class Progress:
    """Counts on stderr, every 2 s, when stderr is a terminal."""

    def __init__(self, what: str) -> None:
        self.what, self.count = what, 0
        self.shown = time.monotonic()
        self.live = sys.stderr.isatty()

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.live and time.monotonic() - self.shown >= 2.0:
            self.shown = time.monotonic()
            click.echo(f"\r{self.count:,} {self.what}…", err=True, nl=False)

    def done(self) -> None:
        if self.live and self.count:
            click.echo("\r" + " " * 40 + "\r", err=True, nl=False)


class Seconds(click.FloatRange):
    """A float in a range, and never nan (which no range check catches)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


def _time_callback(read: Callable[[str, Any], MessageID]) -> Callable[[Any, Any, str | None], MessageID | None]:
    def callback(ctx: Any, param: Any, value: str | None) -> MessageID | None:
        if value is None:
            return None
        try:
            return read(param.name, value)
        except InvalidArgument as e:
            raise click.BadParameter(str(e).replace(f"'{param.name}': ", "")) from None

    return callback


#: A click callback: an ID, an ISO time or epoch ms, up to the year 9999 (as the shared
#: commands take times: :func:`~hqueue.commands.as_time`).
message_id = _time_callback(as_time)
#: A click callback: a timer's due time (:func:`~hqueue.commands.as_due`).
due_time = _time_callback(as_due)


def topic_bytes(ctx: Any, param: Any, value: tuple[str, ...]) -> tuple[bytes, ...]:
    """A click callback: topics as the bytes given, even when they are not UTF-8, read as
    ``scan`` prints them (``\\xff`` is the byte 0xff, ``\\\\`` a backslash: commands.unescape),
    as the shell and the console read them. An empty one, or one longer than any stored, is a
    usage error (status 2; the long one was status 1)."""
    if any(not topic for topic in value):
        raise click.BadParameter("a topic must not be empty", ctx=ctx, param=param)
    topics = tuple(unescape(os.fsencode(topic)) for topic in value)
    for topic in topics:
        try:
            topic_filter(topic)
        except InvalidMessage as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return topics
