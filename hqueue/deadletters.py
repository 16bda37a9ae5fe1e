"""Dead letters (SPEC X2): where a message goes after too many failed deliveries.

The dead-letter queue of ``q`` is the ordinary queue ``q.dlq``, made on first
use with as many partitions as ``q``: it can be scanned, and replayed onto
``q`` (``HQueueAdmin.replay_dead_letters``, ``hqueue replay-dlq``). Push
subscriptions (``dead_letter_after``) and consumer groups (``max_retries``)
both use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import DEAD_LETTER_SUFFIX, QueueInfo, validate_queue_name
from .errors import InvalidQueueName, QueueExists, QueueNotFound
from .message import Message, MessageID

if TYPE_CHECKING:
    from .api import EngineAPI
    from .coordination import Coordinator
    from .engine import Engine


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
    engine: Engine, coordinator: Coordinator, queue: str, partition_id: int, message: Message
) -> tuple[int, MessageID] | None:
    """Put ``message`` on ``<queue>.dlq``, in its partition if this process writes
    it (else another it owns): (partition, ID), or None while the dead-letter
    queue's partitions have no owner here yet (try again later)."""
    dlq = dead_letter_queue(queue)
    info, made = dead_letter_info(engine, queue)
    if made:
        coordinator.queues_changed()
    owned = coordinator.owned(dlq, info.partitions)
    if not owned:
        coordinator.queues_changed()
        return None  # its partitions are being assigned: next time
    pid = partition_id if partition_id in owned else owned[0]
    (dead_id,) = engine.put(dlq, [Message(message.topic, message.value)], pid)
    return pid, dead_id
