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


def test_a_put_routed_by_the_new_queue_goes_where_the_cached_definition_is_the_old_one():
    """Two engines over one store (servers on HBase): one made the queue again, the other's
    cache still held the old definition for 2 s, and refused puts routed by the new one as
    made by a queue "deleted and created again" (a review). It reads the definition afresh."""
    import pytest

    from hqueue import Message, QueueNotFound
    from hqueue.engine import Engine
    from hqueue.storage.memory import MemoryStorage, forget

    name = f"routed-{threading.get_ident()}"
    try:
        first, second = Engine(MemoryStorage(name)), Engine(MemoryStorage(name))
        first.create_queue(QueueInfo("q", 4))
        old = second.queue_info("q").created  # (cached by the second)
        first.set_state("q", "DISABLED")
        first.delete_queue("q")
        first.create_queue(QueueInfo("q", 16))
        new = first.queue_info("q").created
        assert second.put("q", [Message("t", b"v")], 12, routed_by=new)
        with pytest.raises(QueueNotFound, match="deleted and created again"):
            second.put("q", [Message("t", b"v")], 1, routed_by=old)
    finally:
        forget(name)


def test_a_send_is_batched_with_the_definition_it_was_routed_by():
    """A send routed by one definition, then queued (after waiting for room) once the
    producer had read the next: its batch said the new one, and the owner took the old
    count's partition as the new queue's (a review). Its batch says the one it went by."""
    from hqueue import Message
    from hqueue.producer import Batches

    plan = Batches(QueueInfo("q", 4, config={"hqueue.created": "A"}), 0, 1000, 1 << 20, 1 << 20, 1)
    cost, chosen = plan.check(Message("t", b"v"), b"k7", None)
    plan.renew(QueueInfo("q", 16, config={"hqueue.created": "B"}))
    plan.add(Message("t", b"v"), cost, chosen, lambda pid: None)
    [(pid, [batch])] = [(pid, list(batches)) for pid, batches in plan.open.items()]
    assert (pid, batch.routed_by) == (chosen[0], "A")
