"""AsyncRemoteCursor: a server-side scanner over one partition, awaited chunk by chunk.

As :class:`~hqueue.client.cursor.RemoteCursor`: the server binds the scanner to
the connection that opened it, so the cursor keeps one connection until it is
closed; opening it is one call with one deadline, and so is each fetch. A fetch
cancelled mid-way drops the connection (the server frees the scanner with it).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ...errors import HQueueError, ServerUnavailable
from ...message import Message, messages_from_columns
from ...rpc import packed, wire
from ...scanner import Scan
from .transport import AsyncConnection, AsyncPool, NotSentError


class AsyncRemoteCursor:
    def __init__(self, engine: Any, queue: str, partition_id: int, caching: int) -> None:
        self.engine, self.queue, self.partition_id = engine, queue, partition_id
        self.caching = min(caching, wire.MAX_SCAN_BATCH)
        self.done = True
        self.server = ""
        self.scanner_id = -1
        self._pool: AsyncPool | None = None
        self._connection: AsyncConnection | None = None

    @classmethod
    async def open(cls, engine: Any, queue: str, partition_id: int, scan: Scan, caching: int) -> AsyncRemoteCursor:
        cursor = cls(engine, queue, partition_id, caching)
        with engine.deadline() as deadline:
            # Any server can serve a scan (the store is shared); prefer the owner.
            cursor.server = (await engine.locations(queue))[partition_id] or random.choice(engine._seeds)
            cursor._pool = engine.pool(cursor.server)
            try:
                async with asyncio.timeout_at(deadline):
                    cursor._connection = await cursor._pool.take()
            except NotSentError as e:
                raise engine._unavailable(cursor.server, "messageScannerOpen", e.cause) from e.cause
            except TimeoutError as e:
                raise engine._unavailable(cursor.server, "messageScannerOpen", e) from e
            except TException as e:  # the token was refused
                raise wire.from_thrift_error(e, queue) from e
            cursor.done = False
            try:
                cursor.scanner_id = await cursor._call("messageScannerOpen", queue, partition_id, wire.to_tscan(scan))
            except BaseException:
                cursor.done = True
                cursor._release(broken=True)
                raise
        return cursor

    async def _call(self, method: str, *args: Any) -> Any:
        if self._connection is None:
            raise ServerUnavailable(f"hqueue server {self.server}: the scanner's connection broke")
        with self.engine.deadline() as deadline:
            try:
                async with asyncio.timeout_at(deadline):
                    return await self._connection.call(method, *args)
            except (TTransportException, OSError) as e:
                self._release(broken=True)
                raise self.engine._unavailable(self.server, method, e, sent=True) from e
            except TException as e:
                raise wire.from_thrift_error(e, self.queue) from e
            except BaseException:  # cancelled mid-call
                self.done = True
                self._release(broken=True)
                raise

    def _release(self, broken: bool = False) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and self._pool is not None:
            self._pool.give_back(connection, broken)

    async def fetch(self) -> list[Message]:
        return messages_from_columns(*await self.fetch_columns())

    async def fetch_columns(self) -> tuple[list[bytes], list[bytes]]:
        blob = await self._call("messageScannerGetPacked", self.scanner_id, self.caching)
        keys, values = packed.unpack(blob)
        # A short reply is the end, unless the server cut it at its byte limit.
        if len(keys) < self.caching and packed.payload_bytes(blob) < wire.SCAN_REPLY_BYTES:
            await self.close()
        return keys, values

    async def close(self) -> None:
        if not self.done:
            self.done = True
            try:
                await self._call("messageScannerClose", self.scanner_id)
            except HQueueError:
                pass  # gone already (idle timeout, restart), or stalled: its connection is dropped
        self._release()

    def abandon(self) -> None:
        """Drop the connection without a call (the server frees the scanner with it)."""
        self.done = True
        self._release(broken=True)
