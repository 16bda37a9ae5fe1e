"""A consumer-group member keeping key order by hand, with nacks; killed by tests.

Usage: python -m tests.helpers.ordered_consumer URL QUEUE GROUP FAIL

Joins GROUP with key affinity on topics, receives batches, and handles each
message in order (0-2 ms). A FAIL share of the messages (by their value's
CRC32) fails the first time this process handles it: the member nacks it
through the group, with the later messages of its key in the batch (handed
back unhandled, so that it keeps its key's order), and goes on with the
others. What it handled is acked once the batch is done. ``D value time_ns``
is printed (and flushed) when a message was handled.
"""

import random
import sys
import time
import zlib

from hqueue import HQueue


def main(url: str, name: str, group: str, fail: str) -> None:
    share, failed = float(fail), set()
    with HQueue(name, url) as queue, queue.consumer(group, key_affinity="topic", lease=30) as member:
        print("READY", flush=True)
        while True:
            done, given_back, stopped = [], [], set()
            for d in member.receive(20, wait=0.5):
                if d.topic in stopped:
                    given_back.append(d)
                    continue
                time.sleep(random.uniform(0, 0.002))
                if zlib.crc32(d.value) % 10_000 < share * 10_000 and d.value not in failed:
                    failed.add(d.value)
                    stopped.add(d.topic)
                    given_back.append(d)
                    continue
                sys.stdout.write(f"D {d.value.decode()} {time.time_ns()}\n")
                sys.stdout.flush()
                done.append(d)
            if given_back:
                member.nack(given_back, delay=0.2)
            if done:
                member.ack(done)


if __name__ == "__main__":
    main(*sys.argv[1:5])
