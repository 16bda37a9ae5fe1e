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

from .message import Message, MessageID, ids_of_keys, messages_from_columns, topics_of_keys


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
