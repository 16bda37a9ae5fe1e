"""Dead letters (SPEC X2): where a message goes after too many failed deliveries.

The dead-letter queue of ``q`` is the ordinary queue ``q.dlq``, made on first
use with as many partitions as ``q``: it can be scanned, and replayed onto
``q`` (``HQueueAdmin.replay_dead_letters``, ``hqueue replay-dlq``). Push
subscriptions (``dead_letter_after``) and consumer groups (``max_retries``)
both use it.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, NamedTuple

from .checks import message_columns
from .config import DEAD_LETTER_SUFFIX, QueueInfo, validate_queue_name
from .errors import HQueueError, InvalidQueueName, QueueExists, QueueNotFound
from .keys.deadletters import note_key, notes_prefix
from .keys.requests import Request
from .message import Message, MessageID

if TYPE_CHECKING:
    from .api import EngineAPI
    from .coordination import Coordinator
    from .engine import Engine

logger = logging.getLogger(__name__)


class DeadLetterNote(NamedTuple):
    """What a dead letter's note says (kept in the store's metadata beside it).

    Attributes:
        origin_partition, origin_id: Where the message was in its queue.
        by: Who sent it: ``"group NAME"`` or ``"subscriber NAME"``.
        attempts: Its failed deliveries (a member's own ``dead_letter`` counts those before it).
    """

    origin_partition: int
    origin_id: MessageID | None
    by: str
    attempts: int


def dead_letter_queue(queue: str) -> str:
    return queue + DEAD_LETTER_SUFFIX


def dead_letter_info(engine: EngineAPI, queue: str) -> tuple[QueueInfo, bool]:
    """``<queue>.dlq``'s definition, making it (as many partitions as ``queue``) if it
    is missing; and whether this call made it."""
    dlq = dead_letter_queue(queue)
    try:
        validate_queue_name(dlq)
    except InvalidQueueName:  # only a dead-letter queue's name is that long (config.validate_new_queue_name)
        raise InvalidQueueName(
            f"queue {queue[:40]!r}… ({len(queue)} characters) has no dead-letter queue: {queue}{DEAD_LETTER_SUFFIX} "
            "would be over 200 characters"
        ) from None
    try:
        return engine.queue_info(dlq, fresh=True), False
    except QueueNotFound:
        try:
            engine.create_queue(QueueInfo(dlq, engine.queue_info(queue).partitions))
        except QueueExists:
            pass  # another worker made it first
        return engine.queue_info(dlq, fresh=True), True


def dead_letter(
    engine: Engine,
    coordinator: Coordinator,
    queue: str,
    partition_id: int,
    message: Message,
    *,
    by: str = "",
    attempts: int = 0,
    lane: bytes | None = None,
) -> tuple[int, MessageID] | None:
    """Put ``message`` on ``<queue>.dlq``, in its partition if this process writes
    it (else another it owns): (partition, ID), or None while the dead-letter
    queue's partitions have no owner here yet (try again later). With ``by``
    (who sends it), a note beside it keeps its origin and ``attempts``. With a
    ``lane`` (requests.py) that names this burial, the same across a crash, a dead
    letter written already under it is not written again: its ID is the first one's."""
    dlq = dead_letter_queue(queue)
    info, made = dead_letter_info(engine, queue)
    if made:
        coordinator.queues_changed()
    owned = coordinator.owned(dlq, info.partitions)
    if not owned:
        coordinator.queues_changed()
        return None  # its partitions are being assigned: next time
    pid = partition_id if partition_id in owned else owned[0]
    dead = [Message(message.topic, message.value)]
    # (resent: a writer restarted since the first try looks the lane's record up in the store)
    request = None if lane is None else Request(lane, 1, resent=True)
    dead_id = engine.put_columns(dlq, *message_columns(info, dead), pid, request)
    if by:
        note = {"partition": partition_id, "id": str(message.id) if message.id else None, "by": by,
                "attempts": attempts}  # fmt: skip
        try:
            engine.storage.put_meta(note_key(dlq, pid, dead_id), json.dumps(note).encode())
        except HQueueError:  # the dead letter is placed: a note it lacks is shown as not recorded
            logger.warning("no note for dead letter %s of %s partition %d", dead_id, dlq, pid, exc_info=True)
    return pid, dead_id


def note_of(engine: EngineAPI, queue: str, partition_id: int, dead_id: MessageID) -> DeadLetterNote | None:
    """The note of dead letter ``dead_id`` of ``<queue>.dlq``; None if it has none, or
    the store is not open here (notes are read where it is, as timers are)."""
    storage = getattr(engine, "storage", None)
    raw = storage.get_meta(note_key(dead_letter_queue(queue), partition_id, dead_id)) if storage else None
    if raw is None:
        return None
    try:
        note = json.loads(raw)
        origin = MessageID.parse(note["id"]) if note.get("id") else None
        return DeadLetterNote(int(note["partition"]), origin, str(note["by"]), int(note["attempts"]))
    except (ValueError, KeyError, TypeError):
        return None


def forget_notes(engine: Engine, queue: str) -> None:
    """Drop the notes of a dead-letter queue whose messages went (truncated or deleted)."""
    if queue.endswith(DEAD_LETTER_SUFFIX):
        stale = list(engine.storage.list_meta(notes_prefix(queue)))
        if stale:
            engine.storage.write_meta({}, stale)
