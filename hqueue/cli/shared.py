"""The CLI's half of the shared commands: a click command for each one in ``hqueue.commands``.

Required parameters are arguments, the others options; names have ``-``
where the shell has ``_``. Every one takes ``--format text|json``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..commands import COMMANDS, Command, NotAllDone, Output, Param, json_ready, unescape
from ..errors import InvalidArgument
from .main import Command as CliCommand
from .main import Seconds, Session, main

#: Older option spellings still read: {command: {option: parameter}}.
LEGACY_OPTIONS = {"replay_group": {"--from": "time"}}


def _type(param: Param) -> Any:
    if param.kind == "int":
        return click.IntRange(
            None if param.low is None else int(param.low), None if param.high is None else int(param.high)
        )
    if param.kind == "float":
        return Seconds(param.low, param.high)
    if param.kind == "choice":
        return click.Choice(param.choices)
    return str


def _settings(items: tuple[str, ...]) -> dict[str, str] | None:
    if not items:
        return None
    if not all("=" in item for item in items):
        raise click.BadParameter("use KEY=VALUE", param_hint="--config")
    pairs = [item.split("=", 1) for item in items]
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:  # (the last one won, silently; the shell refuses a key given twice too)
        raise click.BadParameter(f"{', '.join(twice)} given more than once", param_hint="--config")
    return dict(pairs)


def _click_params(command: Command) -> list[click.Parameter]:
    legacy = LEGACY_OPTIONS.get(command.name, {})
    params: list[click.Parameter] = []
    for p in command.params:
        if p.required or p.positional:
            required = p.required and p.name not in legacy.values()
            nargs = -1 if p.many else 1
            # No default at all for a required one (click 8.5 takes default=None as given).
            default = {} if p.required or p.many else {"default": p.default}
            # (required, though click is told not, for its older option spelling: shown so)
            shown = {"metavar": p.name.upper()} if p.required and not required else {}
            params.append(click.Argument([p.name], type=_type(p), nargs=nargs, required=required, **default, **shown))
        elif p.kind == "flag":
            params.append(click.Option([f"--{p.name.replace('_', '-')}"], is_flag=True, default=p.default, help=p.help))
        else:
            option = "--config" if p.kind == "settings" else f"--{p.name.replace('_', '-')}"
            decls = [option, p.name] + ([p.short] if p.short else [])
            many = p.kind in ("texts", "settings")
            params.append(
                click.Option(
                    decls, type=_type(p), multiple=many, default=None if many else p.default,
                    show_default=p.default is not None and not many, help=p.help,
                    metavar="KEY=VALUE" if p.kind == "settings" else None,
                )
            )  # fmt: skip
    for option, target in legacy.items():
        params.append(click.Option([option, f"legacy_{target}"], hidden=True))
    params.append(
        click.Option(
            ["--format", "output_format"], type=click.Choice(["text", "table", "json"]), default=command.cli_format,
            show_default=True, help="text (or table): for people; json: for scripts.",
        )
    )  # fmt: skip
    return params


def _values(command: Command, given: dict[str, Any]) -> dict[str, Any]:
    """Click's values as the command's keywords, converted as the shell converts them."""
    for target in LEGACY_OPTIONS.get(command.name, {}).values():
        legacy = given.pop(f"legacy_{target}", None)
        if given.get(target) is None:
            if legacy is None:
                raise click.UsageError(f"Missing argument '{target.upper()}'.")
            given[target] = legacy
    values = {}
    for p in command.params:
        value = given.get(p.name)
        if p.kind == "settings":
            value = _settings(value or ())
        elif p.kind == "texts":  # (topics: read as --topic reads them, main.topic_bytes)
            value = [unescape(os.fsencode(v)) for v in value] if value else None
        elif p.many:
            value = list(value or ())
        elif value is not None and p.kind == "time":
            try:
                value = p.convert(value)
            except InvalidArgument as e:
                raise click.BadParameter(str(e), param_hint=p.name.upper() if p.required else f"--{p.name}") from None
        values[p.name] = value if value is not None or p.kind == "flag" else p.default
    return values


def _show(output: Output, output_format: str) -> None:
    if output_format == "json":
        click.echo(json.dumps(json_ready(output.data), indent=2))
    elif output.text:
        click.echo(output.text)


def _click_command(command: Command) -> click.Command:
    def callback(output_format: str, **given: Any) -> None:
        ctx = click.get_current_context()
        try:
            output = command.run(Session(ctx, command.read_only), **_values(command, given))
        except NotAllDone as e:
            _show(e.output, output_format)
            raise click.ClickException(str(e)) from None
        _show(output, output_format)

    help_text = command.help + "\n\nIn the shell: " + command.usage
    return CliCommand(
        command.cli_name, callback=callback, params=_click_params(command), help=help_text
    )  # fmt: skip


for _command in COMMANDS.values():
    main.add_command(_click_command(_command))
