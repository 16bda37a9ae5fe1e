"""The key-ordered processing framework (SPEC X5).

A :class:`Processor` reads a queue as a member of a consumer group and runs
a handler on every message, in parallel across keys and in order within a
key::

    def handle(message):                      # raise to fail it
        charge(message.value)

    with HQueue("orders") as queue:
        with Processor(queue, "billing", handle, key=lambda m: m.value[:8], workers=8) as processor:
            processor.wait_idle()             # or run until processor.stop()

* **Key order.** Each message's key (default: its topic) is hashed onto one
  of ``workers`` worker queues: messages with one key are handled one after
  another, in the order of their partition; different keys run in parallel.
  Put a key's messages with ``queue.put(..., key=k)`` so they share a
  partition. Across processes the group keeps the order (key affinity,
  :mod:`hqueue.groups.affinity`): a key's later messages go to the process
  holding its earlier ones, and after a process dies, its messages go out
  again before any later one of their keys. With the default key the group
  keeps each topic in order (processes share a partition's topics); with a
  ``key=`` function, each partition (processes share the partitions).
* **Commits.** Messages complete out of order; the processor acks a
  partition's messages only up to the highest one below which everything
  has completed (:class:`CommitTracker`), so the group's completion cursor
  never passes an unfinished message. After a crash, what was in hand comes
  again: at least once.
* **Backpressure.** Worker queues hold at most ``queue_size`` messages; when
  they are full the reader waits, instead of reading ahead into memory.
* **Failures.** A handler that raises is retried ``max_retries`` times,
  ``retry_delay`` seconds apart (doubling); meanwhile its key is set aside,
  so other keys of the same worker go on, and the key's later messages wait
  behind it, in order. After the last retry the message goes to
  ``<queue>.dlq`` and its key resumes.
* **Timeouts.** A handler running longer than ``timeout`` seconds fails its
  message at once, without a retry (it goes to the dead-letter queue); the
  worker is replaced and the key goes on. The stuck call is abandoned, not
  killed: Python threads cannot be.
* **Delay.** With ``delay=S`` a message is handled no sooner than S seconds
  after it was written.
"""

from .commits import CommitTracker
from .processor import DEAD_LETTER_TRIES, Processor

__all__ = ["DEAD_LETTER_TRIES", "CommitTracker", "Processor"]
