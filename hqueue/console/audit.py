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

    def recent(self, limit: int = AUDIT_PAGE) -> list[dict[str, Any]]:
        """The newest ``limit`` entries of the last week, newest first."""
        try:
            with self.admin.queue(AUDIT_QUEUE) as log:
                since = int(time.time() * 1000) - AUDIT_WINDOW * 1000
                kept: list[dict[str, Any]] = []
                for message in log.scan(since, partition_id=0, limit=50_000):
                    kept.append(_entry(message))
                    if len(kept) > limit:
                        del kept[0]
        except QueueNotFound:
            return []
        return kept[::-1]


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
