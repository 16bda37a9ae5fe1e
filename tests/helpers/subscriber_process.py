"""A subscriber in its own process, for tests that kill it.

Usage: python -m tests.helpers.subscriber_process URL QUEUE NAME OUTFILE

Appends one line a message it processed, ``pid timestamp sequence
received_ms``, flushed before the batch is acknowledged: a line in the file
is a message the subscriber processed (perhaps more than once).
"""

import signal
import sys
import threading
import time

from hqueue import HQueue, MessageListener, Subscription


class Record(MessageListener):
    def __init__(self, path: str) -> None:
        self.out = open(path, "a")
        self.lock = threading.Lock()

    def on_messages(self, messages):
        now = int(time.time() * 1000)
        lines = "".join(f"{m.partition_id} {m.id.timestamp} {m.id.sequence} {now}\n" for m in messages)
        with self.lock:
            self.out.write(lines)
            self.out.flush()


def main(url: str, queue_name: str, name: str, path: str) -> None:
    signalled: list[int] = []  # a flag: setting an Event the main thread waits on can deadlock
    signal.signal(signal.SIGTERM, lambda number, frame: signalled.append(number))
    with HQueue(queue_name, url) as queue:
        subscriber = queue.create_subscriber(Subscription(name), [Record(path)]).start()
        print("SUBSCRIBED", subscriber.address, flush=True)
        while not signalled:
            time.sleep(0.1)
        subscriber.stop("SIGTERM")


if __name__ == "__main__":
    main(*sys.argv[1:5])
