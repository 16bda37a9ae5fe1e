"""RemoteCursor: a server-side scanner over one partition, read ``caching`` messages a round trip."""

from __future__ import annotations

import random
import time
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ..errors import HQueueError, ServerUnavailable
from ..message import Message, messages_from_columns
from ..rpc import packed, wire
from ..scanner import Scan
from .pool import Connection, NotSent


class RemoteCursor:
    """A server-side scanner over one partition, read ``caching`` at a time.

    The server binds a scanner to the connection that opened it, so the
    cursor keeps one connection of the pool until it is closed. Opening it
    (finding the owner, connecting, ``messageScannerOpen``) is one call with
    one deadline, and so is each fetch.
    """

    def __init__(self, engine: Any, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.engine, self.queue, self.caching = engine, queue, min(caching, wire.MAX_SCAN_BATCH)
        self.done = True
        self._connection: Connection | None = None
        with engine.deadline() as deadline:
            # Any server can serve a scan (the store is shared); prefer the owner.
            self.server = engine.locations(queue)[partition_id] or random.choice(engine._seeds)
            self._pool = engine._pool(self.server)
            try:
                self._connection = self._pool.take(deadline)
            except NotSent as e:
                raise engine._unavailable(self.server, "messageScannerOpen", e.cause, deadline) from e.cause
            self.done = False
            try:
                self.scanner_id = self._call("messageScannerOpen", queue, partition_id, wire.to_tscan(scan))
            except BaseException:
                self.done = True
                self._release()
                raise

    def _call(self, method: str, *args):
        if self._connection is None:
            raise ServerUnavailable(f"hqueue server {self.server}: the scanner's connection broke")
        deadline = self.engine.current_deadline() or time.monotonic() + self.engine.timeout
        self._connection.socket.deadline = deadline
        try:
            return getattr(self._connection.client, method)(*args)
        except (TTransportException, OSError) as e:
            self._release(broken=True)
            raise self.engine._unavailable(self.server, method, e, deadline) from e
        except TException as e:
            raise wire.from_thrift_error(e, self.queue) from e

    def _release(self, broken: bool = False) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.give_back(connection, broken)

    def fetch(self) -> list[Message]:
        return messages_from_columns(*self.fetch_columns())

    def fetch_columns(self) -> tuple[list[bytes], list[bytes]]:
        blob = self._call("messageScannerGetPacked", self.scanner_id, self.caching)
        keys, values = packed.unpack(blob)
        # A short reply is the end, unless the server cut it at its byte limit.
        if len(keys) < self.caching and packed.payload_bytes(blob) < wire.SCAN_REPLY_BYTES:
            self.close()
        return keys, values

    def close(self) -> None:
        if not self.done:
            self.done = True
            try:
                self._call("messageScannerClose", self.scanner_id)
            except HQueueError:
                pass  # gone already (idle timeout, server restart), or stalled: its connection is dropped
            self._release()

    def __del__(self) -> None:
        # Abandoned before the end: drop the connection (no call from a finalizer);
        # the server frees the scanner with it.
        if not getattr(self, "done", True):
            self.done = True
            self._release(broken=True)
