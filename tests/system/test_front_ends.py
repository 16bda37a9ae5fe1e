"""The CLI and the shell are made from one command table, so they agree.

Same names (``-`` in the CLI where the shell has ``_``), the same argument
order (the queue first), the same defaults, every shared command in both.
"""

import io
import json
import os

import click
import pytest
from click.testing import CliRunner

from hqueue import HQueue, HQueueAdmin, InvalidArgument, Message
from hqueue.checks import partition_for_key
from hqueue.cli import main
from hqueue.commands import COMMANDS
from hqueue.server import HQueueServer
from hqueue.shell import Shell
from hqueue.shell.commands import ALIASES
from hqueue.shell.commands import COMMANDS as SHELL_COMMANDS

#: The shell's own commands and the CLI's process commands: the rest are shared.
SHELL_ONLY = {"help", "exit"}
CLI_ONLY = {"server", "shell", "demo", "tail", "consume", "console"}
BOTH_IN_THEIR_OWN_SHAPE = {"put", "scan", "count"}


def test_every_command_is_in_both_front_ends_with_one_name():
    cli = set(main.commands)
    shell = set(SHELL_COMMANDS)
    assert {name.replace("-", "_") for name in cli} - CLI_ONLY == shell - SHELL_ONLY
    assert set(COMMANDS) | BOTH_IN_THEIR_OWN_SHAPE == shell - SHELL_ONLY


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_arguments_are_in_one_order_with_one_default(name):
    declared = COMMANDS[name]
    cli = main.commands[declared.cli_name]
    positional = [p.name for p in cli.params if isinstance(p, click.Argument)]
    assert positional == [p.name for p in declared.params if p.required or p.positional]
    if declared.params and declared.params[0].required and name not in ("status", "list"):
        assert declared.params[0].name == "queue"  # the queue first, everywhere
        assert SHELL_COMMANDS[name].usage.startswith(f"{name} 'queue'")
    for param in declared.params:
        if not param.required and param.kind not in ("texts", "settings"):
            (option,) = [p for p in cli.params if p.name == param.name]
            assert option.default == param.default, (name, param.name)


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if any(p.required for p in c.params)))
def test_a_missing_argument_is_a_usage_error_naming_it(name, tmp_path):
    """With click 8.5 a required argument's default=None counted as given: ``hqueue create``
    ran with a placeholder object and said "'name' must be a str, not object" (rc 1)."""
    declared = COMMANDS[name]
    result = CliRunner().invoke(main, ["--url", f"local://{tmp_path}/data", declared.cli_name])
    first = next(p for p in declared.params if p.required)
    assert result.exit_code == 2, result.output
    assert "Missing argument" in result.output and "object" not in result.output, result.output
    assert first.name.upper() in result.output, result.output


def test_old_names_still_work_in_both():
    assert {"drop", "drop_queue", "truncate", "disable", "enable", "groups", "desc"} <= set(ALIASES)


@pytest.fixture
def cli(tmp_path):
    runner = CliRunner()

    def invoke(*args):
        result = runner.invoke(main, ["--url", f"local://{tmp_path}/data", *args])
        assert "Traceback" not in result.output
        return result

    return invoke


def test_the_cli_takes_the_shell_s_names_and_its_old_ones(cli):
    assert cli("create", "q", "1").exit_code == 0
    assert cli("disable_queue", "q").exit_code == 0  # the shell's spelling
    assert cli("enable", "q").exit_code == 0  # the old name
    assert cli("delete-queue", "q", "--force").exit_code == 0
    assert cli("list").output == ""


def test_the_cli_has_the_group_commands_the_shell_has(cli, tmp_path):
    cli("create", "q", "2")
    cli("put", "q", "t", "a", "b", "--partition", "1")
    assert cli("consume", "q", "g", "--max", "2").exit_code == 0
    assert cli("list-groups", "q").output.splitlines()[1].split()[0] == "g"
    replayed = cli("replay-group", "q", "g", "0", "--partition", "1")
    assert replayed.exit_code == 0 and "partition 1" in replayed.output
    assert cli("replay-group", "q", "g", "--from", "0").exit_code == 0  # the old option still reads
    assert cli("replay-group", "q", "g").exit_code == 2
    assert cli("delete-group", "q", "g").exit_code == 0
    assert cli("list-groups", "q").output == ""
    assert json.loads(cli("list-groups", "q", "--format", "json").output) == []


def test_the_cli_puts_by_priority(cli, tmp_path):
    assert cli("create", "q", "4", "--priorities", "2").exit_code == 0
    assert cli("put", "q", "t", "urgent", "--priority", "1").exit_code == 0
    with HQueue("q", f"local://{tmp_path}/data") as queue:
        assert [m.partition_id >= 2 for m in queue.scan()] == [True]
    out_of_tiers = cli("put", "q", "t", "x", "--priority", "2")  # out of the queue's tiers: the option's refusal
    assert out_of_tiers.exit_code == 2 and "Invalid value for '--priority': must be in 0..1" in out_of_tiers.output
    assert cli("put", "q", "t", "x", "--priority", "99999").exit_code == 2  # out of any range


def test_subscriber_commands_in_the_cli_and_the_shell_take_the_queue_first(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    runner = CliRunner()

    def cli(*args):
        return runner.invoke(main, ["--url", url, *args])

    out, err = io.StringIO(), io.StringIO()
    shell = Shell(url, out=out, err=err)
    try:
        assert cli("create", "q", "2").exit_code == 0
        assert cli("add-subscriber", "q", "indexer", "-t", "crawler").exit_code == 0
        assert cli("list-subscribers", "q").output.splitlines()[1].split()[0] == "indexer"
        described = json.loads(cli("describe-subscriber", "q", "indexer").output)
        assert described["topics"] == ["crawler"]
        assert cli("set-checkpoint", "q", "indexer", "2000-01-01T00:00", "--partition", "1").exit_code == 0
        assert shell.execute("describe_subscriber 'q', 'indexer'") and "topics: crawler" in out.getvalue()
        assert shell.execute("set_checkpoint 'q', 'indexer', 0, {PARTITION => 0}")
        assert shell.execute("delete_subscriber 'q', 'indexer'")
        assert cli("list-subscribers", "q").output == ""
    finally:
        shell.close()
        server.stop()


def test_shell_options_go_in_a_trailing_dictionary(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(f"local://{tmp_path}/data", out=out, err=err)
    try:
        assert shell.execute("create 'q', 2")  # the TTL defaults to 0, as in the CLI
        assert shell.execute("create 'p', 2, 60, {DURABILITY => 'ASYNC_WAL', PRIORITIES => 2, 'x.y' => '1'}")
        info = shell.admin.describe_queue("p")
        assert (info["ttl"], info["durability"], info["config"]["x.y"]) == (60, "ASYNC_WAL", "1")
        assert not shell.execute("create 'r', 2, {DURABILITY => 'FAST'}") and "must be one of" in err.getvalue()
        assert not shell.execute("delete_queue 'q', {FORCE => 'yes'}") and "true or false" in err.getvalue()
        assert shell.execute("delete_queue 'q', {FORCE => true}")
        assert shell.execute("put 'p', 't', 'v'")
        assert not shell.execute("cancel 'p', '0/1/1:0'")  # not pending: the row, then an error
        assert "0/1/1:0\tnot pending" in out.getvalue()
        assert "ERROR: 1 of 1 timer(s) not pending: fired or cancelled already" in err.getvalue()
        assert shell.execute("delete_group 'p', 'nobody'") is False  # no such group: a clear error
        assert "ERROR" in err.getvalue()
    finally:
        shell.close()


def test_credentials_follow_the_shell_s_queue_handles(tmp_path):
    auth = tmp_path / "auth.toml"
    auth.write_text(
        '[tokens.ops]\nsecret = "secret-token-0123456789"\nadmin = ["*"]\n'
        '[tokens.reader]\nsecret = "reader-token-0123456789"\nconsumer = ["q*"]\n'
    )
    from hqueue.auth import AuthPolicy

    server = HQueueServer(f"local://{tmp_path}/data", port=0, auth=AuthPolicy.load(str(auth))).start()
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(f"hqueue://secret-token-0123456789@{server.address}", out=out, err=err)
    try:
        assert shell.execute("create 'q', 2")
        assert shell.execute("put 'q', 't', 'v'"), err.getvalue()
        assert shell.execute("scan 'q'") and shell.execute("count 'q'")
        assert "secret-token-0123456789" not in out.getvalue() + err.getvalue()
        with HQueueAdmin(f"hqueue://secret-token-0123456789@{server.address}") as admin, admin.queue("q") as queue:
            queue.put(Message("t", b"w"))
            splits = queue.splits()
            assert "secret-token-0123456789" not in repr(splits)
            assert sum(len(b) for s in splits for b in s.read()) == 2  # the split carries the token
            admin.add_subscriber("q", "s1")
        reader = Shell(f"hqueue://reader-token-0123456789@{server.address}", out=out, err=err)
        try:  # the seed's order still reads, though the token may not look at a queue named 's1'
            assert reader.execute("describe_subscriber 's1', 'q'"), err.getvalue()
        finally:
            reader.close()
    finally:
        shell.close()
        server.stop()


@pytest.mark.parametrize(
    "args", [["put", "q", "t", "v"], ["consume", "q", "g", "--for", "0"], ["cancel", "q", "0/1/1:0"],
             ["delete-group", "q", "g"], ["delete-queue", "q", "--force"], ["add-subscriber", "q", "s"]],
)  # fmt: skip
def test_a_command_on_a_queue_leaves_no_store_where_there_was_none(tmp_path, monkeypatch, args):
    # A typo'd directory (or the wrong one) must not get an empty store from a command that needs a queue
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "no hqueue store at" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
    assert CliRunner().invoke(main, ["create", "q", "1"]).exit_code == 0  # create still makes one


@pytest.mark.parametrize("line", ["put 'x', 't', 'v'", "delete_queue 'x'", "cancel 'x', '0/1/1:0'", "count 'x'"])
def test_a_shell_command_on_a_queue_leaves_no_store_where_there_was_none(tmp_path, monkeypatch, line):
    """As the CLI's: only create makes a store (a put where none is made an empty one)."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["--url", f"local://{tmp_path}/typo", "shell", "-e", line])
    assert result.exit_code == 1 and "no hqueue store at" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
    shell = Shell(f"local://{tmp_path}/typo", out=io.StringIO(), err=io.StringIO())
    assert not shell.execute(line) and shell.execute("create 'x', 1")  # create still makes one
    shell.close()


def test_a_key_that_is_not_utf8_routes_in_the_cli_and_the_shell_as_in_the_api(tmp_path):
    """Keys are bytes: one that is not UTF-8 goes where the API sends it (the CLI and the
    shell failed to encode it, where topics and values of the same bytes worked)."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 16)
    key = b"k\xff"
    expected = partition_for_key(key, 16)
    assert expected != partition_for_key(key.decode("latin-1").encode(), 16)  # (the bytes, not a re-encoding)
    cli = CliRunner().invoke(main, ["--url", url, "put", "q", "t", "cli", "-k", os.fsdecode(key)])
    assert cli.exit_code == 0, cli.output
    shell = Shell(url, out=io.StringIO(), err=io.StringIO())
    assert shell.execute("put 'q', 't', 'shell', {KEY => 'k\\xff'}")
    shell.close()
    with HQueue("q", url) as queue:
        assert {m.value: m.partition_id for m in queue.scan()} == {b"cli": expected, b"shell": expected}


def test_reads_never_create_a_store_and_a_bare_path_gets_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (["list"], ["list-groups", "q"], ["describe-group", "q", "g"], ["shell", "-e", "list"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1 and "no hqueue store at" in result.output, args
    shell = Shell(None, out=io.StringIO(), err=io.StringIO())
    assert shell.execute("help") and not shell.execute("scan 'q'") and not shell.execute("status")
    shell.close()
    assert not (tmp_path / "hqueue-data").exists()
    assert runner.invoke(main, ["--url", "memory://x", "list"]).exit_code == 0
    bare = runner.invoke(main, ["--url", str(tmp_path / "foo"), "list"])
    assert bare.exit_code == 2 and f"--url local://{tmp_path}/foo" in bare.output  # the CLI's flag, not Python
    assert "url='" not in bare.output
    with pytest.raises(InvalidArgument, match="has no scheme"):
        HQueueAdmin(url=str(tmp_path / "foo"))
    with pytest.raises(TypeError, match="not a path: use data_dir="):  # (AttributeError: 'startswith')
        HQueueAdmin(url=tmp_path / "foo")
    for wrong in (5, b"memory://x"):
        with pytest.raises(TypeError, match="'url' must be a str"):
            HQueueAdmin(url=wrong)
    assert not (tmp_path / "foo").exists()
    # A directory of other things is no store: a read leaves it as it was (it got RocksDB's files)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    for args in (["list"], ["describe", "q"], ["shell", "-e", "list"]):
        result = runner.invoke(main, ["--url", f"local://{tmp_path}/docs", *args])
        assert result.exit_code == 1 and "no hqueue store at" in result.output, (args, result.output)
    assert [p.name for p in (tmp_path / "docs").iterdir()] == ["notes.txt"]
    # local:// with no directory says so (it was the current directory)
    odd = runner.invoke(main, ["--url", "ftp://x", "list"])
    assert odd.exit_code == 2 and "unknown scheme 'ftp'" in odd.output, odd.output  # a usage error, as a bare path
    empty = runner.invoke(main, ["--url", "local://", "list"])
    assert empty.exit_code == 2 and "names no directory" in empty.output, empty.output  # a bad --url: as ftp:
    with pytest.raises(InvalidArgument, match="names no directory"):
        HQueueAdmin(url="local://")


def test_times_past_the_year_9999_are_refused_before_anything_changes(tmp_path):
    runner = CliRunner()
    url = ["--url", f"local://{tmp_path}/data"]
    runner.invoke(main, [*url, "create", "q", "1"])
    runner.invoke(main, [*url, "consume", "q", "g", "--for", "0"])
    late = runner.invoke(main, [*url, "replay-group", "q", "g", "253402300800000"])
    assert late.exit_code == 2 and "after the year 9999" in late.output
    assert runner.invoke(main, [*url, "replay-group", "q", "g", "253402300799999", "--format", "json"]).exit_code == 0
    for own in (["scan", "q", "--start"], ["count", "q", "--stop"], ["tail", "q", "--for", "0", "--start"]):
        late = runner.invoke(main, [*url, *own, "99999999999999999"])  # (the hand-made commands took it)
        assert late.exit_code == 2 and "after the year 9999" in late.output, (own, late.output)


def test_the_shell_reads_what_older_shells_wrote(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(f"local://{tmp_path}/data", out=out, err=err)
    try:
        assert shell.execute("create 'q', 2, 0, {'hqueue.durability' => 'ASYNC_WAL', 'MAX_MESSAGE_BYTES' => '1024'}")
        info = shell.admin.describe_queue("q")
        assert (info["durability"], info["max_message_bytes"]) == ("ASYNC_WAL", 1024)
        assert "hqueue.durability" not in info["config"]
    finally:
        shell.close()


def test_a_declared_remote_call_refuses_unknown_and_repeated_keywords():
    from hqueue.rpc.operations import DELETE_SUBSCRIBER, GROUP_PENDING

    with pytest.raises(TypeError, match="unexpected keyword"):
        GROUP_PENDING.bind(("q", "g"), {"limt": 5})
    with pytest.raises(TypeError, match="multiple values"):
        DELETE_SUBSCRIBER.bind(("q1", "s"), {"queue": "q5"})
    assert GROUP_PENDING.bind(("q", "g"), {}) == {"queue": "q", "group": "g", "limit": 1000}


def test_a_split_carries_its_token_only_in_the_pickle():
    import dataclasses
    import pickle

    from hqueue.splits import Split

    split = Split("hqueue://h:1", "q", 0)._carrying("secret-token-0123456789")
    assert "secret-token" not in repr(split) + repr(dataclasses.asdict(split))
    assert pickle.loads(pickle.dumps(split))._token == "secret-token-0123456789"


def test_the_shell_and_the_cli_escape_values_alike(tmp_path):
    """The shell printed a tab as \\x09 and a backslash as itself, so a literal "\\xff" and
    the byte 0xff looked the same there (a fresh user's probe); the CLI's escapes are reversible."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put([Message("t", b"a\tb\\c\xff"), Message("t", b"\\xff")])
    cli = CliRunner().invoke(main, ["--url", url, "scan", "q"]).output
    out = io.StringIO()
    shell = Shell(url, out=out, err=io.StringIO())
    assert shell.execute("scan 'q'")
    shell.close()
    for printed in (cli, out.getvalue()):
        assert "a\\tb\\\\c\\xff" in printed and "\\\\xff" in printed, printed


def test_the_shell_puts_timers_by_key_and_priority_as_the_cli_does(tmp_path):
    """The shell's put took only a partition: no timers, keys or priorities (a fresh user's probe)."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 4)
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(url, out=out, err=err)
    assert shell.execute("put 'q', 't', 'later', {DELAY => 600}")
    handle = out.getvalue().split()[1]
    assert shell.execute(f"cancel 'q', '{handle}'")
    assert shell.execute("put 'q', 't', 'keyed', {KEY => 'example.com'}")
    assert shell.execute("put 'q', 't', 'second', 2")
    assert not shell.execute("create 'z2', 4, {'k' => ['a', {'b' => 1}]}") and "takes a string" in err.getvalue()
    assert not shell.execute("put 'q', 't', 'v', {DELAY => 'soon'}") and "DELAY must be" in err.getvalue()
    for delay in (315360001, 100000000000000, -1):  # the CLI's --delay range (these were taken: an attacker pass)
        assert not shell.execute(f"put 'q', 't', 'v', {{DELAY => {delay}}}") and "0..315360000" in err.getvalue()
    assert not shell.execute("put 'q', 't', 'v', {LATER => 1}") and "known: AT, DELAY" in err.getvalue()
    assert not shell.execute("put 'q', 't', 'v', {AT => '10:00'}") and "UTC unless it has an offset" in err.getvalue()
    assert (
        not shell.execute("put 'q', 't', 'v', {AT => 0, DELAY => 5}") and "give AT or DELAY, not both" in err.getvalue()
    )
    shell.close()
    with HQueue("q", url) as queue:
        queue.put(Message("t", b"probe"), key="example.com")
        by_partition = {m.value: m.partition_id for m in queue.scan()}
        assert by_partition[b"keyed"] == by_partition[b"probe"] and by_partition[b"second"] == 2
        assert b"later" not in by_partition and queue.count_timers()[0] == 0  # cancelled


def test_the_same_mistake_is_explained_alike_in_the_cli_and_the_shell(tmp_path):
    """Deleting an enabled queue: the CLI named the fix, the shell did not; a group's topics
    were shown as Python bytes, [b'a'] (a fresh user's probe)."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    cli = CliRunner().invoke(main, ["--url", url, "delete-queue", "q"]).output
    assert "is enabled: disable it first (hqueue disable-queue q), or pass --force" in cli
    err = io.StringIO()
    shell = Shell(url, out=io.StringIO(), err=err)
    assert not shell.execute("delete_queue 'q'")
    shell.close()
    assert "is enabled: disable it first (disable_queue 'q'), or pass {FORCE => true}" in err.getvalue()
    with HQueue("q", url) as queue:
        with queue.consumer("g", topics=["a"]):
            pass
        with pytest.raises(InvalidArgument, match=r"takes topics \['a'\], not \['zzz'\]"):
            queue.consumer("g", topics=["zzz"])


def test_a_scan_limit_past_64_bits_is_refused_alike_everywhere(tmp_path):
    """The CLI's --limit stops at 2**63 - 1; the API and the shell said islice's own words."""
    import asyncio

    from hqueue.aio import AsyncHQueue

    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    huge = 10**20
    with HQueue("q", url) as queue:
        for limit in (huge, True, -1):
            with pytest.raises(InvalidArgument, match=r"'limit' must be an int in 0\.\.9223372036854775807"):
                list(queue.scan(limit=limit))

    async def in_asyncio() -> None:
        async with AsyncHQueue("q", url) as queue:
            with pytest.raises(InvalidArgument, match="'limit' must be an int in 0.."):
                queue.scan(limit=huge)

    asyncio.run(in_asyncio())
    err = io.StringIO()
    shell = Shell(url, out=io.StringIO(), err=err)
    assert not shell.execute(f"scan 'q', {{LIMIT => {huge}}}")
    shell.close()
    assert "'limit' must be an int in 0..9223372036854775807" in err.getvalue()
    cli = CliRunner().invoke(main, ["--url", url, "scan", "q", "--limit", str(huge)])
    assert cli.exit_code == 2 and "0<=x<=9223372036854775807" in cli.output


def test_text_output_breaks_no_line_on_unicode_line_separators():
    """U+2028, U+2029 and the C1 controls (U+0085: NEL) are line breaks to str.splitlines
    and to many terminals: a value printed with one split its record in two."""
    from hqueue.commands import escape

    value = "a\u2028b\u2029c\u0085d\u009be é\t".encode()
    printed = escape(value)
    assert printed.splitlines() == [printed] and "é" in printed
    assert printed == "a\\xe2\\x80\\xa8b\\xe2\\x80\\xa9c\\xc2\\x85d\\xc2\\x9be é\\t"


def test_text_output_shows_the_characters_that_reorder_or_hide_text_escaped():
    """A right-to-left override or a zero-width space in a topic or value printed raw
    (an attacker's pass): what is shown read otherwise than what it names."""
    from hqueue.commands import escape, unescape

    value = "evil\u202egnp.exe \u200bx\u2066y\u2069\ufeff".encode()
    printed = escape(value)
    assert printed == "evil\\xe2\\x80\\xaegnp.exe \\xe2\\x80\\x8bx\\xe2\\x81\\xa6y\\xe2\\x81\\xa9\\xef\\xbb\\xbf"
    assert unescape(printed.encode()) == value  # (copied back, it names the same bytes)
    assert escape("👨\u200d👩".encode()) == "👨\u200d👩"  # (ZWJ joins emoji and scripts: kept)


def test_a_queue_name_that_is_not_a_str_is_a_type_error_on_every_store(tmp_path):
    """delete_queue(None) said "does not exist" in this process, and InvalidMessage or
    StorageError through a server; queue_exists(None) was False here and an error there."""
    import asyncio

    from hqueue.aio import AsyncHQueueAdmin

    server = HQueueServer(f"local://{tmp_path}/served", port=0).start()
    calls = [("delete_queue", ()), ("disable_queue", ()), ("queue_exists", ()), ("describe_queue", ()),
             ("list_groups", ()), ("delete_group", ("g",)), ("list_subscribers", ())]  # fmt: skip
    try:
        for url in (f"local://{tmp_path}/data", "memory://", f"hqueue://127.0.0.1:{server.port}"):
            with HQueueAdmin(url) as admin:
                for name, more in calls:
                    for bad in (None, 5, b"q"):
                        with pytest.raises(TypeError, match=r"must be a str \(the queue's name\)"):
                            getattr(admin, name)(bad, *more)
                with pytest.raises(TypeError, match=r"'queue' must be a str"):
                    admin.delete_group(queue=None, group="g")  # (by name too)
                assert admin.queue_exists(name="nosuch") is False

            async def in_asyncio(url=url) -> None:
                async with AsyncHQueueAdmin(url) as admin:
                    for name, more in calls:
                        with pytest.raises(TypeError, match=r"must be a str \(the queue's name\)"):
                            await getattr(admin, name)(None, *more)

            asyncio.run(in_asyncio())
    finally:
        server.stop()
