"""AsyncRemoteCursor: a server-side scanner over one partition, awaited chunk by chunk.

As :class:`~hqueue.client.cursor.RemoteCursor`: the server binds the scanner to
the connection that opened it, so the cursor keeps one connection until it is
closed; opening it is one call with one deadline, and so is each fetch; a
scanner lost (its connection broke: the server restarted; or the server no
longer has it) is opened again after the last message handed out, until the
call's deadline. A fetch cancelled mid-way drops the connection (the server
frees the scanner with it). As the blocking cursor, it keeps the requests for
the next AHEAD batches on the wire while a batch is handed out.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ...client.cursor import _FIRST_DELAY, _MAX_DELAY, AHEAD, _Lost, drains, owner_among, scanner_error, taken
from ...errors import HQueueError, InvalidArgument, ServerBusy, ServerUnavailable
from ...message import Message, messages_from_columns
from ...rpc import wire
from ...scanner import Scan, recreated
from .transport import AsyncConnection, AsyncPool, NotSentError

logger = logging.getLogger(__name__)


class AsyncRemoteCursor:
    def __init__(self, engine: Any, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.engine, self.queue, self.partition_id = engine, queue, partition_id
        self.caching = min(caching, wire.MAX_SCAN_BATCH)
        #: What is left to read: the scan, after the last message handed out.
        self._scan: Scan | None = scan
        self.done = True
        self.server = ""
        self.created: str | None = None
        self.scanner_id = -1
        self._pool: AsyncPool | None = None
        self._connection: AsyncConnection | None = None
        #: Requests for the next batches sent, their answers not read yet (at most AHEAD).
        self._ahead = 0
        #: The size of the last answer (what one still to come may be: ``drains``).
        self.last_bytes = 0

    @classmethod
    async def open(cls, engine: Any, queue: str, partition_id: int, scan: Scan, caching: int) -> AsyncRemoteCursor:
        cursor = cls(engine, queue, partition_id, scan, caching)
        with engine.deadline() as deadline:
            cursor.created = (await engine.queue_info(queue)).created  # (as the blocking cursor)
            # Any server can serve a scan (the store is shared); prefer the owner.
            owners = await engine.locations(queue)
            if partition_id >= len(owners):  # (as the blocking cursor)
                owners = await engine.locations(queue, fresh=True)
            cursor.server = owner_among(owners, partition_id, engine._seeds)
            cursor.done = False
            try:
                await cursor._retrying(deadline, "messageScannerOpen", None)
            except BaseException:
                cursor.done = True
                cursor._release(broken=True)
                raise
        return cursor

    async def _retrying(self, deadline: float, method: str, call: Callable[[], Awaitable[Any]] | None) -> Any:
        """``call()`` on an open scanner, opening one first where there is none; a lost
        scanner is opened again, until ``deadline``."""
        loop, delay = asyncio.get_running_loop(), _FIRST_DELAY
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    if self._connection is None:
                        await self._open()
                    return None if call is None else await call()
            except _Lost as lost:
                # A scanner gone is a clean answer; but one of several sent ahead leaves the others'
                # answers to come: that connection is not given back.
                self._release(broken=bool(self._ahead) or not isinstance(lost.cause, InvalidArgument))
                never_opened = self.scanner_id == -1 and not lost.sent  # no server there: as any call, at once
                if never_opened or loop.time() + delay >= deadline:
                    raise await self.engine._unavailable(
                        self.server, method, lost.cause, lost.sent, deadline
                    ) from lost.cause
                logger.info("scanner of %s/%d lost (%s); opening another", self.queue, self.partition_id, lost)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
                if self.done:  # abandoned meanwhile (the scan ended): no scanner opened again
                    raise await self.engine._unavailable(
                        self.server, method, lost.cause, lost.sent, deadline
                    ) from lost.cause
                await self._find_server()
            except TimeoutError as e:
                self._release(broken=True)
                raise await self.engine._unavailable(self.server, method, e, sent=True) from e
            except ServerBusy:  # refused unread: the scanner is where it was (see the blocking cursor)
                if loop.time() + delay >= deadline or self.done:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
            except HQueueError:  # a typed answer: the connection is fine
                raise
            except BaseException:  # cancelled mid-call
                self.done = True
                self._release(broken=True)
                raise

    async def _open(self) -> None:
        """A connection, and a scanner on it over what is left of the scan."""
        if self.scanner_id != -1:  # (as the blocking cursor)
            try:
                created = (await self.engine.queue_info(self.queue, fresh=True)).created
            except ServerUnavailable as e:
                raise _Lost(e, sent=False) from e
            if created != self.created:
                raise recreated(self.queue)
        self._pool = self.engine.pool(self.server)
        try:
            self._connection = await self._pool.take()
        except NotSentError as e:
            raise _Lost(e.cause, sent=False) from e.cause
        except TException as e:  # the token was refused
            raise wire.from_thrift_error(e, self.queue) from e
        assert self._scan is not None
        self.scanner_id = await self._call(
            "messageScannerOpen", self.queue, self.partition_id, wire.to_tscan(self._scan)
        )

    async def _find_server(self) -> None:
        """Where the next scanner goes: the partition's owner now, else any server."""
        try:
            self.server = (await self.engine.locations(self.queue, fresh=True))[self.partition_id] or self.server
        except (HQueueError, IndexError):  # (as the blocking cursor)
            self.server = random.choice(self.engine._seeds)

    async def _call(self, method: str, *args: Any, send: bool = True, receive: bool = True) -> Any:
        """One call on the scanner's connection (or only its request, or only its answer);
        _Lost if the scanner is gone."""
        if self._connection is None:
            raise _Lost(ServerUnavailable(f"hqueue server {self.server}: the scanner's connection broke"))
        try:
            if send and receive:
                return await self._connection.call(method, *args)
            if send:
                return await self._connection.send(method, *args)
            return await self._connection.receive(method)
        except (TTransportException, OSError) as e:
            if isinstance(e, TimeoutError):
                raise
            raise _Lost(e) from e
        except TException as e:
            raise scanner_error(e, self.queue) from e

    def _release(self, broken: bool = False) -> None:
        self._ahead = 0
        connection, self._connection = self._connection, None
        if connection is not None and self._pool is not None:
            self._pool.give_back(connection, broken)

    async def fetch(self) -> list[Message]:
        return messages_from_columns(*await self.fetch_columns())

    async def _get_packed(self) -> bytes:
        """The next batch: the answer to the oldest request sent ahead, or to one sent now."""
        if not self._ahead:
            return await self._call("messageScannerGetPacked", self.scanner_id, self.caching)
        self._ahead -= 1  # (a lost scanner sets it to 0 before the next try)
        return await self._call("messageScannerGetPacked", send=False)

    async def _send_ahead(self, deadline: float) -> None:
        """Ask for the next batches now (up to AHEAD), to read their answers at the next fetches."""
        try:
            async with asyncio.timeout_at(deadline):
                while self._ahead < AHEAD:
                    await self._call("messageScannerGetPacked", self.scanner_id, self.caching, receive=False)
                    self._ahead += 1
        except (_Lost, TimeoutError):
            self._release(broken=True)  # the next fetch opens another scanner, after the last message
        except HQueueError:
            pass
        except BaseException:  # cancelled mid-request: the connection's state is unknown
            self.done = True
            self._release(broken=True)
            raise

    async def fetch_columns(self) -> tuple[list[bytes], list[bytes]]:
        with self.engine.deadline() as deadline:
            blob = await self._retrying(deadline, "messageScannerGetPacked", self._get_packed)
            keys, values, after, ended = taken(self, blob)
            if ended:
                await self.close()
            else:
                await self._send_ahead(deadline)  # cancelled there: this batch was never handed out
                self._scan = after
        return keys, values

    async def close(self) -> None:
        if not self.done:
            self.done = True
            if not drains(self):
                self._release(broken=True)
                return
            try:
                with self.engine.deadline() as deadline:
                    async with asyncio.timeout_at(deadline):
                        while self._ahead:  # the answers to the requests sent ahead come first
                            await self._get_packed()
                        await self._call("messageScannerClose", self.scanner_id)
            except (_Lost, HQueueError, TimeoutError):
                self._release(broken=True)  # gone already (idle timeout, restart), or stalled: its connection drops
                return
            except BaseException:
                self._release(broken=True)
                raise
        self._release()

    def abandon(self) -> None:
        """Drop the connection without a call (the server frees the scanner with it)."""
        self.done = True
        self._release(broken=True)
