"""Between hqueue's Python objects and the Thrift IDL's (``thrift/hqueue.thrift``).

Used by both sides: the server turns messages and errors into Thrift
structs and exceptions, the remote client turns them back.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Any

from thriftpy2.thrift import TDecodeException

from .. import errors
from ..auth import PushCredentials
from ..config import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, QueueInfo
from ..errors import GroupNotFound, SubscriberNotFound
from ..keys.requests import Request
from ..keys.timers import Timer
from ..message import ROWKEY_LENGTH, Message, MessageID, PackedReceipts, cell_keys_of, values_of
from ..scanner import Scan
from . import idl

T = idl.load("hqueue.thrift")

#: The most messages one messageScannerGetList reply holds, whatever was asked.
MAX_SCAN_BATCH = 10_000
#: A messageScannerGetPacked reply stops after the message that brings its topics and values
#: to this size (hqueue's clients take a shorter reply for the scan's end: fixed on the wire).
SCAN_REPLY_BYTES = 16 * 1024 * 1024
#: The same for the replies other clients read as Thrift structs (messageScannerGet and
#: GetList) and for a groupReceive: with the default 4 MiB message limit, such a reply stays
#: under 16,384,000 bytes, the frame limit Apache Thrift's clients keep by default (Java, Go,
#: Python), which larger ones failed.
STRUCT_REPLY_BYTES = 8 * 1024 * 1024
#: The largest answer frame a client reads (a scan chunk is at most SCAN_REPLY_BYTES and change):
#: a larger head ends the connection before anything is allocated for it.
MAX_ANSWER_BYTES = 256 * 1024 * 1024
#: What the error for a scanner the server no longer has says (closed, idle past its timeout,
#: or of a connection or a server that is gone): a client's cursor opens another.
SCANNER_GONE = "is not open on this connection"
#: The most messages one put call carries (a put is one call: atomic, never split).
MAX_PUT_BATCH = MAX_BATCH_MESSAGES
#: The most bytes (topics and values) one put call carries (frames stay far below 64 MiB).
MAX_PUT_BYTES = MAX_BATCH_BYTES
#: Bytes a put's frame takes besides its topics and values: per message
#: (a TMessage's fields; a packed batch takes 8) and per call (names, headers).
PUT_FRAME_BYTES_PER_MESSAGE, PUT_FRAME_BYTES_PER_CALL = 40, 64 * 1024
_ROWKEY = struct.Struct(">HQH")
#: The queue a QueueDisabled's text names (errors.QueueDisabled), read back from a TIOError.
_DISABLED = re.compile(r"queue '(.+?)' is disabled")


def call_frame(api: str, seqid: int, **args: Any) -> bytes:
    """One framed binary-protocol call of the service, as a client sends it (for tools and
    tests that speak to a server in raw frames: pipelined, cut, or hostile)."""
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.thrift import TMessageType
    from thriftpy2.transport.memory import TCyMemoryBuffer

    buffer = TCyMemoryBuffer()
    protocol = TBinaryProtocolFactory().get_protocol(buffer)
    protocol.write_message_begin(api, TMessageType.CALL, seqid)
    protocol.write_struct(getattr(T.HQueueService, api + "_args")(**args))
    protocol.write_message_end()
    payload = buffer.getvalue()
    return struct.pack(">I", len(payload)) + payload


def put_frame_bytes(messages: int, payload: int) -> int:
    """The largest frame a put of ``messages`` messages and ``payload`` bytes of topics and values takes."""
    return payload + messages * PUT_FRAME_BYTES_PER_MESSAGE + PUT_FRAME_BYTES_PER_CALL


def to_tid(message_id: MessageID) -> Any:
    return T.TMessageID(timestamp=message_id.timestamp, sequenceID=message_id.sequence)


def from_tid(tid: Any) -> MessageID:
    if tid is None or tid.timestamp is None:
        raise errors.InvalidMessage("a TMessageID needs a timestamp")
    return MessageID(tid.timestamp, tid.sequenceID or 0)


def to_tmessages(messages: Sequence[Message]) -> list[Any]:
    """Stored messages as TMessages (with id and partition)."""
    TMessage, TMessageID, unpack = T.TMessage, T.TMessageID, _ROWKEY.unpack_from
    out = []
    for key, value in zip(cell_keys_of(messages), values_of(messages), strict=True):
        pid, timestamp, sequence = unpack(key)  # the rowkey at the head of the cell key
        tid = TMessageID(timestamp=timestamp, sequenceID=sequence)
        out.append(TMessage(id=tid, partitionID=pid, topic=key[ROWKEY_LENGTH:], value=value))
    return out


def from_tmessage(t: Any, index: int = 0) -> Message:
    """A TMessage from a client, as a Message to write (its id is ignored)."""
    if t is None:
        raise errors.InvalidMessage(f"message {index} is null")
    if not isinstance(t.topic, bytes) or not t.topic:
        raise errors.InvalidMessage(f"message {index} needs a non-empty topic")
    if not isinstance(t.value, bytes):
        raise errors.InvalidMessage(f"message {index} needs a value")
    return Message(t.topic, t.value)


def from_stored_tmessage(t: Any) -> Message:
    """A TMessage from the server, as the stored Message it describes."""
    return Message(t.topic, t.value, id=from_tid(t.id), partition_id=t.partitionID)


def to_tpush_key(push: PushCredentials) -> Any:
    return T.TPushKey(key=push.key, certificate=push.certificate)


def from_tpush_key(t: Any) -> PushCredentials:
    """The announced push credentials; InvalidArgument for missing or malformed ones."""
    push = PushCredentials.checked(t.key, t.certificate) if t is not None else None
    if push is None:
        raise errors.InvalidArgument(
            "a subscriber announces a 32-byte push key (and, with TLS, its certificate's SHA-256 hex fingerprint)"
        )
    return push


def to_trequest(request: Request) -> Any:
    return T.TRequest(lane=request.lane, sequence=request.sequence, resent=request.resent, created=request.created)


def from_trequest(t: Any) -> Request | None:
    """The request a put carries (None: it carries none), checked.

    Raises:
        InvalidArgument: a malformed one.
    """
    if t is None or not t.lane:  # (an empty one: unset, as a client that sends every argument sends it)
        return None
    return Request(t.lane, t.sequence, bool(t.resent), t.created if t.created != "" else None).checked()


def to_ttimer(timer: Timer) -> Any:
    return T.TTimer(partitionID=timer.partition_id, due=timer.due, id=to_tid(timer.id))


def to_tpending(timer: Timer, message: Message) -> Any:
    return T.TPendingTimer(timer=to_ttimer(timer), topic=bytes(message.topic), value=message.value)


def from_tpending(queue: str, t: Any) -> tuple[Timer, Message]:
    timer = from_ttimer(t.timer)
    return Timer(timer.partition_id, timer.due, timer.id, queue), Message(t.topic, t.value)


def from_ttimer(t: Any) -> Timer:
    if t is None or not isinstance(t.partitionID, int) or not isinstance(t.due, int) or t.id is None:
        raise errors.InvalidArgument("a TTimer needs partitionID, due and id")
    return Timer(t.partitionID, t.due, from_tid(t.id))


#: The most receipts one groupAck (groupNack, groupExtend, groupDeadLetter) carries: a
#: client sends more in several calls (acks are not atomic; sending one twice is harmless).
MAX_RECEIPTS = 10_000


def pack_rowkeys(rowkeys: Sequence[bytes]) -> bytes:
    return b"".join(rowkeys)


def receipt_chunks(rowkeys: Sequence[bytes]) -> list[Sequence[bytes]]:
    """``rowkeys`` in calls of at most MAX_RECEIPTS."""
    return [rowkeys[i : i + MAX_RECEIPTS] for i in range(0, len(rowkeys), MAX_RECEIPTS)]


def packed_receipts(blob: Any) -> PackedReceipts:
    """A groupAck/groupNack ``rowkeys`` argument, checked: 12-byte rowkeys, concatenated, at
    most MAX_RECEIPTS (cut into message IDs where they are used: message.ids_by_partition)."""
    if not isinstance(blob, bytes) or len(blob) % ROWKEY_LENGTH:
        raise errors.InvalidArgument(f"'rowkeys' must be {ROWKEY_LENGTH}-byte rowkeys, concatenated")
    if len(blob) > MAX_RECEIPTS * ROWKEY_LENGTH:
        raise errors.LimitExceeded(
            "max_receipts", MAX_RECEIPTS,
            f"{len(blob) // ROWKEY_LENGTH} receipts in one call: at most {MAX_RECEIPTS} (send more in several calls)",
        )  # fmt: skip
    return PackedReceipts(blob)


def to_tscan(scan: Scan) -> Any:
    return T.TMessageScan(
        startID=to_tid(scan.start_id) if scan.start_id else None,
        stopID=to_tid(scan.stop_id) if scan.stop_id else None,
        topics=sorted(scan.topics) if scan.topics else None,
    )


def from_tscan(t: Any) -> Scan:
    if t is None:
        return Scan()
    return Scan(
        from_tid(t.startID) if t.startID else None,
        from_tid(t.stopID) if t.stopID else None,
        t.topics or None,
    )


def to_tinfo(info: QueueInfo) -> Any:
    return T.TQueueInfo(
        name=info.name,
        partitions=info.partitions,
        ttl=info.ttl,
        durability=info.durability,
        state=info.state,
        config=dict(info.config),
        maxMessageBytes=info.max_message_bytes,
    )


def from_tinfo(t: Any) -> QueueInfo:
    return QueueInfo(
        name=t.name,
        partitions=t.partitions,
        ttl=t.ttl or 0,
        durability=t.durability or "SYNC_WAL",
        state=t.state or "ENABLED",
        config=dict(t.config or {}),
        max_message_bytes=t.maxMessageBytes or QueueInfo.max_message_bytes,
    )


# -- errors -----------------------------------------------------------------------


def to_thrift_error(e: Exception) -> Exception:
    """The IDL exception a client should see for ``e``."""
    text = str(e)
    if isinstance(e, (errors.LimitExceeded, errors.ServerBusy)):  # "Kind: limit=value: text", read back below
        described = f"{type(e).__name__}: {e.limit}={e.value}: {text}"
        busy = isinstance(e, errors.ServerBusy)
        return T.TIOError(message=described) if busy else T.TInvalidMessage(message=described)
    if isinstance(e, errors.QueueNotFound):
        return T.TQueueNotFound(message=text, queue=e.name)
    if isinstance(e, errors.QueueExists):
        return T.TQueueExists(message=text, queue=e.name)
    if isinstance(e, SubscriberNotFound):
        return T.TSubscriberNotFound(message=text, name=e.name)
    if isinstance(e, GroupNotFound):
        return T.TGroupNotFound(message=text, group=e.group)
    if isinstance(e, errors.QueueDisabled):
        return T.TQueueDisabled(message=text, queue=e.name)
    if isinstance(e, errors.NotAuthorized):
        return T.TNotAuthorized(message=text)
    if isinstance(e, errors.NotPartitionOwner):
        return T.TNotPartitionOwner(message=text, owner=e.owner or "")
    if isinstance(e, (errors.InvalidArgument, errors.QueueEnabled, errors.SubscriberActive, errors.SubscriberExists,
                      ValueError, TypeError)):  # fmt: skip
        return T.TInvalidMessage(message=f"{type(e).__name__}: {text}")
    return T.TIOError(message=f"{type(e).__name__}: {text}")


def from_thrift_error(e: Exception, queue: str | None = None, partition_id: int = -1) -> errors.HQueueError:
    """The hqueue error a Python caller should see for an IDL exception (or for a call's
    argument the wire cannot carry: not sent, the caller's error)."""
    if isinstance(e, TDecodeException) and str(e.struct_name).endswith("_args"):
        shown = repr(e.value) if len(repr(e.value)) <= 60 else f"{repr(e.value)[:60]}…"
        kind = "text that is valid UTF-8" if e.type_repr == "STRING" else str(e.type_repr).lower()
        return errors.InvalidArgument(f"'{e.field}' must be {kind}, got {shown}")
    text = _text(getattr(e, "message", "")) or repr(e)
    limit = _limit_error(text) if isinstance(e, (T.TInvalidMessage, T.TIOError)) else None
    if limit is not None:
        return limit
    if isinstance(e, T.TQueueNotFound):
        return errors.QueueNotFound(_text(e.queue) or queue or "?", _text(e.message) or None)
    if isinstance(e, T.TQueueExists):
        return errors.QueueExists(_text(e.queue) or queue or "?")
    if isinstance(e, T.TSubscriberNotFound):
        return SubscriberNotFound(_text(e.name), queue or "?")
    if isinstance(e, T.TGroupNotFound):
        return GroupNotFound(queue or "?", _text(e.group))
    if isinstance(e, T.TQueueDisabled):
        return errors.QueueDisabled(_text(e.queue) or queue or "?")
    if isinstance(e, T.TNotAuthorized):
        return errors.NotAuthorized(text)
    if isinstance(e, T.TNotPartitionOwner):
        return errors.NotPartitionOwner(queue or "?", partition_id, _text(e.owner) or None)
    if isinstance(e, T.TInvalidMessage):
        kind, _, rest = text.partition(": ")
        known = {
            "MessageTooLarge": errors.MessageTooLarge,
            "BatchTooLarge": errors.BatchTooLarge,
            "InvalidPartition": errors.InvalidPartition,
            "InvalidQueueName": errors.InvalidQueueName,
            "InvalidArgument": errors.InvalidArgument,
            "InvalidMessage": errors.InvalidMessage,  # (its words without the kind: "InvalidMessage: ..." was shown)
            "SubscriberActive": errors.SubscriberActive,
            "SubscriberExists": errors.SubscriberExists,
            "ValueError": errors.InvalidArgument,
        }
        if kind == "QueueEnabled" and queue:
            return errors.QueueEnabled(queue, "it can be dropped")
        return known[kind](rest) if kind in known else errors.InvalidMessage(text)
    kind, _, rest = text.partition(": ")
    if kind == "InvalidQueueName":  # (a server whose IDL did not declare TInvalidMessage for the call)
        return errors.InvalidQueueName(rest)
    if kind == "QueueNotFound" and queue:  # (a call that does not declare TQueueNotFound: a scanner's)
        return errors.QueueNotFound(queue, rest)
    if kind == "QueueDisabled" and queue:  # (a call that does not declare TQueueDisabled: the queue it names)
        named = _DISABLED.match(rest)
        return errors.QueueDisabled(named.group(1) if named else queue)
    return errors.StorageError(text)


def _limit_error(text: str) -> errors.HQueueError | None:
    """A LimitExceeded or ServerBusy, from its wire text ("Kind: limit=value: message")."""
    kind, _, rest = text.partition(": ")
    cls = {"LimitExceeded": errors.LimitExceeded, "ServerBusy": errors.ServerBusy}.get(kind)
    setting, _, message = rest.partition(": ")
    limit, _, value = setting.partition("=")
    if cls is None or not value.isdigit():
        return None
    return cls(limit, int(value), message)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")
