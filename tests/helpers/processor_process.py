"""Runs a Processor whose handler prints each message it finished; killed by tests.

Usage: python -m tests.helpers.processor_process WHERE QUEUE GROUP [FAIL [LEASE [KEY [WORK]]]]

WHERE is a data directory (an embedded store) or an ``hqueue://`` URL. With
a data directory, or KEY ``value``, keys are the value's text before ":" (a
``key=`` function); with a URL, keys are the topics (the Processor's default). The
handler takes 0-3 ms at random (0-WORK ms), so completions come out of order across
keys; a FAIL share of the messages (by their value's CRC32) fails the first
time this process handles it, and is retried by the Processor. LEASE: the
Processor's lease (default: its own). ``D value time_ns`` is printed (and
flushed) after the handler finished the message.
"""

import random
import sys
import threading
import time
import zlib

from hqueue import HQueue
from hqueue.processor import Processor

_lock = threading.Lock()
_failed: set[bytes] = set()


def handler(fail: float, work: float):
    def handle(message) -> None:
        time.sleep(random.uniform(0, work))
        if fail and zlib.crc32(message.value) % 10_000 < fail * 10_000 and message.value not in _failed:
            _failed.add(message.value)
            raise RuntimeError("failed once (the test's nack)")
        with _lock:
            sys.stdout.write(f"D {message.value.decode()} {time.time_ns()}\n")
            sys.stdout.flush()

    return handle


def main(where: str, name: str, group: str, fail: str = "0", lease: str = "", by: str = "", work: str = "3") -> None:
    remote = where.startswith("hqueue://")
    queue = HQueue(name, where) if remote else HQueue(name, data_dir=where)
    options = {"lease": float(lease)} if lease else {}
    key = None if remote and by != "value" else (lambda m: m.value.split(b":")[0])
    with queue:
        with _lock:  # before any "D" line: the processor starts handling at once
            print("READY", flush=True)
        Processor(
            queue,
            group,
            handler(float(fail), float(work) / 1000),
            key=key,
            workers=4,
            commit_interval=0.05,
            retry_delay=0.2,
            **options,
        )
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:8])
