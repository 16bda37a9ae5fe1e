"""The exceptions hqueue raises.

Every error hqueue raises on purpose derives from :class:`HQueueError`.
Errors from the libraries underneath (RocksDB, happybase, thriftpy2, kazoo)
are wrapped at the boundary with ``raise ... from e``, so callers can catch
one root and still see the original cause in the traceback.
"""

from __future__ import annotations


class HQueueError(Exception):
    """Root of every error hqueue raises on purpose."""


class InvalidArgument(HQueueError, ValueError):
    """An argument has the wrong value: a partition count of 0, a negative TTL…"""


class InvalidQueueName(InvalidArgument):
    """A queue name is empty, too long or uses characters HBase rejects."""


class QueueNotFound(HQueueError, LookupError):
    """The named queue does not exist."""

    def __init__(self, name: str, message: str | None = None) -> None:
        super().__init__(message or f"queue {name!r} does not exist")
        self.name = name


class QueueExists(HQueueError):
    """A queue of that name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} already exists")
        self.name = name


class QueueDisabled(HQueueError):
    """The queue is disabled: it rejects puts and scans until enabled."""

    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} is disabled (enable it with enable_queue)")
        self.name = name


class QueueEnabled(HQueueError):
    """The operation needs a disabled queue, as HBase's drop does."""

    def __init__(self, name: str, action: str) -> None:
        super().__init__(f"queue {name!r} must be disabled before {action}")
        self.name = name


class NoPartitionOwner(HQueueError):
    """No server took the partition in time (a failover under way, or no server up)."""

    def __init__(self, queue: str, partition_id: int, waited: float, cause: object) -> None:
        super().__init__(
            f"no server accepted puts for {queue!r} partition {partition_id} within {waited:g}s "
            f"(failover or rebalance under way, or no server running?): last error: {cause}"
        )
        self.queue, self.partition_id = queue, partition_id


class InvalidMessage(InvalidArgument):
    """A message is malformed: wrong types, empty topic, and so on."""


class MessageTooLarge(InvalidMessage):
    """A message is over the queue's size limit; nothing was written."""


class LimitExceeded(InvalidArgument):
    """A call over one of the server's limits; refused whole, so nothing was written.

    Attributes:
        limit: The server option, as ``max_put_messages``, ``max_put_bytes``
            or ``max_frame_bytes`` (``--max-put-messages``…).
        value: That option's value on the server.
    """

    def __init__(self, limit: str, value: int, message: str) -> None:
        super().__init__(message)
        self.limit, self.value = limit, value


class InvalidPartition(InvalidArgument):
    """A partition id is outside ``0 <= pid < partitions``."""


class StorageError(HQueueError):
    """The storage backend failed; the operation may not have happened."""


class StorageLocked(StorageError):
    """The embedded store is open in another process that does not share it with
    local processes (``hqueue server --no-local-socket``, or an hqueue from before sharing).

    Attributes:
        path: The store's directory.
        holder: The process that has it open (``"pid 4242: hqueue tail q"``), where known.
    """

    def __init__(self, path: str, holder: str | None = None) -> None:
        by = f" ({holder})" if holder else ""
        super().__init__(
            f"the embedded store {path} is open in another process{by} that does not share it; if that is "
            f"`hqueue server --storage local://{path} --no-local-socket`, connect with url='hqueue://host:port'; "
            "if the store's socket file (hqueue.sock) was removed under it, restart it; else close it"
        )
        self.path, self.holder = path, holder


class ServerUnavailable(HQueueError):
    """No hqueue server answered (all unreachable, or timed out)."""

    #: Whether the failed request may have reached a server.
    maybe_sent = False


class DeadlineExceeded(ServerUnavailable, TimeoutError):
    """No answer came within the call's ``timeout``, counted across every retry
    and every server tried (``hqueue://…?timeout=S``)."""


class ServerBusy(ServerUnavailable):
    """The server refused a call, unread, because its requests under way hold
    all the memory it allows them (``--max-inflight-bytes``); nothing was
    done, so the call may be sent again."""

    def __init__(self, limit: str, value: int, message: str) -> None:
        super().__init__(message)
        self.limit, self.value = limit, value


class OutcomeUnknown(HQueueError):
    """A put (or a timer put or cancel) was sent, and no answer came before the
    call's deadline (its ``timeout``).

    The server may have written the batch, or may still write it (a stalled
    server that resumes). The client does not send it again once the
    deadline has passed. Before that, a put whose connection broke after it
    was sent (the server died or closed it) is sent again to the partition's
    owner, and written once (hqueue/requests.py). None of its IDs was
    acknowledged. Scan for it, or put it again and accept a possible duplicate.

    Attributes:
        queue, partition_id: Where the put was going.
    """

    def __init__(self, message: str, queue: str | None = None, partition_id: int | None = None) -> None:
        super().__init__(message)
        self.queue, self.partition_id = queue, partition_id


class ProducerBufferFull(HQueueError, TimeoutError):
    """A producer's ``send`` found no room: the messages it holds, sent and not yet
    stored, fill its ``buffer_bytes``, and none was stored within ``block_timeout``
    (or the send came from one of the producer's Futures' callbacks, which does not
    wait). Nothing was queued; the servers (or the store) are slower than the sends.

    Attributes:
        queue, buffer_bytes, block_timeout: The producer's queue and limits.
    """

    def __init__(self, queue: str, buffer_bytes: int, block_timeout: float, *, in_callback: bool = False) -> None:
        waited = (
            "and a send from one of its Futures' callbacks does not wait for room that only the callback's "
            "own partition's next batches would free (they go once it has returned)"
            if in_callback
            else f"and no room came within block_timeout={block_timeout:g}s"
        )
        super().__init__(
            f"the producer of {queue!r} holds its buffer_bytes={buffer_bytes:,} of unsent messages, {waited}: "
            "the message was not queued"
        )
        self.queue, self.buffer_bytes, self.block_timeout = queue, buffer_bytes, block_timeout


class ProducerClosed(HQueueError):
    """A send to a producer that is closed (or closing)."""


class BatchTooLarge(InvalidMessage):
    """A batch is over what one put call carries (messages or bytes); nothing was written.

    A batch is atomic, so it is not split: put it as several batches."""


class SubscriberActive(HQueueError):
    """Another instance of this subscriber is attached and alive; a second one is refused."""


class NotAuthorized(HQueueError):
    """The server wants a token (``hqueue://TOKEN@host:port``), or the token's roles do not cover the call."""


class CoordinationError(HQueueError):
    """ZooKeeper (or the local coordinator) failed."""


class NotPartitionOwner(HQueueError):
    """This server does not own the partition; ``owner`` says who does."""

    def __init__(self, queue: str, partition_id: int, owner: str | None = None) -> None:
        where = f"; owner is {owner}" if owner else ""
        super().__init__(f"not the owner of {queue!r} partition {partition_id}{where}")
        self.queue, self.partition_id, self.owner = queue, partition_id, owner


class Fenced(NotPartitionOwner):
    """The store refused a write: another server has taken the partition since this one did (SPEC C10).

    Nothing of the write is kept (its messages are never visible), so a client
    retries it on the partition's new owner, as for any NotPartitionOwner.
    """

    def __init__(self, queue: str, partition_id: int, why: object = None) -> None:
        super().__init__(queue, partition_id, None)
        detail = f"this write held epoch {why}" if why is not None and not isinstance(why, str) else why
        self.args = (f"{self.args[0]}: another server took it" + (f" ({detail})" if detail else ""),)


class GroupNotFound(HQueueError, LookupError):
    """No consumer group of that name on the queue."""

    def __init__(self, queue: str, group: str) -> None:
        super().__init__(f"no consumer group {group!r} on queue {queue!r}")
        self.queue, self.group = queue, group


class SubscriberNotFound(HQueueError, LookupError):
    """No subscriber of that name is registered on the queue."""

    def __init__(self, name: str, queue: str) -> None:
        super().__init__(f"subscriber {name!r} is not registered on queue {queue!r}")
        self.name, self.queue = name, queue


class SubscriberExists(HQueueError):
    """A subscriber of that name is already registered on the queue."""
