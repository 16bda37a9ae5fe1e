"""InfoCache: a definition read before a queue changed is not served after it."""

from __future__ import annotations

import threading

from hqueue.config import InfoCache, QueueInfo


def test_a_definition_read_as_the_queue_changed_is_not_kept():
    """A read begun before a delete and a create, and ended after them, was kept and served
    for 2 s: the deleted queue's definition, its partition count among it (an attacker's
    pass: puts went to partitions the new queue lacks, never read again)."""
    stored = {"q": QueueInfo("q", 8)}
    reading, changed = threading.Event(), threading.Event()

    def load(name: str) -> QueueInfo:
        info = stored[name]
        if not reading.is_set():  # (the first read: it waits for the change, holding the old one)
            reading.set()
            changed.wait(10)
        return info

    cache = InfoCache(load)
    slow = threading.Thread(target=cache.get, args=("q",))
    slow.start()
    reading.wait(10)
    stored["q"] = QueueInfo("q", 1)  # made again, and forgotten, as the read goes on
    cache.forget("q")
    changed.set()
    slow.join(10)
    assert cache.get("q").partitions == 1
