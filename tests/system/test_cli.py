"""The hqueue command line."""

import json
import os
import time

import pytest
from click.testing import CliRunner

from hqueue import HQueue, HQueueAdmin, Message, StorageError
from hqueue.cli import main


@pytest.fixture
def run(tmp_path):
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(main, ["--url", f"local://{tmp_path}", *args], input=input)

    return invoke


def test_put_from_stdin_keeps_each_put_within_a_batchs_cap(run):
    """A put is atomic and never split, so the command cuts stdin into puts that fit."""
    assert run("create", "big", "1", "--max-message-bytes", str(8 * 2**20)).exit_code == 0
    line = b"x" * (6 * 2**20)  # 3 lines of 6 MiB: 18 MiB, over one put's 16 MiB
    result = run("put", "big", "t", input=line + b"\n" + line + b"\n" + line + b"\n")
    assert result.exit_code == 0, result.output
    assert run("count", "big").output.split()[0] == "3"


def test_create_put_scan_describe_drop(run):
    assert run("create", "crawl", "4", "86400").exit_code == 0
    result = run("put", "crawl", "crawler", "http://a", "http://b", "--partition", "2")
    assert result.exit_code == 0 and len(result.output.split()) == 2
    assert run("put", "crawl", "dump", input="l1\nl2\nl3\n").exit_code == 0
    lines = run("scan", "crawl", "--topic", "crawler").output.splitlines()
    assert [line.split("\t")[3] for line in lines] == ["http://a", "http://b"]
    assert len(run("scan", "crawl", "--limit", "4").output.splitlines()) == 4
    description = json.loads(run("describe", "crawl").output)
    assert description["partitions"] == 4 and description["last_ids"]["2"]
    assert description["queue"] == "crawl"  # the key list's rows and describe-group use
    assert [row["queue"] for row in json.loads(run("list", "--format", "json").output)] == ["crawl"]
    assert "crawl" in run("list").output
    assert run("truncate", "crawl").exit_code == 0
    assert run("scan", "crawl").output == ""
    assert run("drop", "crawl").exit_code == 1
    assert run("disable", "crawl").exit_code == 0
    assert run("enable", "crawl").exit_code == 0
    assert run("drop", "crawl", "--force").exit_code == 0
    assert run("list").output == ""


def test_scan_accepts_ids_and_iso_times(run):
    run("create", "q", "1")
    first = run("put", "q", "t", "a").output.strip()
    run("put", "q", "t", "b")
    assert [line.split("\t")[3] for line in run("scan", "q", "--start", first).output.splitlines()] == ["a", "b"]
    assert run("scan", "q", "--stop", first).output == ""
    assert run("scan", "q", "--start", "2000-01-01T00:00").output.count("\n") == 2


def test_user_errors_are_one_line_and_exit_1_and_values_refused_exit_2(run):
    assert run("create", "other", "1").exit_code == 0  # a store, without that queue
    result = run("scan", "missing")
    assert result.exit_code == 1 and "queue 'missing' does not exist" in result.output
    assert "Traceback" not in result.output
    # A value refused is a usage error wherever it is found (an attacker pass: these were 1)
    for refused in (["create", "bad name", "1"], ["cancel", "other", "garbage"], ["consume", "other", "bad name"],
                    ["add-subscriber", "other", "bad name"],
                    ["cancel", "other", "9/1/1:0"], ["create", "cfg", "1", "-c", "k=\udcff"]):  # fmt: skip
        result = run(*refused)
        assert result.exit_code == 2 and result.output.startswith("Error: "), (refused, result.output)
        assert result.output.count("\n") == 1  # one line
    assert run("create", "q", "0").exit_code == 2  # out of range: a usage error, as click reports them
    assert run("scan", "q", "--start", "whenever").exit_code == 2
    assert run("create", "q", "1", "--config", "novalue").exit_code == 2
    assert run("scan", "other", "--topic", "").exit_code == 2  # (it was 1: an empty topic is a refused value)
    for command in ("scan", "count", "tail"):  # and so is one longer than any (it was 1 too)
        long = run(command, "other", "--topic", "x" * 1025)
        assert long.exit_code == 2 and "at most 1024 bytes" in long.output, long.output


def test_demo_runs_the_main_job(run):
    result = run("demo", "--messages", "3000")
    assert result.exit_code == 0, result.output
    assert "msgs/s" in result.output


def test_demo_never_touches_an_existing_queue(run):
    run("create", "demo", "1")
    run("put", "demo", "t", "keep me")
    result = run("demo", "--messages", "1000")
    assert result.exit_code == 0 and "queue: demo-2" in result.output
    assert run("scan", "demo").output.split("\t")[3] == "keep me\n"


def test_cli_errors_name_the_command_to_run(run):
    run("create", "q", "1")
    run("disable", "q")
    assert "hqueue enable-queue q" in run("put", "q", "t", "x").output
    run("enable", "q")
    assert "--force" in run("drop", "q").output
    result = run("--url", "nosuch://x", "list")
    assert result.exit_code == 2 and "hqueue://" in result.output  # a usage error, as a bare path


def test_version_help_and_url_after_the_command(run, tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["--version"]).output.startswith("hqueue, version")
    assert "Usage" in runner.invoke(main, ["-h"]).output
    assert runner.invoke(main, ["create", "q", "1", "--url", f"local://{tmp_path}/late"]).exit_code == 0
    assert runner.invoke(main, ["list", f"--url=local://{tmp_path}/late"]).output.splitlines()[1].split()[0] == "q"
    # Two different stores, one before the command and one after: refused (the one before was
    # used, silently: a put went to the other store)
    both = runner.invoke(
        main, ["--url", f"local://{tmp_path}/other", "put", "q", "t", "v", "--url", f"local://{tmp_path}/late"]
    )
    assert both.exit_code == 2 and "--url given before the command and after it" in both.output, both.output


def test_read_only_commands_never_create_a_store(tmp_path):
    missing = tmp_path / "nothing-here"
    for args in (["list"], ["scan", "q"], ["count", "q"], ["describe", "q"]):
        result = CliRunner().invoke(main, ["--url", f"local://{missing}", *args])
        assert result.exit_code == 1 and "no hqueue store at" in result.output
    assert not missing.exists()


def test_binary_values_round_trip_through_put_and_scan(run):
    import base64

    run("create", "q", "1")
    raw = bytes(range(256))
    assert run("put", "q", "raw", "--input", "raw", input=raw).exit_code == 0
    assert run("put", "q", "b64", "--input", "base64", input=base64.b64encode(raw) + b"\n").exit_code == 0
    lines = run("scan", "q", "--format", "base64").output.splitlines()
    assert [base64.b64decode(line.split("\t")[3]) for line in lines] == [raw, raw]
    text = run("scan", "q", "-t", "raw").output
    assert text.count("\n") == 1 and "\\t" in text and "\\n" in text and "\\xff" in text
    objects = [json.loads(line) for line in run("scan", "q", "--format", "json").output.splitlines()]
    assert base64.b64decode(objects[0]["value_base64"]) == raw
    assert run("count", "q", "-t", "b64").output == "1\n"
    bad = run("put", "q", "t", "--input", "hex", input=b"zz\n")
    assert bad.exit_code == 1 and "stdin line 1 is not hex" in bad.output
    # Bad base64 is refused as bad hex is (its stray characters were dropped: "!!!" stored b"")
    bad = run("put", "q", "t", "--input", "base64", input=b"!!!\n")
    assert bad.exit_code == 1 and "stdin line 1 is not base64" in bad.output
    assert run("count", "q").output == "2\n"
    # JSON gives a topic as text, as a value (it was escaped twice: "x\\ny")
    assert run("put", "q", "x\ny", "v").exit_code == 0
    assert json.loads(run("scan", "q", "-t", "x\ny", "--format", "json").output)["topic"] == "x\ny"


def test_a_store_path_that_is_a_file_is_a_clear_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    result = CliRunner().invoke(main, ["--url", f"local://{afile}", "create", "q", "1"])
    assert result.exit_code == 1 and "not a directory" in result.output and "Traceback" not in result.output
    with pytest.raises(StorageError, match="cannot open the embedded store .*: it is not a directory"):
        HQueueAdmin(data_dir=afile).list_queues()
    assert afile.read_text() == "mine"


def test_tail_follows_every_partition_and_prints_each_message_once(tmp_path):
    import threading
    import time

    from hqueue import HQueue, HQueueAdmin, Message

    url = f"local://{tmp_path}/tail"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 3)
    queue = HQueue("q", url)  # the same process: the CLI shares the open store

    def write() -> None:
        for i in range(12):
            queue.put(Message("t", b"m%d" % i), partition_id=(2 - i % 3))  # later IDs land in lower partitions
            time.sleep(0.05)

    since = str(int(time.time() * 1000))  # before the first put: the writer may beat tail to it
    writer = threading.Thread(target=write)
    writer.start()
    result = CliRunner().invoke(
        main, ["--url", url, "tail", "q", "--start", since, "--for", "1.5", "--interval", "0.05"]
    )
    writer.join()
    queue.close()
    assert result.exit_code == 0, result.output
    values = [line.split("\t")[3] for line in result.output.splitlines()]
    assert sorted(values) == sorted(f"m{i}" for i in range(12))


def test_tail_follows_one_partition_with_partition(run):
    """``--partition`` as scan has it: only that partition's messages; one the queue does not
    have is refused as scan refuses it (exit status 2)."""
    assert run("create", "q", "3").exit_code == 0
    for pid in range(3):
        assert run("put", "q", "t", f"p{pid}", "--partition", str(pid)).exit_code == 0
    result = run("tail", "q", "--start", "1", "--partition", "1", "--for", "0.3")
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[:1] + line.split("\t")[3:] for line in result.output.splitlines()] == [["1", "p1"]]
    refused = run("tail", "q", "--partition", "3", "--for", "0.3")
    assert refused.exit_code == 2 and "must be in 0..2 for queue 'q', got 3" in refused.output, refused.output


def test_tail_stops_at_a_queue_made_again_and_prints_none_of_it(tmp_path):
    """Each poll was a new scan, so a tail printed the messages of a queue deleted and made
    again under its name between two polls, and exited 0 (an attacker's probe)."""
    import threading

    from hqueue import Message

    url = f"local://{tmp_path}/tail"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"old"))
        since = "1"  # (from the start)

        def remake() -> None:
            time.sleep(0.3)  # (between the polls at 0 and 1 s)
            admin.disable_queue("q")
            admin.delete_queue("q")
            admin.create_queue("q", 1)
            with HQueue("q", url) as again:
                again.put(Message("t", b"new"))

        remaking = threading.Thread(target=remake)
        remaking.start()
        result = CliRunner().invoke(
            main, ["--url", url, "tail", "q", "--start", since, "--for", "1.5", "--interval", "1"]
        )
        remaking.join()
    assert "old" in result.output and "\tnew" not in result.output, result.output
    assert result.exit_code == 1 and "deleted and created again" in result.output, result.output


def test_timers_from_the_cli_put_cancel_and_fire(run):
    assert run("create", "q", "1").exit_code == 0
    later = run("put", "q", "t", "later", "--delay", "0.3")
    assert later.exit_code == 0 and later.stdout.count("/") == 2  # a timer handle, not an ID
    assert "fires only while a process has the store open" in later.stderr  # local://: say so
    never = run("put", "q", "t", "never", "--delay", "60").stdout.strip()
    assert run("cancel", "q", never).output == f"{never}\tcancelled\n"
    # from stdin too, lines or raw (it printed only a count: the timers could not be cancelled)
    for given in ((), ("--input", "raw")):
        piped = run("put", "q", "t", "--delay", "60", *given, input=b"a\nb\n" if not given else b"whole")
        handles = piped.stdout.split()
        assert piped.exit_code == 0 and len(handles) == (2 if not given else 1), piped.output
        assert run("cancel", "q", *handles).exit_code == 0
    again = run("cancel", "q", never)  # cancelled already: said, and a failure for scripts
    assert again.exit_code == 1
    assert again.output.splitlines() == [
        f"{never}\tnot pending (fired or cancelled already)",
        "Error: 1 of 1 timer(s) not pending: fired or cancelled already",
    ]
    assert "timer handle" in run("cancel", "q", "nonsense").output
    # A refused handle among good ones cancels none of them (those before it were cancelled)
    kept = run("put", "q", "t", "kept", "--delay", "60").stdout.strip()
    refused = run("cancel", "q", kept, "garbage")
    assert refused.exit_code == 2 and "timer handle" in refused.output
    assert run("cancel", "q", kept).output == f"{kept}\tcancelled\n"
    for mistake in (
        "10:00",
        "2027",
        f"{int(time.time() * 1000) + 60_000}:3",
        "1970-01-01T00:00",
    ):  # a time of day, seconds, an ID, 0 as a date
        refused = run("put", "q", "t", "x", "--at", mistake)
        assert refused.exit_code == 2 and "UTC unless it has an offset" in refused.output, refused.output
    assert run("create", "short", "1", "60").exit_code == 0  # a queue whose messages live a minute
    at_once = run("put", "short", "t", "now", "--at", "0")  # 0: at once, not 55 years ago
    assert at_once.exit_code == 0, at_once.output
    both = run("put", "short", "t", "x", "--at", "0", "--delay", "5")
    assert both.exit_code == 2 and "give --at or --delay, not both" in both.output, both.output
    consumed = run("consume", "q", "g", "--max", "1", "--for", "10")
    assert consumed.exit_code == 0
    assert consumed.output.split("\t")[2:] == ["1", "t", "later\n"]  # attempt 1


def test_consume_acks_what_it_prints_and_groups_are_listed_and_described(run):
    run("create", "q", "2")
    run("put", "q", "t", "a", "b", "c", "--partition", "1")
    first = run("consume", "q", "workers", "--max", "2", "--format", "json")
    assert [json.loads(line)["value"] for line in first.output.splitlines()] == ["a", "b"]
    second = run("consume", "q", "workers", "--for", "0.5")
    assert [line.split("\t")[-1] for line in second.output.splitlines()] == ["c"]
    peek = run("consume", "q", "others", "--for", "0.5", "--no-ack")
    assert len(peek.output.splitlines()) == 3
    table = run("groups", "q").output.splitlines()
    assert table[0].split()[:4] == ["GROUP", "MEMBERS", "IN", "FLIGHT"] and len(table) == 4
    assert table[1].split()[0] == "others" and table[1].split()[4] == "3"  # lag: printed, never acked
    assert table[2].split()[0] == "workers" and table[2].split()[4] == "0"
    assert table[1].split()[-1] == table[2].split()[-1] == "0"  # DEAD-LETTERED by each group
    assert table[3].startswith("dead letters: 0 in q.dlq now (the queue's, shared by its groups;")
    rows = json.loads(run("groups", "q", "--format", "json").output)
    assert [(r["group"], r["lag_messages"], r["dead_letters"], r["dead_lettered"]) for r in rows] == [
        ("others", 3, 0, 0),
        ("workers", 0, 0, 0),
    ]
    described = json.loads(run("describe-group", "q", "others").output)
    assert described["partitions"]["1"]["lag_messages"] == 3  # printed, never acked
    assert "no consumer group 'nope'" in run("describe-group", "q", "nope").output
    assert "does not exist" in run("consume", "missing", "g", "--for", "0").output


def test_replay_group_takes_the_group_back(run):
    run("create", "q", "1")
    run("put", "q", "t", "a")
    assert run("consume", "q", "g", "--max", "1").output.endswith("\ta\n")
    replayed = run("replay-group", "q", "g", "--from", "0")
    assert replayed.exit_code == 0 and "every partition" in replayed.output
    assert run("consume", "q", "g", "--max", "1").output.endswith("\ta\n")


def test_pending_shows_a_group_s_messages_in_flight(run, tmp_path):
    assert run("create", "q", "1").exit_code == 0
    assert run("put", "q", "t", "v1", "v2").exit_code == 0
    with HQueue("q", f"local://{tmp_path}") as queue, queue.consumer("billing", member="m1") as member:
        assert len(member.receive(2, wait=2)) == 2
        result = run("pending", "q", "billing")  # this process holds the group's state: ask it here
        assert result.exit_code == 0, result.output
        lines = result.output.strip().splitlines()
        assert lines[0].split()[:4] == ["PARTITION", "ID", "MEMBER", "ATTEMPT"] and len(lines) == 3
        assert all(line.split()[2:4] == ["m1", "1"] for line in lines[1:])
        rows = json.loads(run("pending", "q", "billing", "--format", "json", "--limit", "1").output)
        assert len(rows) == 1 and rows[0]["member"] == "m1" and rows[0]["attempt"] == 1
    result = run("pending", "q", "nope")
    assert result.exit_code == 1 and "no consumer group 'nope'" in result.output


def test_a_store_held_by_hqueue_server_names_the_flag_and_the_way_out(tmp_path):
    import subprocess
    import sys

    from hqueue import HQueueAdmin, StorageLocked
    from hqueue.storage.lockholder import lock_holder

    from ..processes import ROOT, free_port, python_env, wait_for

    url, port = f"local://{tmp_path}/data", free_port()
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    # Given `hqueue server` holding the store, serving TCP and not the store's socket
    server_args = ["--url", url, "server", "--port", str(port), "--no-local-socket"]
    holder = subprocess.Popen([sys.executable, "-m", "hqueue.cli", *server_args], cwd=ROOT, env=python_env())
    try:
        runner = CliRunner()
        wait_for(lambda: lock_holder(f"{tmp_path}/data"), 30, "the server to hold the store")
        # When another command opens it
        result = runner.invoke(main, ["--url", url, "list"])
        assert result.exit_code == 1, result.output
        # Then the error names the CLI's way out, not Python's, and who holds the store, on one line:
        # the server's own address (it named 127.0.0.1:9700, whatever the port)
        assert f"it serves hqueue://127.0.0.1:{port}; give every command --url hqueue://127.0.0.1:{port}" in (
            result.output
        )
        assert result.output.count("\n") == 1, result.output
        assert "url='" not in result.output and "Traceback" not in result.output
        assert f"(pid {holder.pid}: hqueue --url {url}"[:100] in result.output  # Linux: /proc/locks (cut at 120)
        assert runner.invoke(main, ["--url", f"hqueue://127.0.0.1:{port}", "list"]).exit_code == 0  # the way out
        server = runner.invoke(main, ["--url", url, "server", "--port", "0"])
        assert server.exit_code == 1 and "stop that process first" in server.output
        # And the Python API keeps its Python hint
        with pytest.raises(StorageLocked, match="url='hqueue://host:port'"):
            HQueueAdmin(url)
        # And so it does with a socket file a killed holder left: it was taken for a serving
        # process, and the command waited out its 30 s timeout for an answer (an acceptance probe)
        import socket as socket_module

        with socket_module.socket(socket_module.AF_UNIX) as stale:
            stale.bind(f"{tmp_path}/data/hqueue.sock")
        result = runner.invoke(main, ["--url", url, "list"])
        assert result.exit_code == 1 and f"(pid {holder.pid}" in result.output, result.output
    finally:
        holder.kill()
        holder.wait()


def test_a_directory_where_the_store_s_socket_goes_is_one_clear_error(tmp_path):
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        admin.create_queue("q", 1)
    os.makedirs(f"{tmp_path}/data/hqueue.sock")
    result = CliRunner().invoke(main, ["--url", f"local://{tmp_path}/data", "list"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "hqueue.sock is a directory: hqueue keeps the store's socket there (remove it)" in result.output


def test_negative_numbers_reach_the_range_check(run):
    result = run("create", "neg", "-1")
    assert result.exit_code == 2 and "'PARTITIONS': -1 is not in the range 1<=x<=32767" in result.output
    assert "No such option" not in result.output
    assert "'[TTL]': -5 is not in the range" in run("create", "neg", "1", "-5").output
    assert "'PARTITIONS': '-inf' is not a valid integer" in run("create", "neg", "-inf").output
    # options still parse around them, and an unknown one is still refused
    assert "No such option '--bogus'" in run("create", "neg", "-1", "--bogus").output
    assert "-1 is not in the range" in run("create", "neg", "--priorities", "2", "-1").output
    run("create", "q", "1")
    assert run("put", "q", "t", "-5", "--partition", "0").exit_code == 0  # a negative value is a value
    assert run("scan", "q").output.split("\t")[3] == "-5\n"


def test_a_partition_the_queue_does_not_have_is_refused_as_a_bad_option(run):
    """`put -p 99` on a 2-partition queue exited 1 naming the API's 'partition_id', where
    `-p -1` exits 2 naming the option: both are the option's refusal now."""
    run("create", "q", "2")
    for args in (["put", "q", "t", "v", "-p", "99"], ["scan", "q", "--partition", "2"], ["count", "q", "-p", "7"]):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Invalid value for '--partition' / '-p': must be in 0..1 for queue 'q'" in result.output
        assert "partition_id" not in result.output
    result = run("put", "q", "t", "v", "-k", "a", "-p", "0")
    assert result.exit_code == 2 and "give --partition or --key, not both" in result.output, result.output
    # a queue named as an option, and a value --config gave, are not taken for an option's
    run("create", "key", "2", "--priorities", "2")
    result = run("put", "key", "t", "v", "--priority", "0", "-p", "1")
    assert result.exit_code == 2 and "partition 1 of 'key' is not in priority tier 0" in result.output
    result = run("create", "q2", "1", "--config", "hqueue.durability=bogus")
    assert result.exit_code == 2 and "--durability" not in result.output, result.output


def test_describing_a_group_of_a_missing_queue_says_the_queue_is_missing(run):
    run("create", "q", "1")
    for command in ("describe-group", "pending"):
        result = run(command, "nosuch", "g")
        assert result.exit_code == 1 and result.output == "Error: queue 'nosuch' does not exist\n"
    assert "no consumer group 'g' on queue 'q'" in run("describe-group", "q", "g").output


def test_a_host_that_is_no_address_is_named(tmp_path):
    result = CliRunner().invoke(
        main, ["server", "--storage", f"local://{tmp_path}", "--host", "0.0.0.0.0", "--port", "0"]
    )
    assert result.exit_code == 1 and "cannot listen on 0.0.0.0.0:0" in result.output
    assert "Traceback" not in result.output


def test_every_listing_and_describe_command_prints_a_table_or_json(run, tmp_path):
    from hqueue.commands import COMMANDS

    run("create", "q", "2")
    run("put", "q", "t", "a", "b")
    run("consume", "q", "g", "--max", "1", "--no-ack")
    run("add-subscriber", "q", "s")
    arguments = {"queue": "q", "group": "g", "subscriber": "s"}
    views = [c for c in COMMANDS.values() if c.read_only]
    assert {c.cli_name for c in views} >= {"list", "list-groups", "list-subscribers", "describe", "describe-group",
                                           "describe-subscriber", "pending", "status"}  # fmt: skip
    for command in views:
        args = [command.cli_name, *(arguments[p.name] for p in command.params if p.required)]
        table = run(*args, "--format", "table")
        assert table.exit_code == 0 and table.output.strip(), (args, table.output)
        assert not table.output.lstrip().startswith(("{", "[")), args  # a table for people, even for describe
        data = run(*args, "--format", "json")
        assert data.exit_code == 0, (args, data.output)
        json.loads(data.output)


def test_consume_exec_acks_on_exit_0_and_nacks_otherwise(run, tmp_path):
    run("create", "q", "1")
    run("put", "q", "t", "ok", "bad")
    seen = tmp_path / "seen.txt"
    # Given a command that fails on "bad"
    command = f'v=$(cat); echo "$HQUEUE_ATTEMPT $HQUEUE_TOPIC $v" >> {seen}; [ "$v" != bad ]'
    result = run("consume", "q", "g", "--exec", command, "--nack-delay", "0", "--for", "2")
    assert result.exit_code == 0, result.output
    lines = seen.read_text().splitlines()
    # Then "ok" went once and was acked; "bad" was nacked and came back, attempt after attempt
    assert lines[:3] == ["1 t ok", "1 t bad", "2 t bad"]
    assert lines.count("1 t ok") == 1
    assert "hqueue consume: nacked 0/" in result.output and "(attempt 1): exit status 1" in result.output
    described = json.loads(run("describe-group", "q", "g").output)
    assert described["partitions"]["0"]["done"] != "0:0"  # "ok" is acked: the cursor moved
    assert "--exec acks or nacks" in run("consume", "q", "g", "--exec", "true", "--no-ack").output


def test_consume_exec_gives_a_topic_with_a_nul_byte_as_scan_prints_it(run, tmp_path):
    """No environment variable holds a NUL: `consume --exec` died on such a topic ("embedded
    null byte", exit 1) at every restart, and the messages behind it waited (an attacker pass)."""
    from hqueue import HQueue, Message

    run("create", "q", "1")
    with HQueue("q", f"local://{tmp_path}") as queue:
        queue.put([Message(b"n\x00t", b"first"), Message("t", b"second")], partition_id=0)
    seen = tmp_path / "seen.txt"
    result = run("consume", "q", "g", "--exec", f'echo "$HQUEUE_TOPIC $(cat)" >> {seen}', "--for", "1.5")
    assert result.exit_code == 0, result.output
    assert seen.read_text().splitlines() == ["n\\x00t first", "t second"]


def test_shell_completion_scripts_for_bash_and_zsh():
    import subprocess
    import sys

    from ..processes import ROOT, python_env

    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "compdef")):
        env = dict(python_env(), _HQUEUE_COMPLETE=f"{shell}_source")
        out = subprocess.run(
            [sys.executable, "-c", "from hqueue.cli import main; main(prog_name='hqueue')"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0 and marker in out.stdout and "_HQUEUE_COMPLETE" in out.stdout, out.stderr
    # and the completion itself answers: the commands after `hqueue des`
    env = dict(python_env(), _HQUEUE_COMPLETE="bash_complete", COMP_WORDS="hqueue des", COMP_CWORD="1")
    out = subprocess.run(
        [sys.executable, "-c", "from hqueue.cli import main; main(prog_name='hqueue')"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert {"describe", "describe-group", "describe-subscriber"} <= {line.split(",")[-1] for line in out.stdout.split()}


def test_ctrl_c_stops_tail_and_consume_with_status_130_and_hands_leases_back(tmp_path):
    """tail and consume exited 0 on Ctrl-C where put exits 130; and consume --exec's
    message in hand was said to come back when its lease ends (it comes back at once)."""
    import os
    import signal
    import subprocess
    import sys

    from hqueue import Message

    from ..processes import ROOT, Proc, python_env, wait_for

    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as queue:
        queue.put(Message("t", b"in-hand"))
    marker = tmp_path / "started"
    tail = Proc("-m", "hqueue.cli", "--url", url, "tail", "q", "--start", "0")
    consume = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", url, "consume", "q", "g", "--lease", "600",
         "--exec", f"touch {marker}; sleep 60"],
        cwd=ROOT, env=python_env(), stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: "in-hand" in "".join(tail.lines), 60, "tail to print the message")
        wait_for(marker.exists, 60, "consume to run its command")
        tail.proc.send_signal(signal.SIGINT)
        os.killpg(consume.pid, signal.SIGINT)  # as a terminal's Ctrl-C: its command gets it too
        assert tail.proc.wait(timeout=30) == 130 and consume.wait(timeout=30) == 130
        assert "Traceback" not in consume.stderr.read()
        with HQueue("q", url) as queue, queue.consumer("g") as consumer:  # back now, not in 600 s
            assert [d.value for d in consumer.receive(wait=5)] == [b"in-hand"]
        # And tail on SIGTERM or SIGHUP (a service manager's stop, its terminal closed) ends as on
        # Ctrl-C (it was killed by them, 143 and 129: a holder of the store dying uncleanly)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            tail = Proc("-m", "hqueue.cli", "--url", url, "tail", "q", "--start", "0")
            wait_for(lambda t=tail: "in-hand" in "".join(t.lines), 60, "tail to print the message")
            tail.proc.send_signal(signum)
            assert tail.proc.wait(timeout=30) == 130
    finally:
        tail.kill()
        consume.kill()


def test_a_topic_or_key_as_scan_prints_it_names_the_same_bytes(run, tmp_path):
    """`scan` printed a topic b"b\\xff" as `b\\xff`, which `--topic` read as the four characters
    (nothing found), while the shell and the console read it as the byte (an attacker pass)."""
    from hqueue import HQueue, Message

    run("create", "q", "4")
    with HQueue("q", f"local://{tmp_path}") as queue:
        queue.put([Message(b"b\xff", b"odd"), Message(b"a\tb", b"tab"), Message(b"c\\d", b"slash")], partition_id=0)
        queue.put(Message("t", b"keyed"), key=b"k\x01")
    printed = [line.split("\t")[2] for line in run("scan", "q", "-p", "0").output.splitlines()]
    assert printed == ["b\\xff", "a\\tb", "c\\\\d"]
    for topic, value in zip(printed, ["odd", "tab", "slash"], strict=True):
        found = run("scan", "q", "--topic", topic).output.splitlines()
        assert [line.split("\t")[3] for line in found] == [value], (topic, found)
    # and a subscriber's topics are read so too
    assert run("add-subscriber", "q", "s1", "--topics", "b\\xff").exit_code == 0
    assert json.loads(run("describe-subscriber", "q", "s1").output)["topics"] == ["b\\xff"]
    # and a key given as it would be printed routes as the bytes it names
    assert run("put", "q", "t", "same key", "-k", "k\\x01").exit_code == 0
    where = {line.split("\t")[3]: line.split("\t")[0] for line in run("scan", "q").output.splitlines()}
    assert where["same key"] == where["keyed"]


def test_options_that_do_nothing_together_are_usage_errors(run):
    """Each was ignored without a word: `put q t aGk= --input base64` stored the text as it
    was, `consume --nack-delay` without --exec nacked nothing, `create -c k=a -c k=b` kept
    the last (an attacker pass)."""
    assert run("create", "q", "1").exit_code == 0
    for args, said in (
        (["put", "q", "t", "aGk=", "--input", "base64"], "--input is for stdin"),
        (["put", "q", "t", "v", "--linger", "1"], "--linger is for stdin"),
        (["consume", "q", "g", "--nack-delay", "5", "--for", "1"], "--nack-delay is for what --exec nacks"),
        (["create", "z", "1", "-c", "k=a", "-c", "k=b"], "k given more than once"),
    ):
        result = run(*args)
        assert result.exit_code == 2 and said in result.output, (args, result.output)
    assert run("scan", "q").output == "" and "z" not in run("list").output  # nothing done


def test_the_held_store_hint_names_an_address_only_where_the_holder_s_command_line_says_it():
    from hqueue.cli.main import _served_at

    assert _served_at("pid 999999999: hqueue server --storage local:///x --port 9801") == "hqueue://127.0.0.1:9801"
    assert _served_at("pid 999999999: hqueue --url local:///x server --host=0.0.0.0 --port=7") == "hqueue://127.0.0.1:7"
    assert _served_at("pid 999999999: hqueue server --storage local:///x") == "hqueue://127.0.0.1:9700"  # the defaults
    for unknown in (
        "pid 999999999: hqueue server --storage local:///x --port 0",  # picked at start
        "pid 999999999: hqueue server --storage local:///a-long-path --no-local-socket --log-level WARN…",  # cut short
        "pid 999999999: hqueue tail server",  # a queue named server
        "pid 999999999: python app.py",
        None,
    ):
        assert _served_at(unknown) is None, unknown


def test_consume_goes_on_when_the_store_answers_again_after_a_stop_past_its_deadline(tmp_path):
    """consume ended (status 1) on the first receive that outlived its deadline, the moment
    the stopped store came back, and left the messages put after (an attacker's pass): it
    says so on stderr, asks again, and goes on."""
    import signal
    import subprocess
    import sys

    from hqueue import Message

    from ..processes import ROOT, ServerProcess, python_env, wait_for

    server = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{server.address}?timeout=2"
    consume = None
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        consume = subprocess.Popen(
            [sys.executable, "-m", "hqueue.cli", "--url", url, "consume", "q", "g", "--for", "60"],
            cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"before"))
        out: list[str] = []
        import threading

        threading.Thread(target=lambda: out.extend(consume.stdout), daemon=True).start()
        wait_for(lambda: any("before" in line for line in out), 30, "consume to print the first message")
        server.pause()
        time.sleep(5)  # past the consumer's 2 s deadline
        server.resume()
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"after"))
        wait_for(lambda: any("after" in line for line in out), 30, "consume to go on after the stop")
        assert consume.poll() is None
    finally:
        if consume is not None:
            consume.send_signal(signal.SIGINT)
            consume.wait(timeout=30)
        server.kill()
    assert "asking again" in consume.stderr.read()


def test_what_the_front_ends_disagreed_on_is_refused_alike(run):
    """An attacker's pass: replay-group's help showed TIME as optional, then required it;
    --priorities and -c hqueue.priorities differing made a queue by one of them, unsaid."""
    assert "QUEUE GROUP TIME\n" in run("replay-group", "--help").output
    clash = run("create", "p1", "4", "-c", "hqueue.priorities=2", "--priorities", "1")
    assert clash.exit_code == 2 and "'priorities' is 1 and config 'hqueue.priorities' is '2'" in clash.output
    made = run("create", "p2", "4", "-c", "hqueue.priorities=2")
    assert made.exit_code == 0, made.output
    assert run("create", "p3", "2", "-c", "hqueue.priorities=\u00b2").exit_code == 2


def test_a_server_given_tls_files_that_do_not_load_says_so_in_one_line(tmp_path):
    """A key given as the certificate (or any file not PEM) ended `hqueue server` with a
    traceback (ssl.SSLError: PEM lib; a fresh user's pass)."""
    not_pem = tmp_path / "cert.pem"
    not_pem.write_text("not a certificate\n")
    result = CliRunner().invoke(
        main,
        [
            "--url",
            f"local://{tmp_path}/data",
            "server",
            "--port",
            "0",
            "--tls-cert",
            str(not_pem),
            "--tls-key",
            str(not_pem),
        ],
    )
    assert result.exit_code == 2 and "cannot load the certificate" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "data").exists()


def test_tail_backs_off_while_its_server_does_not_answer_and_goes_on_after(tmp_path):
    """tail printed a line each --interval (0.2 s) while a server was down, with no backoff
    (32 lines in 6 s; a fresh user's pass): now as consume, 0.5 s doubling to 5 s."""
    import subprocess
    import sys

    from ..processes import ROOT, ServerProcess, python_env

    server = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    tail = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", url, "tail", "q", "--start", "0", "--for", "12"],
        cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)
        server.kill()
        time.sleep(4)  # (at 0.2 s a line: 20)
        server.start()
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"after"), partition_id=0)
        out, err = tail.communicate(timeout=30)
    finally:
        tail.kill()
        server.kill()
    assert "after" in out
    said = [line for line in err.splitlines() if "asking again" in line]
    assert 1 <= len(said) <= 6, err


def test_consume_exec_renews_the_lease_of_a_command_longer_than_the_servers_max_lease(tmp_path):
    """--lease past the server's --max-lease was cut to it without a word, and a command longer
    than that ran twice: its message went to another member meanwhile (a fresh user's pass)."""
    import subprocess
    import sys

    from ..processes import ROOT, ServerProcess, python_env

    server = ServerProcess(f"local://{tmp_path}/data", tmp_path, extra_args=("--max-lease", "1"))
    url = f"hqueue://{server.address}"
    assert f"no hqueue store at {tmp_path}/data: a new one is made there" in server.log_path.read_text()
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            queue.put(Message("t", b"job"), partition_id=0)
        runs = tmp_path / "runs"
        command = f"cat >> {runs}; echo >> {runs}; sleep 4"
        consume = ["--url", url, "consume", "q", "g", "--lease", "30", "--max", "1", "--for", "20"]
        first = subprocess.Popen(
            [sys.executable, "-m", "hqueue.cli", *consume, "--exec", command], cwd=ROOT, env=python_env()
        )
        time.sleep(1.5)  # (the job running, past its granted lease of 1 s)
        second = CliRunner().invoke(main, ["--url", url, "consume", "q", "g", "--for", "4", "--max", "1"])
        assert first.wait(timeout=30) == 0
    finally:
        server.kill()
    assert second.output == "" and runs.read_text() == "job\n"


def test_replay_dlq_of_a_queue_without_dead_letters_says_so(run):
    """It said "Replayed 0 message(s) from q.dlq", a queue that does not exist."""
    assert run("create", "calm", "1").exit_code == 0
    result = run("replay-dlq", "calm")
    assert result.exit_code == 0 and "Replayed 0 messages: 'calm' has no dead letters" in result.output, result.output
    assert run("replay-dlq", "nosuch").exit_code == 1


def test_delete_queue_says_where_its_dead_letters_stay(run, tmp_path):
    """A queue deleted kept ``<q>.dlq`` without a word: made again, a replay put the old
    queue's dead letters on the new one."""
    assert run("create", "calm", "1").exit_code == 0
    assert run("delete-queue", "calm", "--force").output.strip() == "Deleted queue 'calm'"
    assert run("create", "orders", "1").exit_code == 0 and run("create", "orders.dlq", "1").exit_code == 0
    said = run("delete-queue", "orders", "--force").output
    assert "its dead letters stay in 'orders.dlq'" in said, said
    assert run("scan", "orders.dlq").exit_code == 0  # (kept)
