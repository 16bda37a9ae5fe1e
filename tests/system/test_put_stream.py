"""``hqueue put`` from a pipe that stays open, and Ctrl-C in the middle: a real
``hqueue put`` process, a real pipe, a real server to look at the queue from outside."""

import array
import fcntl
import signal
import subprocess
import sys
import termios
import time

import pytest

from hqueue import HQueue, HQueueAdmin

from ..processes import ROOT, ServerProcess, python_env, wait_for


@pytest.fixture
def server(tmp_path):
    server = ServerProcess(f"local://{tmp_path}/data", tmp_path)
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    yield url
    server.kill()


def _put(url: str, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", url, "put", "q", "t", *options],
        cwd=ROOT, env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _count(url: str) -> int:
    with HQueue("q", url) as queue:
        return sum(1 for _ in queue.scan())


def test_a_partial_batch_goes_while_the_pipe_stays_open(server):
    # Given `(seq 1 5; sleep …) | hqueue put q t`: five lines, and the pipe left open
    put = _put(server)
    try:
        put.stdin.write(b"1\n2\n3\n4\n5\n")
        put.stdin.flush()
        # Then the five are stored while hqueue put still waits for more (the linger, not the end of input)
        wait_for(lambda: _count(server) == 5, 20, "the 5 lines to be stored")
        assert put.poll() is None
        # And a line that comes later goes too
        put.stdin.write(b"6\n")
        put.stdin.flush()
        wait_for(lambda: _count(server) == 6, 20, "the 6th line")
        assert put.poll() is None
    finally:
        _, err = put.communicate(timeout=30)
    assert put.returncode == 0 and err.decode().strip() == "put 6 message(s)"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_sends_what_was_read_and_counts_it(server, stop):
    """SIGTERM (a service manager's stop) killed the command with no summary, exit 143, and
    the lines held for their batch went nowhere (an attacker pass): it does as Ctrl-C now."""
    # Given 1,500 lines (a full batch of 1,000 goes at once; 500 wait for a linger of a minute)
    # and an unfinished last line
    put = _put(server, "--linger", "60")
    put.stdin.write(b"".join(b"%d\n" % i for i in range(1500)) + b"abc")
    put.stdin.flush()
    wait_for(lambda: _unread(put.stdin) == 0, 20, "every byte read")  # (on a busy machine it lagged)
    wait_for(lambda: _count(server) >= 1000, 20, "the first batch")
    # When Ctrl-C (or SIGTERM) comes, the pipe still open (closed first, its end makes "abc"
    # a whole last line: on a busy machine the command read that end before the signal)
    put.send_signal(stop)
    put.wait(timeout=30)
    err = put.stderr.read()
    put.stdin.close()
    put.stdout.close()
    put.stderr.close()
    # Then the 500 are sent, and the count says so, to the line
    assert put.returncode == 130
    assert err.decode().splitlines() == [
        "hqueue put: interrupted: read 1,500 line(s), stored 1,500, not stored 0; "
        "an unfinished last line of 3 byte(s) not sent"
    ]
    assert _count(server) == 1500


def _unread(pipe) -> int:
    """Bytes written to ``pipe`` that its reader has not read yet."""
    count = array.array("i", [0])
    fcntl.ioctl(pipe.fileno(), termios.FIONREAD, count)
    return count[0]


def test_ctrl_c_when_the_last_put_fails_says_what_was_not_stored(server):
    put = _put(server, "--linger", "60")
    put.stdin.write(b"".join(b"%d\n" % i for i in range(1500)))
    put.stdin.flush()
    wait_for(lambda: _unread(put.stdin) == 0, 20, "every line read")  # (on a busy machine it lagged)
    wait_for(lambda: _count(server) >= 1000, 20, "the first batch")
    time.sleep(0.3)  # (the last 500, read, go into their batch)
    with HQueueAdmin(server) as admin:
        admin.disable_queue("q")  # the 500 can no longer go
    put.send_signal(signal.SIGINT)
    _, err = put.communicate(timeout=30)
    lines = err.decode().splitlines()
    assert put.returncode == 1, lines
    assert lines[0] == "hqueue put: stopped: read 1,500 line(s), stored 1,000, not stored 500"
    assert lines[1].startswith("Error: queue 'q' is disabled") and "Traceback" not in err.decode()


def test_a_bad_line_mid_stream_says_what_was_stored_before_it(tmp_path):
    from click.testing import CliRunner

    from hqueue.cli import main

    url = ["--url", f"local://{tmp_path}"]
    runner = CliRunner()
    runner.invoke(main, [*url, "create", "q", "1"])
    result = runner.invoke(main, [*url, "put", "q", "t", "--input", "hex", "--batch", "2"], input=b"00\n01\nzz\n")
    assert result.exit_code == 1
    assert "hqueue put: stopped: read 3 line(s), stored 2, not stored 1" in result.output
    assert "stdin line 3 is not hex" in result.output


@pytest.mark.parametrize("options", [(), ("--input", "raw")])
def test_endless_input_without_a_newline_is_refused_at_a_bound_not_read_into_memory(server, options):
    # Given `cat /dev/zero | hqueue put q t`: a line (or a raw message) that never ends
    put = _put(server, "--linger", "60", *options)
    put.stdin.write(b"before\n" if not options else b"")
    chunk = b"\0" * (1 << 20)
    try:
        for _ in range(200):  # 200 MiB: far past anything a put may carry
            put.stdin.write(chunk)
    except BrokenPipeError:
        pass  # it stopped reading: what the test wants
    _, err = put.communicate(timeout=60)
    # Then it stops with one error line, having stored the whole lines before it
    assert put.returncode == 1 and "more than a put may carry" in err.decode(), err.decode()
    assert _count(server) == (0 if options else 1)
