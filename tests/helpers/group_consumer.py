"""A consumer-group member that logs what it gets and acks; killed by tests.

Usage: python -m tests.helpers.group_consumer URL QUEUE GROUP LEASE WORK [prefetch]

WORK: seconds each batch takes to "process" between receive and ack, so that
a kill often lands while messages are held. ``prefetch``: the member asks for
its next batch ahead (``queue.consumer(group, prefetch=True)``).

Prints ``R pid timestamp sequence attempt`` for each message received and
``A pid timestamp sequence`` once its ack has returned (so an ``A`` line is
an acknowledged ack), flushing after each batch.
"""

import sys
import time

from hqueue import HQueue


def main(url: str, name: str, group: str, lease: str, work: str, ahead: str = "") -> None:
    out = sys.stdout
    prefetch = ahead == "prefetch"
    with HQueue(name, url) as queue, queue.consumer(group, lease=float(lease), prefetch=prefetch) as consumer:
        print("READY", flush=True)
        while True:
            deliveries = consumer.receive(50, wait=1.0)
            out.write("".join(f"R {d.partition_id} {d.id.timestamp} {d.id.sequence} {d.attempt}\n" for d in deliveries))
            out.flush()
            if deliveries:
                time.sleep(float(work))
                consumer.ack(deliveries)
                out.write("".join(f"A {d.partition_id} {d.id.timestamp} {d.id.sequence}\n" for d in deliveries))
                out.flush()


if __name__ == "__main__":
    main(*sys.argv[1:7])
