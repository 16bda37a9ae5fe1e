"""Puts timer messages forever on an embedded store, printing each acknowledged value; killed by tests.

Usage: python -m tests.helpers.timer_writer DATA_DIR QUEUE

The process owns the store, so it also fires the timers falling due while it
runs: a kill -9 lands in the middle of puts and of firings. A line is
printed (and flushed) only after ``put`` returned: every value read back is
an acknowledged timer.
"""

import os
import random
import sys

from hqueue import HQueue, Message


def main(data_dir: str, name: str) -> None:
    with HQueue(name, data_dir=data_dir) as queue:
        batch_number = 0
        while True:
            batch_number += 1
            values = [b"%d-%d-%d" % (os.getpid(), batch_number, i) for i in range(random.choice((1, 10, 50)))]
            queue.put([Message("timer", v) for v in values], delay=random.uniform(0.0, 1.0))
            sys.stdout.write("".join(v.decode() + "\n" for v in values))
            sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])
