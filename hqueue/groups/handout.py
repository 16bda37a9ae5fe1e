"""What one receive hands out of a consumer group, as it is gathered (service.py,
ordered.py): the cells' columns, their attempts, and the bytes left for more."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from itertools import accumulate
from operator import add

#: What a receive hands out (groups.py): cell keys, values and attempts.
Columns = tuple[list[bytes], list[bytes], list[int]]
#: The most bytes of cell keys and values one receive hands out (as a scanner's struct reply,
#: rpc/wire.STRUCT_REPLY_BYTES): at least one message, and none after the one that passes it.
#: With the default 4 MiB message limit a receive's reply stays under 16,384,000 bytes, the
#: frame limit Apache Thrift's clients keep by default (a receive of 1,000 messages of 20 KB
#: failed there, its messages leased all the same).
RECEIVE_BYTES = 8 * 1024 * 1024


class Handout:
    """What one receive hands out, as it is gathered: columns, and the bytes left for more
    (:data:`RECEIVE_BYTES`, so a receive of many big messages holds a bounded reply)."""

    __slots__ = ("keys", "values", "attempts", "room", "again", "back")

    def __init__(self, room: int = RECEIVE_BYTES) -> None:
        #: The retries handed out again from the partition being served, and with key
        #: affinity the held-back messages handed out (deaths.py marks them out), and
        #: those held back (noted as not out).
        self.again: list[bytes] = []
        self.back: list[bytes] = []
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        self.attempts: list[int] = []
        self.room = room

    @property
    def full(self) -> bool:
        return self.room <= 0

    def add(self, key: bytes, value: bytes, attempt: int) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.attempts.append(attempt)
        self.room -= len(key) + len(value)

    def fitting(self, keys: Sequence[bytes], values: Sequence[bytes]) -> tuple[int, int]:
        """How many of these cells (in order) go in, and their bytes: all while the bytes
        last, and the one that passes them (one at least, unless the handout is full already)."""
        if self.room <= 0:
            return 0, 0
        total = sum(map(len, keys)) + sum(map(len, values))
        if total <= self.room:  # the usual case: no look at each cell
            return len(keys), total
        sizes = list(accumulate(map(add, map(len, keys), map(len, values))))
        count = min(len(keys), bisect.bisect_left(sizes, self.room) + 1)
        return count, sizes[count - 1]

    def extend(self, keys: Sequence[bytes], values: Sequence[bytes], attempts: Iterable[int], size: int) -> None:
        """Add cells of ``size`` bytes in all (as :meth:`fitting` measured them)."""
        self.keys.extend(keys)
        self.values.extend(values)
        self.attempts.extend(attempts)
        self.room -= size

    def columns(self) -> Columns:
        return self.keys, self.values, self.attempts
