"""``hqueue console``: the web console on its own, over an embedded store it shares
with the other local processes (the browser's view is test_console_browser.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.server import HQueueServer
from tests.helpers.console_http import ConsoleUser
from tests.processes import ROOT, python_env, wait_for


@pytest.fixture
def console(tmp_path):
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("jobs", 2)
    log = tmp_path / "console.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hqueue.cli", "--url", url, "console", "--port", "0"],
                                cwd=ROOT, env=python_env(), stdout=out, stderr=out)  # fmt: skip
    token = wait_for(lambda: re.findall(r"one-time token: (\S+)", log.read_text()), 30, "the console's token")[0]
    address = re.findall(r"hqueue console on (http://[^/\s]+)", log.read_text())[0]
    yield url, address, token, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_hqueue_console_serves_an_embedded_store_it_shares_and_charts_its_puts(console):
    url, address, token, proc = console
    # Given the one-time token the console printed
    user = ConsoleUser(address)
    assert user.log_in("wrong-token-0123456789").status == 403
    assert user.log_in(token).status == 200
    assert "jobs" in user.get("/queues").body
    # When another process puts to the store the console holds (through it: the store is shared)
    with HQueue("jobs", url) as jobs:

        def charted() -> bool:
            jobs.put([Message("t", b"job")] * 50, 0)
            return any(v for v in user.get("/api/queues/jobs").json().get("put_rate", []) if v)

        # Then the queue's put-rate chart shows them within a few samples
        wait_for(charted, 30, "the put rate to be charted", interval=1)
    assert "1" in user.get("/messages?queue=jobs&partition=0").body
    # And SIGTERM stops it cleanly
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_taken_console_port_fails_before_the_server_serves(tmp_path):
    # Given a server whose console has the port
    first = HQueueServer(f"local://{tmp_path}/a", port=0, console_port=0).start()
    port = first.console.port
    try:
        # Then another server asking for it fails at once, and its store is released
        with pytest.raises(OSError):
            HQueueServer(f"local://{tmp_path}/b", port=0, console_port=port)
        HQueueAdmin(f"local://{tmp_path}/b").close()  # not held
    finally:
        first.stop()
