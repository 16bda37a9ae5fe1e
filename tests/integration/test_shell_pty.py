"""The interactive shell as a person uses it, in a real pseudo-terminal (pexpect)."""

import sys

import pexpect
import pytest

from ..processes import ROOT, python_env

PROMPT = r"hqueue\(main\):\d{3}:0>"  # prompt_toolkit draws the trailing space apart


@pytest.fixture
def shell(tmp_path):
    env = python_env()
    env.update(HOME=str(tmp_path), HQUEUE_HISTORY=str(tmp_path / "history"), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(
        sys.executable, ["-m", "hqueue.cli", "--url", f"local://{tmp_path}/data", "shell"],
        cwd=str(ROOT), env=env, encoding="utf-8", timeout=30, dimensions=(40, 200),
    )  # fmt: skip
    child.expect("Type help for the commands")
    child.expect(PROMPT)
    yield child
    child.close(force=True)


def test_type_complete_fail_cancel_and_leave(shell, tmp_path):
    # Given a person at the prompt, typing a command
    shell.sendline("create 'crawl', 4, 86400")
    shell.expect("Created queue 'crawl'")
    shell.expect(r"Took \d+\.\d{4} seconds")
    shell.expect(PROMPT)
    shell.sendline("put 'crawl', 'crawler', 'http://example.com', 2")
    shell.expect(r"Put \d+:0")
    shell.expect(PROMPT)
    # When they complete a command name and a queue name with Tab
    shell.send("sca")
    shell.send("\t")
    shell.send(" 'cr")
    shell.send("\t")
    shell.send("\r")
    # Then the completed command runs
    shell.expect("http://example.com")
    shell.expect(r"1 row\(s\) in \d+\.\d{4} seconds")
    shell.expect(PROMPT)
    # Tab on an ambiguous start fills in the common prefix, as irb does: "des" -> "desc"
    shell.send("des")
    shell.send("\t")
    shell.send(" 'crawl'\r")
    shell.expect("durability")
    shell.expect(PROMPT)
    # When they make a mistake, they see one line, and carry on
    shell.sendline("scan 'nope'")
    shell.expect("ERROR: queue 'nope' does not exist")
    shell.expect(PROMPT)
    shell.sendline("scan 'crawl', {LIMIT 3}")
    shell.expect("at column 22")
    shell.expect(PROMPT)
    # Ctrl-C drops a half-typed line
    shell.send("drop_queue 'crawl'")
    shell.sendcontrol("c")
    shell.expect(PROMPT)
    shell.sendline("count 'crawl'")
    shell.expect(r"1 row\(s\)")
    shell.expect(PROMPT)
    # And Ctrl-D leaves, cleanly
    shell.sendcontrol("d")
    shell.expect(pexpect.EOF)
    shell.close()
    assert shell.exitstatus == 0
    history = (tmp_path / "history").read_text()
    assert "create 'crawl', 4, 86400" in history and "drop_queue" not in history


def test_help_and_exit(shell):
    shell.sendline("help 'create'")
    shell.expect("hbase.hqueue.partitionsPerRegion")
    shell.expect(PROMPT)
    shell.sendline("exit")
    shell.expect(pexpect.EOF)
