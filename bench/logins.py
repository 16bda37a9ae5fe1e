"""What a token guesser gets from an hqueue server with ``--auth-file``.

Usage:
    python bench/logins.py [--seconds 10] [--json out.json]

One client sends wrong tokens as fast as the server answers for the given
time, on one connection, reconnecting whenever the server closes it. The
rows: wrong tokens answered, per second, connections it took, the slowest
answer, the server's warning lines about it, and whether a client with the
right token, from the same host, is still served at once (its round trip).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from common import report  # noqa: E402
from remote import free_port, wait_port  # noqa: E402
from thriftpy2.protocol import TBinaryProtocolFactory  # noqa: E402
from thriftpy2.rpc import make_client  # noqa: E402
from thriftpy2.transport import TFramedTransportFactory, TTransportException  # noqa: E402

from hqueue.rpc.wire import T  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
SECRET = "the-right-token-0123456789"


def client(port: int):
    return make_client(
        T.HQueueService, "127.0.0.1", port,
        proto_factory=TBinaryProtocolFactory(), trans_factory=TFramedTransportFactory(), timeout=30_000,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="hqueue-logins-")
    auth = os.path.join(work, "auth.toml")
    with open(auth, "w") as f:
        f.write(f'[tokens.ops]\nsecret = "{SECRET}"\nadmin = ["*"]\n')
    port, log_path = free_port(), os.path.join(work, "server.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hqueue.cli", "server", "--storage", f"local://{work}/data", "--port", str(port),
             "--auth-file", auth],
            env=ENV, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        wait_port(port, proc=proc)
        attempts, connections, slowest = 0, 1, 0.0
        guesser = client(port)
        ends = time.monotonic() + args.seconds
        while time.monotonic() < ends:
            started = time.monotonic()
            try:
                guesser.authenticate(f"guess-{attempts}")
            except T.TNotAuthorized:
                pass
            except (TTransportException, OSError):
                guesser.close()
                guesser, connections = client(port), connections + 1
                continue
            attempts += 1
            slowest = max(slowest, time.monotonic() - started)
        guesser.close()
        started = time.monotonic()
        good = client(port)
        good.authenticate(SECRET)
        good.listQueues()
        good_ms = (time.monotonic() - started) * 1000
        good.close()
        time.sleep(0.5)
        with open(log_path) as f:
            warnings = sum(1 for line in f if "refused" in line)
        row = {
            "wrong tokens": attempts,
            "per s": attempts / args.seconds,
            "connections": connections,
            "slowest answer s": slowest,
            "warning lines": warnings,
            "right token ms": good_ms,
        }
        report(
            f"token guessing for {args.seconds:g}s on one connection (reconnecting when closed)",
            [row],
            list(row),
            args.json,
        )
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
