"""Runs a Processor whose handler prints each message it finished; killed by tests.

Usage: python -m tests.helpers.processor_process DATA_DIR QUEUE GROUP

Keys are the value's text before ":"; handling takes 0-3 ms at random, so
completions come out of order across keys. ``D value`` is printed (and
flushed) after the handler finished the message.
"""

import random
import sys
import threading
import time

from hqueue import HQueue
from hqueue.processor import Processor

_lock = threading.Lock()


def handle(message) -> None:
    time.sleep(random.uniform(0, 0.003))
    with _lock:
        sys.stdout.write(f"D {message.value.decode()}\n")
        sys.stdout.flush()


def main(data_dir: str, name: str, group: str) -> None:
    with HQueue(name, data_dir=data_dir) as queue:
        with _lock:  # before any "D" line: the processor starts handling at once
            print("READY", flush=True)
        Processor(queue, group, handle, key=lambda m: m.value.split(b":")[0], workers=4, commit_interval=0.05)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
