"""The console's reads of messages, bounded in memory whatever the messages' size.

A page never loads a whole queue: it reads one partition through a scanner
that fetches :data:`CHUNK` messages at a time, and stops at a count or at
:data:`PAGE_BYTES` of values, whichever comes first (a queue of 4 MiB
messages shows fewer per page; the page says so by its "next" link).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..message import Message, MessageID
from ..queue import HQueue
from ..scanner import Scan

#: Messages a scanner fetches at once, and the bytes of values one page holds at most.
CHUNK = 20
PAGE_BYTES = 2 * 1024 * 1024


def read_page(
    handle: HQueue,
    partition_id: int,
    start: MessageID | None,
    stop: MessageID | None,
    topics: Iterable[str | bytes] | None,
    limit: int,
) -> tuple[list[Message], bool]:
    """Up to ``limit`` messages (and PAGE_BYTES of values) of one partition, and whether more follow."""
    found: list[Message] = []
    size = 0
    with handle.get_partition_scanner(partition_id, Scan(start, stop, topics), caching=CHUNK) as scanner:
        for message in scanner:
            if len(found) >= limit or (found and size + len(message.value) > PAGE_BYTES):
                return found, True
            found.append(message)
            size += len(message.value)
    return found, False


def count(handle: HQueue, partition_id: int, start: MessageID | None, stop: MessageID | None, cap: int) -> int:
    """Messages of one partition in ``[start, stop)``, counted up to ``cap + 1`` (more is "cap+")."""
    counted = 0
    with handle.get_partition_scanner(partition_id, Scan(start, stop), caching=CHUNK) as scanner:
        for _ in scanner:
            counted += 1
            if counted > cap:
                break
    return counted


def first_ids(
    handle: HQueue, partition_id: int, start: MessageID, stop: MessageID, cap: int, shown: int
) -> tuple[int, list[MessageID]]:
    """(messages in ``[start, stop)`` counted up to ``cap + 1``, the first ``shown`` IDs)."""
    counted, ids = 0, []  # type: tuple[int, list[MessageID]]
    with handle.get_partition_scanner(partition_id, Scan(start, stop), caching=CHUNK) as scanner:
        for message in scanner:
            counted += 1
            if len(ids) < shown and message.id is not None:
                ids.append(message.id)
            if counted > cap:
                break
    return counted, ids
