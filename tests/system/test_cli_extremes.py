"""Every CLI option and argument, fed extreme values, gives a one-line error or works: never a traceback."""

import os

import click
import pytest
from click.testing import CliRunner

from hqueue.cli import main

#: What a careless or hostile user types.
EXTREMES = ["inf", "-inf", "nan", "1e308", "-1", "0", "", "1" * 30, "x" * 300, os.fsdecode(b"v\xfe"), "2026-13-45"]
#: Commands that run a process (or wait for input) rather than answer.
SKIP = {"server", "shell", "console"}
#: Make the following commands stop at once.
STOP = {"tail": ["--for", "0"], "consume": ["--for", "0"], "put": []}


#: The commands, each a test of its own (so that several workers share them).
COMMANDS = [name for name in sorted(main.commands) if name not in SKIP]


def _cases(name: str):
    for param in main.commands[name].params:
        if isinstance(param, click.Option) and (param.is_flag or param.name in ("help",)):
            continue
        for value in EXTREMES:
            yield param, value


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("extremes")
    runner = CliRunner()
    assert runner.invoke(main, ["--url", f"local://{path}", "create", "q", "2"]).exit_code == 0
    assert runner.invoke(main, ["--url", f"local://{path}", "put", "q", "t", "v"]).exit_code == 0
    return f"local://{path}"


def _arguments(command: click.Command, param: click.Parameter, value: str) -> list[str]:
    """The command with ``param`` set to ``value`` and plausible values elsewhere."""
    plausible = {"queue": "q", "name": "q", "partitions": "1", "group": "g", "subscriber": "s", "topic": "t",
                 "time": "0", "timers": "0/1/1:0", "values": "v"}  # fmt: skip
    args: list[str] = []
    for p in command.params:
        if isinstance(p, click.Argument):
            args.append(value if p is param else plausible.get(p.name, "x"))
    if isinstance(param, click.Option):
        args += [param.opts[0], value]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_no_option_or_argument_value_makes_a_traceback(store, name):
    runner = CliRunner()
    failures = []
    command = main.commands[name]
    for param, value in _cases(name):
        args = [name, *_arguments(command, param, value), *STOP.get(name, [])]
        if name == "demo":
            args = [name, "--messages", value] if param.name == "messages" else [name, "--messages", "1"]
        result = runner.invoke(main, ["--url", store, *args], input="")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            failures.append(f"hqueue {' '.join(args)!r}: {type(result.exception).__name__}: {result.exception}")
        elif "Traceback" in result.output or result.exit_code not in (0, 1, 2):
            failures.append(f"hqueue {' '.join(args)!r}: exit {result.exit_code}: {result.output[-200:]}")
        else:
            assert result.output.count("Error:") <= 1
    assert failures == []


def test_control_bytes_are_escaped_the_same_in_a_pipe(tmp_path):
    runner = CliRunner()  # its output is not a terminal: a pipe, as `hqueue scan q | less`
    url = ["--url", f"local://{tmp_path}"]
    runner.invoke(main, [*url, "create", "q", "1"])
    assert runner.invoke(main, [*url, "put", "q", "t", "a\x1b[31mRED\x07\x00z\\"]).exit_code == 0
    (line,) = runner.invoke(main, [*url, "scan", "q"]).output.splitlines()
    assert line.split("\t")[3] == "a\\x1b[31mRED\\x07\\x00z\\\\"  # every control byte, never raw, never dropped


def test_arguments_that_are_not_utf8_are_stored_as_given(tmp_path):
    runner = CliRunner()
    url = ["--url", f"local://{tmp_path}"]
    runner.invoke(main, [*url, "create", "bin", "1"])
    topic, value = os.fsdecode(b"t\xfe"), os.fsdecode(b"v\xfe")  # as a POSIX shell hands them over
    assert runner.invoke(main, [*url, "put", "bin", topic, value]).exit_code == 0
    out = runner.invoke(main, [*url, "scan", "bin", "--format", "hex"]).output.split("\t")
    assert out[2] == "t\\xfe" and out[3].strip() == b"v\xfe".hex()


@pytest.mark.parametrize("command", [["scan", "bin"], ["count", "bin"], ["tail", "bin", "--start", "0", "--for", "0.3"],
                                     ["consume", "bin", "g", "--max", "1", "--for", "1"]])  # fmt: skip
def test_a_topic_that_is_not_utf8_chooses_messages_as_given(tmp_path, command):
    runner = CliRunner()
    url = ["--url", f"local://{tmp_path}"]
    runner.invoke(main, [*url, "create", "bin", "1"])
    topic = os.fsdecode(b"t\xfe")
    assert runner.invoke(main, [*url, "put", "bin", topic, "a", "--at", "0"]).exit_code == 0
    assert runner.invoke(main, [*url, "put", "bin", "t", "b", "--at", "0"]).exit_code == 0
    result = runner.invoke(main, [*url, *command, "--topic", topic])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 0, result.output
    assert ("1" if command[0] == "count" else "t\\xfe\ta") in result.output and "\tb" not in result.output


@pytest.mark.parametrize(
    "url", ["hqueue://127.0.0.1:99999", "hqueue://127.0.0.1:0", "hqueue://127.0.0.1:9?tls=1&ca=/nonexistent.pem",
            "hqueue://127.0.0.1:9?ca=/tmp", "hqueue://127.0.0.1:9?tls=1&ca=" + __file__]
)  # fmt: skip
def test_a_server_url_with_a_bad_port_or_ca_file_is_a_one_line_error(url):
    result = CliRunner().invoke(main, ["--url", url, "list"])
    assert not result.exception or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2 and result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert ("1..65535" if "ca=" not in url else "cannot load it") in result.output


SERVER = ["server", "--port", "0", "--storage"]


@pytest.mark.parametrize(
    ("args", "option"),
    [(["--url", "{d}", "list"], "--url"), ([*SERVER, "{d}"], "--storage"), ([*SERVER, "nope://x"], "--storage")],
)
def test_a_store_url_without_a_known_scheme_is_a_usage_error_naming_its_option(tmp_path, args, option):
    result = CliRunner().invoke(main, [a.format(d=tmp_path) for a in args])
    assert result.exit_code == 2 and f"'{option}'" in result.output, result.output
    if "nope" not in args[-1]:  # the hint is the option to give, not the Python API's url='…'
        assert f"{option} local://{tmp_path}" in result.output and "url=" not in result.output
    assert not os.listdir(tmp_path)  # no store made
