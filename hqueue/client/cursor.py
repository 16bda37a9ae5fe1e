"""RemoteCursor: a server-side scanner over one partition, read ``caching`` messages a round trip,
with the requests for the next AHEAD batches on the wire while a batch is handed out.

A scanner lives on one connection of one server. When it is lost (the
connection broke: the server restarted, or the process serving a shared
``local://`` store was killed and another took it over; or the server no
longer has it: idle past its timeout), the cursor opens another, on a new
connection, right after the last message it handed out, and goes on: no
message twice, none skipped. It keeps trying so until the call's deadline.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from thriftpy2.thrift import TException, args_to_kwargs
from thriftpy2.transport import TTransportException

from ..errors import HQueueError, InvalidArgument, ServerBusy, ServerUnavailable
from ..message import Message, messages_from_columns
from ..rpc import packed, wire
from ..scanner import Scan, recreated
from .pool import Connection, NotSent

logger = logging.getLogger(__name__)

#: Seconds between two tries to open a lost scanner again (doubling up to ``_MAX_DELAY``).
_FIRST_DELAY, _MAX_DELAY = 0.01, 0.25

#: Batches asked for ahead of the one being handed out: the server reads the next one
#: while this process unpacks the last, and always has one more to read (never idle
#: between two requests). Each is at most ``caching`` messages and SCAN_REPLY_BYTES.
AHEAD = 2
#: A scan left part-way reads the answers to its requests ahead, then closes its scanner,
#: when they may come to this many bytes at most (at the last answer's size); else it drops
#: its connection instead, and the server frees the scanner with it: a ``break`` after the
#: first message of 16 MiB batches read 32 MiB more (2 s over a link of 1 s round trips).
DRAIN_BYTES = 1024 * 1024


class _Lost(Exception):
    """The scanner is gone with its connection, or the server no longer has it."""

    def __init__(self, cause: BaseException, sent: bool = True) -> None:
        super().__init__(str(cause))
        self.cause, self.sent = cause, sent


def drains(cursor: Any) -> bool:
    """Whether a cursor of either client closing part-way reads its answers ahead
    (DRAIN_BYTES), rather than drop its connection."""
    return cursor._ahead * cursor.last_bytes <= DRAIN_BYTES


def unpacked(cursor: Any, blob: bytes) -> tuple[list[bytes], list[bytes]]:
    """A scanner's answer unpacked (cell keys, values), for a cursor of either client. One
    that is not a packed batch is the server's fault (a broken or hostile one), not the
    caller's (``packed.unpack``'s InvalidArgument): ServerUnavailable, the cursor ended
    and its connection dropped."""
    try:
        return packed.unpack_cells(blob)
    except InvalidArgument as e:
        cursor.done = True
        cursor._release(broken=True)
        raise ServerUnavailable(f"hqueue server {cursor.server}: a scanner's answer is not a packed batch ({e})") from e


def taken(cursor: Any, blob: bytes) -> tuple[list[bytes], list[bytes], Scan | None, bool]:
    """A scanner's answer, for a cursor of either client: its cell keys and values, what is
    left of the scan after them, and whether the scan ended there (then the cursor's scan
    is moved on; else that is the caller's, once its next requests are sent)."""
    cursor.last_bytes = len(blob)
    keys, values = unpacked(cursor, blob)
    after = cursor._scan.after(keys[-1]) if keys and cursor._scan is not None else cursor._scan
    # A short reply is the end, unless the server cut it at its byte limit.
    ended = (len(keys) < cursor.caching and packed.payload_bytes(blob) < wire.SCAN_REPLY_BYTES) or after is None
    if ended:
        cursor._scan, cursor.last_bytes = after, 0  # (the answers ahead are empty: read, not dropped)
    return keys, values, after, ended


def scanner_error(e: TException, queue: str) -> Exception:
    """What a scanner call's IDL exception means: _Lost when the server no longer has
    the scanner (opened again by the cursor), else the hqueue error it carries."""
    error = wire.from_thrift_error(e, queue)
    return _Lost(error) if isinstance(error, InvalidArgument) and wire.SCANNER_GONE in str(error) else error


def owner_among(owners: list[str], partition_id: int, seeds: list[str]) -> str:
    """Where a partition's scanner goes: its owner in ``owners`` (``""`` where none; a list
    read before its queue was made again may be short), else any server."""
    return (owners[partition_id] if partition_id < len(owners) else "") or random.choice(seeds)


class RemoteCursor:
    """A server-side scanner over one partition, read ``caching`` at a time.

    The server binds a scanner to the connection that opened it, so the
    cursor keeps one connection of the pool until it is closed. Opening it
    (finding the owner, connecting, ``messageScannerOpen``) is one call with
    one deadline, and so is each fetch; either goes on through a lost
    scanner by opening another (the module's docstring).
    """

    def __init__(self, engine: Any, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.engine, self.queue, self.partition_id = engine, queue, partition_id
        self.caching = min(caching, wire.MAX_SCAN_BATCH)
        #: What is left to read: the scan, after the last message handed out.
        self._scan: Scan | None = scan
        self.done = True
        self._connection: Connection | None = None
        self._pool: Any = None
        #: The scanner's ID on the server (-1: none opened yet).
        self.scanner_id = -1
        #: Requests for the next batches sent, their answers not read yet (at most AHEAD).
        self._ahead = 0
        #: The size of the last answer (what one still to come may be: ``drains``).
        self.last_bytes = 0
        with engine.deadline() as deadline:
            #: The queue's ``created`` (QueueInfo): a scanner opened again reads the same queue.
            self.created = engine.queue_info(queue).created
            # Any server can serve a scan (the store is shared); prefer the owner.
            owners = engine.locations(queue)
            if partition_id >= len(owners):  # (cached, of a queue with fewer partitions, made again since)
                owners = engine.locations(queue, fresh=True)
            self.server = owner_among(owners, partition_id, engine._seeds)
            self.done = False
            try:
                self._retrying(deadline, "messageScannerOpen", lambda: None)
            except BaseException:
                self.done = True
                self._release(broken=True)
                raise

    # -- calls, through lost scanners -------------------------------------------------

    def _retrying(self, deadline: float, method: str, call: Any) -> Any:
        """``call()`` on an open scanner, opening one first where there is none; a lost
        scanner is opened again, until ``deadline``."""
        delay = _FIRST_DELAY
        while True:
            try:
                if self._connection is None:
                    self._open(deadline)
                return call()
            except _Lost as lost:
                # A scanner gone is a clean answer; but one of several sent ahead leaves the others'
                # answers to come: that connection is not given back.
                self._release(broken=bool(self._ahead) or not isinstance(lost.cause, InvalidArgument))
                never_opened = self.scanner_id == -1 and not lost.sent  # no server there: as any call, at once
                if never_opened or time.monotonic() + delay >= deadline or isinstance(lost.cause, TimeoutError):
                    cause = lost.cause if isinstance(lost.cause, Exception) else TimeoutError()
                    raise self.engine._unavailable(self.server, method, cause, deadline, lost.sent) from lost.cause
                logger.info("scanner of %s/%d lost (%s); opening another", self.queue, self.partition_id, lost)
                time.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
                self._find_server()
            except ServerBusy:
                # Refused unread (the server's memory for answers is full): nothing was read, the
                # scanner is where it was, and the next answer (sent ahead, or asked again) is its
                # next batch. Again after a pause, within the deadline.
                if time.monotonic() + delay >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)

    def _open(self, deadline: float) -> None:
        """A connection, and a scanner on it over what is left of the scan."""
        if self.scanner_id != -1:  # opened again (a server restarted, an owner moved): the same queue?
            try:
                created = self.engine.queue_info(self.queue, fresh=True).created
            except ServerUnavailable as e:  # (none answers yet: tried again as a lost scanner, by the deadline)
                raise _Lost(e, sent=False) from e
            if created != self.created:
                raise recreated(self.queue)
        self._pool = self.engine._pool(self.server)
        try:
            self._connection = self._pool.take(deadline)
        except NotSent as e:
            raise _Lost(e.cause, sent=False) from e.cause
        assert self._scan is not None
        self.scanner_id = self._call("messageScannerOpen", self.queue, self.partition_id, wire.to_tscan(self._scan))
        logger.debug("opened remote scanner %d of %s/%d on %s", self.scanner_id, self.queue, self.partition_id,
                     self.server)  # fmt: skip

    def _find_server(self) -> None:
        """Where the next scanner goes: the partition's owner now, else any server."""
        try:
            self.server = self.engine.locations(self.queue, fresh=True)[self.partition_id] or self.server
        except (HQueueError, IndexError):  # (IndexError: a queue made again with fewer partitions)
            self.server = random.choice(self.engine._seeds)

    def _call(self, method: str, *args: Any) -> Any:
        """One call on the scanner's connection; _Lost if the scanner is gone."""
        return self._exchange(method, args, send=True, receive=True)

    def _exchange(self, method: str, args: tuple, *, send: bool, receive: bool) -> Any:
        """Send ``method(*args)`` and/or read its answer on the scanner's connection."""
        if self._connection is None:
            raise _Lost(ServerUnavailable(f"hqueue server {self.server}: the scanner's connection broke"))
        deadline = self.engine.current_deadline() or time.monotonic() + self.engine.timeout
        self._connection.socket.deadline = deadline
        client = self._connection.client
        try:
            if send and receive:
                return getattr(client, method)(*args)
            if send:
                spec = getattr(client._service, method + "_args").thrift_spec
                return client._send(method, **args_to_kwargs(spec, *args))
            return client._recv(method)
        except (TTransportException, OSError) as e:
            raise _Lost(e) from e
        except TException as e:
            raise scanner_error(e, self.queue) from e
        except BaseException:
            # Cut short (an exception raised in a signal handler, KeyboardInterrupt): what was
            # read of the answer, and which answers are still to come, is unknown. The
            # connection goes; the next fetch opens another scanner after the last message.
            self._release(broken=True)
            raise

    def _get_packed(self) -> bytes:
        """The next batch: the answer to the oldest request sent ahead, or to one sent now."""
        args = (self.scanner_id, self.caching)
        if not self._ahead:
            return self._exchange("messageScannerGetPacked", args, send=True, receive=True)
        self._ahead -= 1  # (a lost scanner sets it to 0 before the next try)
        return self._exchange("messageScannerGetPacked", args, send=False, receive=True)

    def _send_ahead(self) -> None:
        """Ask for the next batches now (up to AHEAD of them), to read their answers at the next fetches."""
        try:
            while self._ahead < AHEAD:
                self._exchange("messageScannerGetPacked", (self.scanner_id, self.caching), send=True, receive=False)
                self._ahead += 1
        except _Lost:
            self._release(broken=True)  # the next fetch opens another scanner, after the last message
        except HQueueError:
            pass

    def _release(self, broken: bool = False) -> None:
        self._ahead = 0
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.give_back(connection, broken)

    # -- reading ----------------------------------------------------------------------

    def fetch(self) -> list[Message]:
        return messages_from_columns(*self.fetch_columns())

    def fetch_columns(self) -> tuple[list[bytes], list[bytes]]:
        with self.engine.deadline() as deadline:
            blob = self._retrying(deadline, "messageScannerGetPacked", self._get_packed)
            keys, values, after, ended = taken(self, blob)
            if ended:
                self.close()
            else:
                self._send_ahead()  # cut short there: this batch was never handed out, and is read again
                self._scan = after
        return keys, values

    def close(self) -> None:
        if not self.done:
            self.done = True
            if not drains(self):
                self._release(broken=True)
                return
            try:
                while self._ahead:  # the answers to the requests sent ahead come first
                    self._get_packed()
                self._call("messageScannerClose", self.scanner_id)
            except (_Lost, HQueueError):
                self._release(broken=True)  # gone already, or stalled: its connection is dropped
                return
            self._release()

    def __del__(self) -> None:
        # Abandoned before the end: drop the connection (no call from a finalizer);
        # the server frees the scanner with it.
        if not getattr(self, "done", True):
            self.done = True
            self._release(broken=True)
