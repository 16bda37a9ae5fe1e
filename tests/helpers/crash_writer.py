"""Writes batches forever and prints every acknowledged ID; killed by tests.

Usage: python -m tests.helpers.crash_writer DATA_DIR QUEUE

Each line is printed (and flushed) only after ``put`` returned, so every line
the test reads is an acknowledged message: ``pid timestamp sequence``.
"""

import random
import sys

from hqueue import HQueue, Message


def main(data_dir: str, name: str) -> None:
    with HQueue(name, data_dir=data_dir) as queue:
        out = sys.stdout
        batch_number = 0
        while True:
            batch_number += 1
            pid = random.randrange(queue.partitions)
            size = random.choice((1, 10, 100))
            ids = queue.put([Message("crash", b"%d-%d" % (batch_number, i)) for i in range(size)], partition_id=pid)
            out.write("".join(f"{pid} {i.timestamp} {i.sequence}\n" for i in ids))
            out.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])
