"""Splits: a queue cut into per-partition pieces for parallel readers (SPEC C11).

:meth:`HQueue.splits <hqueue.HQueue.splits>` returns one :class:`Split` per
partition: where to read (the store's URL, the partition, the ID range and
topics) and which server owns the partition, for schedulers that place work
near the data. A Split is a small frozen dataclass, so it pickles: hand it
to ``multiprocessing``, ``concurrent.futures`` or Dask, and call
:meth:`Split.read` in the worker.

A split made from a handle with a token carries that token, so a worker
of a server with ``--auth-file`` reads it as the handle would; the token is
never shown (not in ``repr``), but it is in the pickle: hand splits only
to workers you would give the token to (or make the handle without one,
and give workers ``token=`` or ``$HQUEUE_TOKEN``). An embedded store
(``local://``) is shared by the local processes that open it, so workers on
this machine read its splits with the same URL (each a client of the process
that serves it); across machines, serve it with ``hqueue server`` and split
over ``hqueue://``. A split reads the queue it was made from: one deleted and
made again under its name since raises QueueNotFound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .batch import MessageBatch, check_batch_size, partition_batches
from .checks import check_partition
from .connection import acquire_engine
from .message import MessageID
from .scanner import UNCHECKED, Scan


@dataclass(frozen=True)
class Split:
    """One partition of a queue, in ``[start, stop)``, for one reader.

    Attributes:
        url: The store or servers (``hqueue://…`` without a token, with its options).

    A split made from a handle with a token carries it (not as a field:
    never in ``repr``, ``asdict`` or comparisons; only in the pickle).
        location: ``host:port`` of the server that owns the partition; None
            for a store in this process, or while no server owns it.
        created: The queue's ``created`` (:attr:`QueueInfo.created
            <hqueue.config.QueueInfo.created>`) when the split was made (None: not checked).
    """

    url: str
    queue: str
    partition_id: int
    start: MessageID | None = None
    stop: MessageID | None = None
    topics: tuple[bytes, ...] | None = None
    location: str | None = None
    created: str | None = None

    def _carrying(self, token: str | None) -> Split:
        """This split, carrying ``token`` for :meth:`read` (set by HQueue.splits)."""
        if token is not None:
            object.__setattr__(self, "_token", token)
        return self

    def read(self, *, batch_size: int = 10_000, token: str | None = None) -> Iterator[MessageBatch]:
        """The split's messages as batches of columns, in ID order."""
        check_batch_size(batch_size)
        engine = acquire_engine(self.url, None, token or getattr(self, "_token", None))
        try:
            check_partition(engine.enabled_queue(self.queue), self.partition_id)
            scan = Scan(self.start, self.stop, self.topics)
            created = UNCHECKED if self.created is None else self.created
            yield from partition_batches(engine, self.queue, self.partition_id, scan, batch_size, created)
        finally:
            engine.release()
