"""The console's audit log: who did what admin action, when, and how it went.

Each entry is a message on the queue :data:`AUDIT_QUEUE` (one partition,
kept :data:`AUDIT_TTL` seconds, SYNC_WAL), made on the first admin action;
over the Thrift port only an ``admin`` token on it may write it (auth.py).
An ordinary queue, so every server of a store shares it, it survives
restarts, and ``hqueue scan hqueue-console-audit`` reads it too. The value
is JSON: ``{"who", "what", "queue", "target", "details", "outcome", "at"}``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from ..admin import HQueueAdmin
from ..auth import AUDIT_QUEUE
from ..errors import HQueueError, QueueExists, QueueNotFound
from ..message import Message

logger = logging.getLogger(__name__)

AUDIT_TTL = 90 * 86400
#: The most entries the Audit page reads (the newest of the last :data:`AUDIT_WINDOW` seconds).
AUDIT_PAGE = 200
AUDIT_WINDOW = 7 * 86400
#: Entries the Audit page reads at most, and in one time window.
AUDIT_READ = 200_000
AUDIT_CHUNK = 10_000


class AuditLog:
    """Writes and reads the audit queue through ``admin``."""

    def __init__(self, admin: HQueueAdmin) -> None:
        self.admin = admin

    def record(self, who: str, what: str, queue: str, target: str, details: dict[str, Any], outcome: str) -> None:
        """Add one entry. A failure to write it is logged and raised: an admin action
        the log cannot hold is reported as failed to the user."""
        entry = {"who": who, "what": what, "queue": queue, "target": target, "details": details,
                 "outcome": outcome, "at": int(time.time() * 1000)}  # fmt: skip
        logger.info("console audit: %s", entry)
        self._ensure()
        with self.admin.queue(AUDIT_QUEUE) as log:
            log.put(Message("audit", json.dumps(entry, sort_keys=True).encode()), partition_id=0)

    def _ensure(self) -> None:
        if not self.admin.queue_exists(AUDIT_QUEUE):
            try:
                self.admin.create_queue(AUDIT_QUEUE, 1, AUDIT_TTL)
            except QueueExists:
                pass  # another console made it first

    def recent(self, shown: Callable[[dict[str, Any]], bool], limit: int = AUDIT_PAGE) -> list[dict[str, Any]]:
        """The newest ``limit`` entries of the last week that ``shown`` keeps, newest first.

        Read from now back, a time window at a time (at most :data:`AUDIT_READ` entries in
        all): read from the week's start, the oldest 50,000 were all a flood left room for,
        and the newest were never shown; the newest 200 of all, filtered after, left a login
        an empty page behind others' entries (a helper's pass)."""
        now = int(time.time() * 1000)
        kept: list[dict[str, Any]] = []
        try:
            # (from its newest entry, if later than this clock: a server's clock ahead of the
            # console's, or IDs that ran ahead of a clock stepped back, hid the newest: helper-168)
            newest = self.admin.describe_queue(AUDIT_QUEUE)["last_ids"].get(0)
            top = max(now, newest.timestamp if newest is not None else 0)
            since, stop, width, read = top - AUDIT_WINDOW * 1000, top + 1, 60_000, 0
            with self.admin.queue(AUDIT_QUEUE) as log:
                while stop > since and len(kept) < limit and read < AUDIT_READ:
                    start = max(since, stop - width)
                    chunk = list(log.scan(start, stop, partition_id=0, limit=AUDIT_CHUNK + 1))
                    read += len(chunk)  # (a window read again narrower counts too)
                    if len(chunk) > AUDIT_CHUNK and stop - start > 1:  # too many there: a narrower window
                        width = max(1, (stop - start) // 8)
                        continue
                    kept += [e for e in map(_entry, reversed(chunk)) if shown(e)][: limit - len(kept)]
                    stop, width = start, width * 2
        except QueueNotFound:
            return []
        return kept


def _entry(message: Message) -> dict[str, Any]:
    try:
        entry = json.loads(message.value)
        if not isinstance(entry, dict):
            raise ValueError("not an object")
    except ValueError:
        entry = {"what": "(unreadable entry)", "outcome": repr(message.value[:100])}
    entry["id"] = str(message.id)
    return entry


__all__ = ["AUDIT_QUEUE", "AuditLog", "HQueueError"]
