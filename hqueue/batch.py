"""MessageBatch: a chunk of stored messages as columns, the fast way to read a lot.

:meth:`HQueue.scan_batches <hqueue.HQueue.scan_batches>` yields them
partition by partition. A batch keeps the store's cell keys and values as
they came (from RocksDB, HBase or the wire) and builds nothing per message
until asked: ``values`` costs nothing, ``ids`` and ``topics`` one C-level
pass, ``messages()`` the Message objects a scanner would have made.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import InvalidArgument
from .message import Message, MessageID, ids_of_keys, messages_from_columns, topics_of_keys
from .scanner import UNCHECKED, Scan, ScanSource, read_columns


@dataclass(frozen=True)
class MessageBatch:
    """Messages of one partition, in ID order, as columns.

    Attributes:
        partition_id: The partition they come from.
        keys: Each message's cell key: its 12-byte rowkey, then its topic.
        values: Each message's payload.
    """

    partition_id: int
    keys: Sequence[bytes]
    values: Sequence[bytes]

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def ids(self) -> list[MessageID]:
        """Each message's ID (decoded from its rowkey)."""
        return ids_of_keys(self.keys)

    @property
    def last_id(self) -> MessageID:
        """The last message's ID (a batch is never empty)."""
        return ids_of_keys(self.keys[-1:])[0]

    @property
    def topics(self) -> list[bytes]:
        return topics_of_keys(self.keys)

    def messages(self) -> list[Message]:
        """The batch as Message objects, as a scanner yields them."""
        return messages_from_columns(self.keys, self.values)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())


def check_batch_size(batch_size: object) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidArgument(f"'batch_size' must be an int > 0, got {batch_size!r}")
    return batch_size


def partition_batches(
    source: ScanSource, queue: str, partition_id: int, scan: Scan, batch_size: int, created: object = UNCHECKED
) -> Iterator[MessageBatch]:
    """One partition's messages in ``scan``, as batches of columns, in ID order (of the queue
    that has ``created``: :func:`~hqueue.scanner.check_opened`)."""
    for keys, values in read_columns(source, queue, partition_id, scan, batch_size, created):
        yield MessageBatch(partition_id, keys, values)
