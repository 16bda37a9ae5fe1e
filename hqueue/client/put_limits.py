"""How the client splits a put into calls, within what the servers take.

A server refuses a put call over its limits (``--max-put-messages``,
``--max-put-bytes``, ``--max-frame-bytes``) whole, with
:class:`~hqueue.errors.LimitExceeded` naming the limit and its value, and
writes nothing. The client starts from the defaults every server has, and
when a server says its limits are lower, it lowers its own (for every later
put too) and sends the refused call again, split smaller: a user never sees
the refusal unless one message alone is over the limit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from operator import add

from ..errors import LimitExceeded
from ..rpc import wire

#: Bytes of a putPacked frame besides its batch's lengths, topics and values
#: (the call's name and sequence id, the queue's name, the fields' heads).
_CALL_HEAD_BYTES = 1024


class PutLimits:
    """The most messages, and bytes of topics and values, one put call carries."""

    def __init__(self) -> None:
        self.messages, self.bytes = wire.MAX_PUT_BATCH, wire.MAX_PUT_BYTES

    def batches(self, topics: Sequence[bytes], values: Sequence[bytes], start: int = 0) -> Iterator[tuple[int, int]]:
        """(start, stop) of each call for the messages from ``start`` on; a
        message over the bytes alone is a call of its own (the server says
        whether it takes it)."""
        most, limit = self.messages, self.bytes
        if start == 0 and len(topics) <= most and sum(map(len, values)) + sum(map(len, topics)) <= limit:
            yield 0, len(topics)  # the common case, decided in C
            return
        size = 0
        sizes = islice(map(add, map(len, topics), map(len, values)), start, None)
        for index, message_size in enumerate(sizes, start):
            if index > start and (index - start >= most or size + message_size > limit):
                yield start, index
                start, size = index, 0
            size += message_size
        if start < len(topics):
            yield start, len(topics)

    def learn(self, refused: LimitExceeded) -> bool:
        """Take a server's lower limit from its refusal; False if splitting smaller cannot help."""
        if refused.limit == "max_put_messages" and refused.value < self.messages:
            self.messages = refused.value
            return True
        if refused.limit == "max_put_bytes" and refused.value < self.bytes:
            self.bytes = refused.value
            return True
        if refused.limit == "max_frame_bytes":  # a packed put's frame: its names and heads, 8 bytes a message
            room = refused.value - _CALL_HEAD_BYTES
            messages = min(self.messages, max(1, room // 16))  # at most half the room for the lengths
            size = room - 8 * messages
            if 0 < size < self.bytes:
                self.messages, self.bytes = messages, size
                return True
        return False

    def check_whole(self, count: int, payload: int) -> None:
        """Refuse, here, a batch that must go in one call (timers) and is over the limits."""
        if count > self.messages or payload > self.bytes:
            raise LimitExceeded(
                "max_put_messages" if count > self.messages else "max_put_bytes",
                self.messages if count > self.messages else self.bytes,
                f"a timer put takes at most {self.messages} messages and {self.bytes} bytes in one call",
            )
