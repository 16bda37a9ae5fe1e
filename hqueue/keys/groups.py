"""Where consumer groups keep their state (SPEC X3; the service is hqueue/groups/).

Metadata keys of the store (``Storage.put_meta``)::

    groups/<queue>/<group>                       the group's definition (GroupConfig JSON)
    group-state/<queue>/<group>/<pid>/done       every ID below it is finished
    group-state/<queue>/<group>/<pid>/ack/<id>   acked above ``done`` (hex of the 10-byte ID)
    group-state/<queue>/<group>/<pid>/retry/<id> failed deliveries so far ("2"; "2+<token>" while
                                                 the retry is handed out again; "0" for one given
                                                 back unseen, or held back for its key)
    group-state/<queue>/<group>/<pid>/behind/<id> unfinished below ``done`` (the cursor moved on)
    group-state/<queue>/<group>/<pid>/bury/<id>  past its retries, its dead letter being written:
                                                 the lane of that idempotent put (hqueue/requests.py)
    group-state/<queue>/<group>/<pid>/dead       how many went to the dead-letter queue
    group-state/<queue>/<group>/<pid>/out        the hand-out mark: the highest first delivery
                                                 handed out, and its holder's process token
"""

from __future__ import annotations

from ..message import MessageID, successor


def group_key(queue: str, group: str) -> str:
    return f"groups/{queue}/{group}"


def state_prefix(queue: str, group: str, pid: int | None = None) -> str:
    return f"group-state/{queue}/{group}/" + ("" if pid is None else f"{pid}/")


def id_after(message_id: bytes) -> bytes:
    """The 10-byte form of the smallest ID after ``message_id`` (10 bytes too)."""
    return successor(MessageID.from_bytes(message_id)).to_bytes()


def groups_prefix(queue: str) -> str:
    """The prefix of every group definition of ``queue``."""
    return f"groups/{queue}/"


def queue_state_prefix(queue: str) -> str:
    """The prefix of every group's progress on ``queue``."""
    return f"group-state/{queue}/"
