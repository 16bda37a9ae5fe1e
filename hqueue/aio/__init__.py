"""hqueue for asyncio: :class:`AsyncHQueue`, :class:`AsyncHQueueAdmin`, :class:`AsyncConsumer`,
:class:`AsyncProducer`, :class:`AsyncSubscriber` (docs/asyncio.md).

On ``hqueue://`` every call is spoken on the event loop (an async Thrift
client: no thread per call); on a store in this process (``local://``,
``memory://``, ``hbase://``) the engine is synchronous, so each storage call
runs in a small bounded executor the handle owns.
"""

from .admin import AsyncHQueueAdmin
from .consumer import AsyncConsumer
from .producer import AsyncProducer
from .queue import AsyncHQueue
from .scanner import AsyncScanner
from .subscriber import AsyncSubscriber

__all__ = ["AsyncConsumer", "AsyncHQueue", "AsyncHQueueAdmin", "AsyncProducer", "AsyncScanner", "AsyncSubscriber"]
