"""hqueue: a partitioned, persistent message queue for Python.

Quick start::

    from hqueue import HQueue, HQueueAdmin, Message

    with HQueueAdmin() as admin:
        admin.create_queue("crawl", partitions=8, ttl=86400)
    with HQueue("crawl") as queue:
        queue.put(Message("crawler", b"http://example.com"))
        for message in queue.scan():
            print(message.id, message.topic, message.value)
"""

from .admin import HQueueAdmin
from .batch import MessageBatch
from .config import Durability, QueueInfo, QueueState
from .consumer import Consumer, Delivery, Pending
from .errors import (
    BatchTooLarge,
    CoordinationError,
    DeadlineExceeded,
    GroupNotFound,
    HQueueError,
    InvalidArgument,
    InvalidMessage,
    InvalidPartition,
    InvalidQueueName,
    LimitExceeded,
    MessageTooLarge,
    NoPartitionOwner,
    NotAuthorized,
    NotPartitionOwner,
    OutcomeUnknown,
    ProducerBufferFull,
    ProducerClosed,
    QueueDisabled,
    QueueEnabled,
    QueueExists,
    QueueNotFound,
    ServerBusy,
    ServerUnavailable,
    StorageError,
    StorageLocked,
    SubscriberActive,
    SubscriberNotFound,
)
from .groups.limits import GroupLimits
from .keys.timers import Timer
from .message import Message, MessageID, Topic
from .processor import Processor
from .producer import Producer
from .queue import HQueue
from .scanner import CombinedPartitionScanner, PartitionScanner, QueueScanner, Scan
from .splits import Split
from .subscriptions.listener import MessageListener, Subscriber, SubscriberState, Subscription

__version__ = "0.1.0"


def _share(engine, group_limits):
    """Serve an embedded store this process opens to other local processes (imported when one opens)."""
    from .server.shared import share

    share(engine, group_limits)


from . import connection as _connection  # noqa: E402

_connection.serve_stores_with(_share)

__all__ = [
    "BatchTooLarge",
    "CombinedPartitionScanner",
    "Consumer",
    "CoordinationError",
    "DeadlineExceeded",
    "Delivery",
    "Pending",
    "Durability",
    "GroupLimits",
    "GroupNotFound",
    "HQueue",
    "HQueueAdmin",
    "HQueueError",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidPartition",
    "InvalidQueueName",
    "LimitExceeded",
    "Message",
    "MessageBatch",
    "MessageID",
    "MessageListener",
    "MessageTooLarge",
    "NoPartitionOwner",
    "NotAuthorized",
    "NotPartitionOwner",
    "OutcomeUnknown",
    "Producer",
    "ProducerBufferFull",
    "ProducerClosed",
    "PartitionScanner",
    "Processor",
    "QueueDisabled",
    "QueueEnabled",
    "QueueExists",
    "QueueInfo",
    "QueueNotFound",
    "QueueScanner",
    "QueueState",
    "Scan",
    "ServerBusy",
    "ServerUnavailable",
    "Split",
    "StorageError",
    "StorageLocked",
    "Subscriber",
    "SubscriberActive",
    "SubscriberNotFound",
    "SubscriberState",
    "Subscription",
    "Timer",
    "Topic",
]
