"""The hqueue shell: its parser, its commands, and its script and -e modes."""

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.server import HQueueServer
from hqueue.shell import Shell, ShellSyntaxError, parse_line
from hqueue.shell.commands import to_bytes
from hqueue.shell.parser import Word

from ..processes import ROOT, python_env

# -- the parser ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, name, args",
    [
        ("list", "list", []),
        ("  list  ", "list", []),
        ("create 'q1', 32, 86400", "create", ["q1", 32, 86400]),
        ('create "q1", 32, -1', "create", ["q1", 32, -1]),
        (
            "create 'q1', 32, 86400, {'hbase.hqueue.partitionsPerRegion' => '4', 'hbase.hstore.compaction.min' => "
            "'16'}",
            "create",
            ["q1", 32, 86400, {"hbase.hqueue.partitionsPerRegion": "4", "hbase.hstore.compaction.min": "16"}],
        ),
        (
            "scan 'q1', {LIMIT => 10, TOPICS => ['t1', \"t2\"], STARTTIME => '2026-11-22 10:00', PARTITION => 3}",
            "scan",
            ["q1", {"LIMIT": 10, "TOPICS": ["t1", "t2"], "STARTTIME": "2026-11-22 10:00", "PARTITION": 3}],
        ),
        ("put 'q', 't', 'it\\'s \"fine\"'", "put", ["q", "t", 'it\'s "fine"']),
        ("put 'q', 't', 'a\\tb\\nc\\\\d'", "put", ["q", "t", "a\tb\nc\\d"]),
        ("x [], {}, [[1], {'a' => []}]", "x", [[], {}, [[1], {"a": []}]]),
        ("x true, false, nil, SOME_CONST", "x", [True, False, None, "SOME_CONST"]),
        ("list # a comment, 'ignored'", "list", []),
        ("put 'q', 't', 'a # not a comment'", "put", ["q", "t", "a # not a comment"]),
        ("put 'q', 't', 'v', {DELAY => 1.5, PARTITION => -0}", "put", ["q", "t", "v", {"DELAY": 1.5, "PARTITION": 0}]),
        ("x [1, 2,], {A => 1,}", "x", [[1, 2], {"A": 1}]),  # (trailing commas, as Ruby takes them)
        ("\ufefflist", "list", []),  # (a script's first line, saved with a byte-order mark)
    ],
)
def test_every_literal_form_parses(line, name, args):
    call = parse_line(line)
    assert (call.name, call.args) == (name, args)


def test_bare_words_are_distinct_from_strings():
    (word,) = parse_line("x LIMIT").args
    assert isinstance(word, Word) and not isinstance(parse_line("x 'LIMIT'").args[0], Word)


def test_hex_escapes_are_raw_bytes_and_other_text_is_utf8():
    (value,) = parse_line("x 'a\\x00\\xffé'").args
    assert to_bytes(value) == b"a\x00\xff\xc3\xa9"


@pytest.mark.parametrize("line", ["", "   ", "# only a comment"])
def test_blank_lines_and_comments_are_nothing(line):
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "line, column, message",
    [
        ("create 'q1", 8, "unterminated string"),
        ("create 'q1', 32,", 17, "expected a value"),
        ("scan 'q1', {LIMIT 10}", 19, "expected '=>'"),
        ("scan 'q1', {LIMIT => 10", 24, "expected '}'"),
        ("scan 'q1' {LIMIT => 10}", 11, "expected ','"),
        ("create 'q1', 32 86400", 17, "expected ','"),
        ("put 'q', @", 10, "unexpected '@'"),
        ("'q1'", 1, "expected a command name"),
        ("x {[1] => 2}", 4, "dictionary key"),
        ("x [1, 2", 8, "expected ']'"),
        ("x [1,,]", 6, "unexpected ','"),
        ("x {A => 1,,}", 11, "unexpected ','"),
        ("x 1.", 4, "expected ','"),
        ("x " + "[" * 5000, 19, "nest at most 16 deep"),  # (a RecursionError that ended the shell)
        ("x " + "{A => " * 17, 99, "nest at most 16 deep"),
        ("create 'x', " + "9" * 5000, 13, "a number of 5000 digits"),  # (int()'s own limit, a traceback)
        ("scan 'q', {PARTITION => 1, PARTITION => 2}", 28, "PARTITION is given twice"),
    ],
)
def test_syntax_errors_name_the_column(line, column, message):
    with pytest.raises(ShellSyntaxError) as info:
        parse_line(line)
    assert info.value.column == column and message in info.value.message
    assert info.value.pointer().splitlines()[1] == " " * (column - 1) + "^"


# -- the commands ---------------------------------------------------------------------------


class Run:
    """A shell whose output is captured; run("line") -> (ok, out, err)."""

    def __init__(self, url: str) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()
        self.shell = Shell(url, out=self.out, err=self.err)

    def __call__(self, line: str):
        self.out.seek(0), self.out.truncate(), self.err.seek(0), self.err.truncate()
        ok = self.shell.execute(line)
        return ok, self.out.getvalue(), self.err.getvalue()


@pytest.fixture
def run(tmp_path):
    runner = Run(f"local://{tmp_path}/data")
    yield runner
    runner.shell.close()


def test_the_seed_queue_commands(run):
    ok, out, _ = run(
        "create 'q1', 32, 86400, {'hbase.hqueue.partitionsPerRegion' => '4', 'hbase.hstore.compaction.min' => '16'}"
    )
    assert ok and "Created queue 'q1'" in out and "seconds" in out
    info = run.shell.admin.describe_queue("q1")
    assert info["config"].pop("hqueue.created")  # (set by every create)
    assert info["config"] == {"hbase.hqueue.partitionsPerRegion": "4", "hbase.hstore.compaction.min": "16"}
    assert run("put 'q1', 'crawler', 'http://a', 3")[0]
    assert run("truncate_queue 'q1'")[0]
    assert run("count 'q1'")[1].startswith("0\n")
    assert run("disable_queue 'q1'")[0]
    ok, _, err = run("put 'q1', 't', 'v'")
    assert not ok and err == "ERROR: queue 'q1' is disabled (enable it with enable_queue)\n"
    assert run("enable_queue 'q1'")[0]
    ok, _, err = run("drop_queue 'q1'")
    assert not ok and "is enabled: disable it first" in err
    run("disable_queue 'q1'")
    assert run("drop_queue 'q1'")[0]
    assert re.fullmatch(r"0 row\(s\) in \d+\.\d{4} seconds\n", run("list")[1])


def test_list_describe_scan_count_print_tables_and_timing(run):
    run("create 'q1', 4, 0, {DURABILITY => 'ASYNC_WAL'}")
    run("put 'q1', 'crawler', 'http://a', 1")
    run("put 'q1', 'dump', 'bin\\x00\\xff', 2")
    out = run("list")[1].splitlines()
    assert out[0].split() == ["QUEUE", "PARTITIONS", "TTL", "STATE", "DURABILITY"]
    assert out[1].split() == ["q1", "4", "0", "ENABLED", "ASYNC_WAL"]
    assert out[2].startswith("1 row(s) in ") and out[2].endswith(" seconds")
    scan = run("scan 'q1'")[1].splitlines()
    assert len(scan) == 4 and scan[1].split()[3:] == ["crawler", "http://a"]
    assert scan[2].endswith("bin\\x00\\xff")  # binary shown with escapes
    assert scan[-1].startswith("2 row(s)")
    assert run("scan 'q1', {TOPICS => ['dump'], LIMIT => 5}")[1].count("dump") == 1
    assert run("scan 'q1', {PARTITION => 1}")[1].splitlines()[-1].startswith("1 row(s)")
    assert run("scan 'q1', {STARTTIME => '2000-01-01 00:00', STOPTIME => '2000-01-02'}")[1].startswith("0 row(s)")
    assert "durability" in run("describe 'q1'")[1]
    assert run("count 'q1'")[1].startswith("2\n")
    assert run("count 'q1', {TOPICS => ['dump']}")[1].startswith("1\n")  # (it took no options)
    assert run("count 'q1', {PARTITION => 2}")[1].startswith("1\n")
    assert run("count 'q1', {STARTTIME => '2000-01-01', STOPTIME => '2000-01-02'}")[1].startswith("0\n")
    assert "store: local://" in run("status")[1]


@pytest.mark.parametrize(
    "line, error",
    [
        ("scan 'q9'", "ERROR: queue 'q9' does not exist"),
        ("nope 'x'", "ERROR: unknown command 'nope'; type help for the list"),
        ("create 'q1'", "create takes 2 to 7 argument(s), got 1; usage: create 'queue', partitions[, ttl][, {"),
        ("create 'q1', '32', 0", "create: partitions must be an integer"),
        ("create 'bad name', 3, 0", "invalid queue name 'bad name'"),
        ("scan 'q1', {COLUMNS => 1}", "scan: unknown option(s) COLUMNS"),
        ("scan 'q1', {STARTTIME => 'yesterday'}", "not a message ID or ISO time"),
        ("scan 'q1', {STARTID => '1:99999'}", "scan: 'STARTID': 'sequence' must be in"),  # (it said STARTTIME)
        ("scan 'q1', {STARTID => '1:1', STARTTIME => '2026-01-01'}", "give STARTID or STARTTIME, not both"),
        ("put 'q1', 't', 'v', 99", "PARTITION must be in 0..3"),
        ("count 'q1', {LIMIT => 1}", "count: unknown option(s) LIMIT"),
        ("put 'q1', 't', 'v', {DELAY => nil}", "put: DELAY => nil: give it a value, or leave it out"),
        ("scan 'q1', {LIMIT => nil}", "scan: LIMIT => nil: give it a value"),
        ("count 'q1', {TOPICS => 't'}", "count: TOPICS must be a list"),
        # (an attacker's pass: the last one won, unsaid; the key's escape reached the terminal)
        ("put 'q1', 't', 'v', {'partition' => 1, 'PARTITION' => 2}", "an option given twice (keys are not case-sen"),
        ("count 'q1', {'\x1b[2J' => 1}", "count: unknown option(s) \\x1b[2J; known:"),
        ("create 'tt', 1, 2147483648", "'ttl' must be in 0..2147483647, got 2147483648"),  # (it said 2.14748e+09)
        ("create 'p1', 4, 0, {PRIORITIES => 1, 'hqueue.priorities' => '2'}", "'priorities' is 1 and config"),
        ("create 'p1', 2, 0, {'hqueue.priorities' => '\u00b2'}", "'priorities' must be 1..partitions"),
        ("help 'nope'", "no command 'nope'"),
        ("add_subscriber 'nope', 's'", "queue 'nope' does not exist"),
    ],
)
def test_user_errors_are_one_line_and_the_shell_carries_on(run, line, error):
    run("create 'q1', 4, 0")
    ok, out, err = run(line)
    assert not ok and out == "" and error in err and err.count("\n") == 1 and "Traceback" not in err
    assert run("list")[0]  # still working


def test_a_syntax_error_points_at_the_column(run):
    ok, _, err = run("scan 'q1', {LIMIT 10}")
    assert not ok
    assert (
        err == "ERROR: syntax error: expected '=>', found '1' at column 19\nscan 'q1', {LIMIT 10}\n" + " " * 18 + "^\n"
    )


def test_a_syntax_error_shows_the_line_s_control_characters_escaped(run):
    """The raw line went back to the terminal: an OSC sequence in it set the window's title."""
    ok, _, err = run("scan 'u' \x1b]0;PWNED\x07")
    assert not ok and "\x1b" not in err and "\x07" not in err
    line, caret = err.splitlines()[1:3]
    assert line == "scan 'u' \\x1b]0;PWNED\\x07" and caret == " " * 9 + "^"


def test_help_lists_commands_and_explains_one(run):
    out = run("help")[1]
    for name in ["create", "truncate_queue", "drop_queue", "add_subscriber", "delete_subscriber", "scan", "status"]:
        assert name in out
    detail = run("help 'scan'")[1]
    assert "scan 'q1', {LIMIT => 10" in detail and "Examples:" in detail


def test_subscriber_commands_against_a_server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    run = Run(f"hqueue://{server.address}")
    try:
        run("create 'q1', 2, 0")
        assert run("add_subscriber 'q1', 'sub'")[0]  # the seed's order: queue, subscriber
        assert run("list_subscribers 'q1'")[1].splitlines()[1].startswith("sub ")
        run("put 'q1', 't', 'v', 1")
        out = run("describe_subscriber 'sub', 'q1'")[1]
        assert "address: (away)" in out and out.splitlines()[-2].split()[:3] == [
            "1",
            "0:0",
            "1",
        ]  # partition 1: 1 waiting
        assert run("set_checkpoint 'sub', 'q1', '2000-01-01 00:00'")[0]
        assert run("set_checkpoint 'sub', 'q1', '2000-01-01 00:00', 1")[0]
        assert "SERVER" in run("status")[1]
        assert run("delete_subscriber 'sub', 'q1'")[0]  # the seed's order: subscriber, queue
        ok, _, err = run("describe_subscriber 'sub', 'q1'")
        assert not ok and "not registered" in err
    finally:
        run.shell.close()
        server.stop()


# -- script and -e modes ---------------------------------------------------------------------


def hqueue_shell(tmp_path, *args, input=None):
    return subprocess.run(
        [sys.executable, "-m", "hqueue.cli", "--url", f"local://{tmp_path}/data", "shell", *args],
        cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=120, input=input,
    )  # fmt: skip


def test_e_mode_runs_lines_and_exits_nonzero_on_the_first_error(tmp_path):
    result = hqueue_shell(tmp_path, "-e", "create 'q1', 2, 0", "-e", "list")
    assert result.returncode == 0 and "q1" in result.stdout
    result = hqueue_shell(tmp_path, "-e", "scan 'nope'", "-e", "list")
    assert result.returncode == 1
    assert "ERROR: queue 'nope' does not exist" in result.stderr and "stopped at -e, line 1" in result.stderr
    assert "QUEUE" not in result.stdout  # the second line never ran


def test_script_mode_runs_the_example_and_stops_at_an_error(tmp_path):
    result = hqueue_shell(tmp_path, str(ROOT / "shell/examples/crawl.hq"))
    assert result.returncode == 0, result.stderr
    assert "Deleted queue 'crawl_example'" in result.stdout
    bad = tmp_path / "bad.hq"
    bad.write_text("create 'q2', 2, 0\n# fine so far\nput 'q2', 't'\nlist\n")
    result = hqueue_shell(tmp_path, str(bad))
    assert result.returncode == 1 and "stopped at" in result.stderr and "line 3" in result.stderr


def test_the_launcher_script_runs_the_shell(tmp_path):
    # the hqueue command of the interpreter running the tests is on the PATH, as after pip install
    env = python_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    result = subprocess.run(
        [str(ROOT / "shell/hqueue"), "--url", f"local://{tmp_path}/data", "shell",
         "-e", "create 'q', 1", "-e", "status"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1 queue(s)" in result.stdout


def test_an_admin_change_is_seen_by_the_shell(tmp_path):
    with HQueueAdmin(data_dir=tmp_path / "data") as admin:
        admin.create_queue("made_elsewhere", 1)
    run = Run(f"local://{tmp_path}/data")
    try:
        run.shell.queue("made_elsewhere").put(Message("t", b"v"))
        assert run("count 'made_elsewhere'")[1].startswith("1\n")
    finally:
        run.shell.close()


def test_a_big_scan_streams_in_chunks_and_counts_every_row(run, monkeypatch):
    from hqueue.shell import commands

    monkeypatch.setattr(commands, "SCAN_CHUNK", 100)
    run("create 'q1', 2, 0")
    run.shell.queue("q1").put([Message("t", b"v%d" % i) for i in range(250)], partition_id=0)
    text, rows = commands.COMMANDS["scan"](run.shell, ["q1"])
    chunks = list(text)
    assert len(chunks) == 3 and chunks[0].startswith("PARTITION") and not chunks[1].startswith("PARTITION")
    assert text.rows == 250
    ok, out, _ = run("scan 'q1'")
    assert ok and out.count("\n") == 252 and "250 row(s)" in out  # header, rows, timing


def test_desc_is_describe(run):
    run("create 'q1', 2, 0")
    ok, out, _ = run("desc 'q1'")
    assert ok and "partitions" in out
    assert "(or desc)" in run("help")[1]


def test_lines_piped_into_the_shell_run_as_a_script(tmp_path):
    result = hqueue_shell(tmp_path, input="create 'q1', 2, 0\nlist\n")
    assert result.returncode == 0 and "q1" in result.stdout
    result = hqueue_shell(tmp_path, input="scan 'nope'\nlist\n")
    assert result.returncode == 1 and "stopped at <stdin>, line 1" in result.stderr
    result = hqueue_shell(tmp_path, input="count 'q1'\r\nlist\r\n")  # (CRLF: a syntax error, found '\r')
    assert result.returncode == 0 and "q1" in result.stdout, result.stderr


def test_status_shows_owners_and_each_subscribers_lag(run):
    run("create 'q1', 2, 0")
    run("add_subscriber 'q1', 'slow'")
    run("put 'q1', 't', 'waiting', 0")
    ok, out, _ = run("status")
    assert ok and "(this process)" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("slow")]
    assert row[:4] == ["slow", "q1", "(away)", "1"]  # one waiting message is lag, not 0


def test_replay_dlq_copies_dead_letters_back(run):
    run("create 'q1', 2, 0")
    run("create 'q1.dlq', 2, 0")
    run("put 'q1.dlq', 't', 'dead', 1")
    ok, out, _ = run("replay_dlq 'q1'")
    assert ok and "Replayed 1 message(s)" in out
    assert "dead" in run("scan 'q1', {PARTITION => 1}")[1]
    assert "Replayed 1 message(s)" in run("replay_dlq 'q1', {RATE => 50}")[1]  # at most 50 a second
    assert "'rate' must be in" in run("replay_dlq 'q1', {RATE => 0}")[2]
    assert run("replay_dlq 'nope'")[2].startswith("ERROR: queue 'nope' does not exist")


def test_list_and_describe_groups(run, tmp_path):
    run("create 'q1', 2, 0")
    run("put 'q1', 't', 'work', 0")
    with HQueue("q1", f"local://{tmp_path}/data") as queue, queue.consumer("billing") as consumer:
        assert consumer.receive(1, wait=2)
        assert run("list_groups 'q1'")[1].strip().splitlines()[1].split()[0] == "billing"
        ok, out, _ = run("describe_group 'q1', 'billing'")
        assert ok and "members: " in out and "IN FLIGHT" in out
        (zero,) = [line.split() for line in out.splitlines() if line.startswith("0 ")]
        assert zero[3] == "1"  # partition 0: one in flight
    assert run("describe_group 'q1', 'nope'")[2].startswith("ERROR: no consumer group 'nope'")


def test_pending_shows_a_group_s_messages_in_flight(run, tmp_path):
    run("create 'q1', 1, 0")
    run("put 'q1', 't', 'work', 0")
    with HQueue("q1", f"local://{tmp_path}/data") as queue, queue.consumer("billing", member="m1") as consumer:
        assert consumer.receive(1, wait=2)
        ok, out, _ = run("pending 'q1', 'billing'")
    assert ok and out.splitlines()[0].startswith("PARTITION") and out.splitlines()[1].split()[2:4] == ["m1", "1"]
    assert run("pending 'q1', 'nope'")[2].startswith("ERROR: no consumer group 'nope'")


def test_a_reader_that_goes_away_stops_the_shell_quietly(tmp_path):
    # Given `hqueue shell -e "scan 'q'" | head -1` over a queue of 20,000 messages
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
        with admin.queue("q") as queue:
            queue.put([Message("t", b"%d" % i) for i in range(10_000)], 0)
            queue.put([Message("t", b"%d" % i) for i in range(10_000)], 0)
    shell = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", url, "shell", "-e", "scan 'q'"],
        cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert shell.stdout.readline().startswith(b"PARTITION")
    shell.stdout.close()  # head -1 is done
    err = shell.stderr.read().decode()
    assert shell.wait(timeout=60) == 1
    # Then no "internal error" (a broken pipe is not a bug)
    assert "internal error" not in err and "Traceback" not in err, err


def test_a_script_file_takes_the_raw_bytes_piped_lines_take(tmp_path):
    """A script's bytes that are not UTF-8 (a value typed in a Latin-1 editor) stopped a
    script file at its first byte (UnicodeDecodeError) where stdin put them as they are."""
    script = tmp_path / "raw.hq"
    script.write_bytes(b"create 'q1', 1, 0\nput 'q1', 't', 'caf\xe9'\nscan 'q1'\n")
    by_file = hqueue_shell(tmp_path, str(script))
    assert by_file.returncode == 0, by_file.stderr
    assert by_file.stdout.rstrip().splitlines()[-2].endswith("caf\\xe9")
    with HQueue("q1", f"local://{tmp_path}/data") as queue:
        assert [m.value for m in queue.scan()] == [b"caf\xe9"]


def test_a_timer_put_on_a_local_store_says_when_it_fires_once_as_the_cli_does(tmp_path):
    script = tmp_path / "timers.hq"
    script.write_text("create 'tq', 1, 0\nput 'tq', 't', 'v', {DELAY => 60}\nput 'tq', 't', 'w', {DELAY => 60}\n")
    result = hqueue_shell(tmp_path, str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Timer ") == 2
    assert result.stderr.count("a timer fires only while a process has the store open") == 1
