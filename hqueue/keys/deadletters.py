"""Where a dead letter's note is kept: where it came from, who sent it there, after how many
attempts (SPEC X2; the service is hqueue/deadletters.py).

Metadata keys of the store (``Storage.put_meta``)::

    dlq-note/<dead-letter queue>/<pid>/<id>      JSON: origin partition and ID, by whom, attempts
"""

from __future__ import annotations

from ..message import MessageID

NOTE_PREFIX = "dlq-note/"


def note_key(dead_letter_queue: str, partition_id: int, message_id: MessageID) -> str:
    return f"{NOTE_PREFIX}{dead_letter_queue}/{partition_id}/{message_id}"


def notes_prefix(dead_letter_queue: str) -> str:
    """The prefix of every note of one dead-letter queue."""
    return f"{NOTE_PREFIX}{dead_letter_queue}/"
