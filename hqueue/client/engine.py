"""The remote client: the engine's API, served by hqueue servers over Thrift.

``HQueue("q", url="hqueue://h1:9700,h2:9700")`` uses a :class:`RemoteEngine`
in place of the in-process engine, so the whole Python API works the same.

* Puts go to the partition's owner (from ``getQueueLocations``, cached).
  ``TNotPartitionOwner`` or a dead server makes the client refresh the
  locations and retry with backoff, for up to ``owner_timeout`` seconds;
  after that it raises :class:`~hqueue.errors.NotPartitionOwner`.
* A put of more than 10,000 messages or 16 MiB is split into calls, each
  atomic; if one fails, the error's note says which messages are written.
  A server with lower limits refuses a call whole (LimitExceeded): the
  client learns them and splits smaller (``put_limits.py``). A server busy
  with other calls (ServerBusy) did nothing: the put is retried as for a
  move, until ``owner_timeout``.
* A put is acknowledged when its IDs come back. If a server dies after
  writing but before answering, the retry writes the batch again: delivery
  is at least once, never lost. When the retries run out after a request
  was sent, the error is :class:`~hqueue.errors.OutcomeUnknown`: the batch
  may have been written.
* A pooled connection is checked before each use, so the first call after
  a server restart (or after the server closed an idle connection) does not
  fail; a read that fails mid-call is retried once.
* URL: ``hqueue://[TOKEN@]host:port[,host:port…][?timeout=S&tls=1&ca=FILE]``.
  With a token (or ``token=``, or ``$HQUEUE_TOKEN``) every connection
  authenticates first; ``tls=1`` (or ``ca=``) speaks TLS.
* Timer puts and cancels go to the partition's owner, as puts do.
* A consumer-group member asks every partition owner for work
  (``groupReceive``: each owner serves its own partitions' share; one long
  poll at a time), and sends acks and nacks to each message's owner. Owners
  are cached for :data:`LOCATION_REFRESH` seconds, or until a call fails.
* Scanners are server-side (``messageScannerOpen``/``GetList``/``Close``),
  ``caching`` messages a round trip, freed by close or the server's idle
  timeout.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from ..api import GroupsAPI, SubscriptionsAPI
from ..auth import split_credentials
from ..checks import message_columns
from ..config import InfoCache, QueueInfo, QueueState
from ..errors import (
    HQueueError,
    InvalidArgument,
    LimitExceeded,
    NoPartitionOwner,
    NotPartitionOwner,
    OutcomeUnknown,
    ServerBusy,
    ServerUnavailable,
)
from ..ids import consecutive
from ..keys.timers import Timer
from ..message import Message, MessageID, messages_from_columns
from ..rpc import packed, wire
from ..scanner import Scan
from .groups import RemoteGroups
from .pool import Connection, NotSent, Pool
from .put_limits import PutLimits
from .subscriptions import RemoteSubscriptions

logger = logging.getLogger(__name__)


def parse_url(url: str) -> tuple[list[str], str | None, dict[str, str]]:
    """``hqueue://[TOKEN@]h1:9700,h2:9700[?k=v…]`` -> (servers, token, options)."""
    if not isinstance(url, str) or not url.startswith("hqueue://"):
        raise InvalidArgument("an hqueue server URL starts with hqueue://")
    bare, token = split_credentials(url)
    hosts, _, query = bare[len("hqueue://") :].partition("?")
    servers = [s.strip() for s in hosts.strip("/").split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("an hqueue:// URL lists host:port servers: hqueue://[TOKEN@]host:port[,host:port]")
    if not servers:
        raise InvalidArgument("an hqueue:// URL needs at least one host:port (hqueue://[TOKEN@]host:port)")
    options = dict(urllib.parse.parse_qsl(query))
    unknown = set(options) - {"timeout", "tls", "ca"}
    if unknown:
        raise InvalidArgument(f"unknown hqueue:// URL options {sorted(unknown)} (known: timeout, tls, ca)")
    return servers, token, options


def _note_written(error: HQueueError, ids: list[MessageID], total: int) -> None:
    """A split batch is atomic call by call: say on the error what is written already."""
    if ids:
        error.add_note(f"{len(ids)} of the {total} messages were written, IDs {ids[0]} to {ids[-1]}")


#: Seconds group calls trust the partitions' owners they read.
LOCATION_REFRESH = 2.0

#: Calls that change nothing, so a retry after a failure mid-call is safe.
_READS = frozenset(
    {"getQueue", "describeQueue", "listQueues", "getQueueLocations", "listSubscribers", "describeSubscriber"}
)


class RemoteEngine:
    """The engine API (:class:`~hqueue.engine.EngineAPI`) over hqueue servers.

    Args:
        url: ``hqueue://[TOKEN@]host:port[,host:port…][?timeout=S&tls=1&ca=FILE]``.
        timeout: Socket timeout of one call, in seconds (default 30, or the URL's).
        owner_timeout: How long a put waits for its partition to have an
            owner (failover, rebalance) before it fails.
        token: The token to authenticate with (default: the URL's, or ``$HQUEUE_TOKEN``).
    """

    def __init__(
        self, url: str, *, timeout: float | None = None, owner_timeout: float = 30.0, token: str | None = None
    ) -> None:
        self._seeds, url_token, options = parse_url(url)
        self.url = split_credentials(url)[0].partition("?")[0]  # never the token
        if timeout is None:
            try:
                timeout = float(options.get("timeout", 30.0))
            except ValueError:
                raise InvalidArgument(f"timeout= in an hqueue:// URL is seconds, got {options['timeout']!r}") from None
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InvalidArgument(f"'timeout' must be > 0 seconds, got {timeout!r}")
        self._timeout_ms = int(timeout * 1000)
        self._token = token or url_token or os.environ.get("HQUEUE_TOKEN") or None
        self._ssl_context = None
        if options.get("tls", "0") not in ("0", "") or "ca" in options:
            self._ssl_context = ssl.create_default_context(cafile=options.get("ca"))
        #: Whether this client speaks TLS (its subscribers then listen with TLS too).
        self.tls = self._ssl_context is not None
        self.owner_timeout = owner_timeout
        #: How puts are split into calls (lowered when a server says its limits are lower).
        self.put_limits = PutLimits()
        self._pools: dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._locations: dict[str, list[str]] = {}
        self._infos = InfoCache(self._describe_info, stale_on=(ServerUnavailable,))
        #: The services, over the same servers (kazoo-style: bound to this client).
        self.groups: GroupsAPI | None = RemoteGroups(self)
        self.subscriptions: SubscriptionsAPI | None = RemoteSubscriptions(self)

    # -- calls ----------------------------------------------------------------------

    def _pool(self, address: str) -> Pool:
        with self._lock:
            pool = self._pools.get(address)
            if pool is None:
                pool = self._pools[address] = Pool(address, self._timeout_ms, self._token, self._ssl_context)
            return pool

    def _call_at(self, address: str, method: str, *args, queue: str | None = None, pid: int = -1):
        """One call at one server; IDL exceptions become hqueue errors.

        A ServerUnavailable's ``maybe_sent`` tells whether the request may
        have reached the server (False: no connection could be made).
        """
        for attempt in (1, 2):
            try:
                with self._pool(address).client() as client:
                    return getattr(client, method)(*args)
            except NotSent as e:
                raise ServerUnavailable(f"hqueue server {address}: {method}: {e}") from e.cause
            except (TTransportException, OSError) as e:
                if attempt == 1 and method in _READS:
                    continue  # the connection broke under us: a read may go again
                error = ServerUnavailable(f"hqueue server {address}: {method}: {e}")
                error.maybe_sent = True
                raise error from e
            except TException as e:
                raise wire.from_thrift_error(e, queue, pid) from e
        raise AssertionError("unreachable")

    def _call(self, method: str, *args, queue: str | None = None):
        """A call any server can answer: try each, in random order."""
        servers = random.sample(self._seeds, len(self._seeds))
        failures = []
        for address in servers:
            try:
                return self._call_at(address, method, *args, queue=queue)
            except ServerUnavailable as e:
                failures.append(str(e))
        raise ServerUnavailable("no hqueue server answered: " + "; ".join(failures))

    # -- queue metadata -------------------------------------------------------------

    def queue_info(self, name: str, *, fresh: bool = False) -> QueueInfo:
        # While no server answers, serve what we knew: puts then retry until owner_timeout.
        return self._infos.get(name, fresh=fresh)

    def enabled_queue(self, name: str) -> QueueInfo:
        return self._infos.enabled(name)

    def _describe_info(self, name: str) -> QueueInfo:
        return wire.from_tinfo(self._call("getQueue", name, queue=name))

    def create_queue(self, info: QueueInfo) -> None:
        self._call("createQueue", wire.to_tinfo(info), queue=info.name)

    def set_state(self, name: str, state: str) -> QueueInfo:
        self._call("disableQueue" if state == QueueState.DISABLED else "enableQueue", name, queue=name)
        self._infos.forget(name)
        return self.queue_info(name, fresh=True)

    def truncate_queue(self, name: str) -> None:
        self._call("truncateQueue", name, queue=name)

    def delete_queue(self, name: str) -> None:
        self._call("dropQueue", name, queue=name)
        self._infos.forget(name)
        self._locations.pop(name, None)

    def list_queues(self) -> list[QueueInfo]:
        return [wire.from_tinfo(t) for t in self._call("listQueues")]

    def describe_queue(self, name: str) -> dict[str, Any]:
        description = self._call("describeQueue", name, queue=name)
        info = wire.from_tinfo(description.info)
        result = asdict(info)
        estimate = description.messageCountEstimate
        result["message_count_estimate"] = None if estimate is None or estimate < 0 else estimate
        last = {pid: wire.from_tid(t) for pid, t in (description.lastIDs or {}).items()}
        result["last_ids"] = {pid: last.get(pid) for pid in range(info.partitions)}
        return result

    def partition_locations(self, name: str) -> list[str]:
        """``host:port`` of each partition's owner now (``""`` where none)."""
        return self.locations(name, fresh=True)

    def locations(self, name: str, *, fresh: bool = False) -> list[str]:
        """``host:port`` of each partition's owner (``""`` where none)."""
        if fresh or name not in self._locations:
            self._locations[name] = list(self._call("getQueueLocations", name, queue=name))
        return self._locations[name]

    # -- puts -----------------------------------------------------------------------

    def put(self, name: str, messages: Sequence[Message], partition_id: int) -> list[MessageID]:
        """Write to the partition's owner, following moves until ``owner_timeout``."""
        # Check here too, so a bad batch fails at once, with the argument named.
        topics, values = message_columns(self.enabled_queue(name), messages)
        ids: list[MessageID] = []
        while len(ids) < len(topics):
            try:
                for start, stop in self.put_limits.batches(topics, values, len(ids)):
                    ids += self._put_packed(name, partition_id, topics[start:stop], values[start:stop])
            except LimitExceeded as e:
                if self.put_limits.learn(e):
                    continue  # refused whole, nothing written: again, split smaller
                _note_written(e, ids, len(topics))
                raise
            except HQueueError as e:
                _note_written(e, ids, len(topics))
                raise
        return ids

    def _put_packed(self, name: str, partition_id: int, topics: list[bytes], values: list[bytes]) -> list[MessageID]:
        blob = packed.pack(topics, values)
        result = self._owner_call(
            name, partition_id, f"put of {len(topics)} message(s)", "putPacked", partition_id, blob
        )
        return consecutive(wire.from_tid(result.firstID), result.count)

    def _owner_call(self, name: str, partition_id: int, what: str, method: str, *args: Any) -> Any:
        """Call ``method(name, *args)`` at ``partition_id``'s owner, following moves
        until ``owner_timeout``."""
        deadline = time.monotonic() + self.owner_timeout
        delay, fresh, maybe_sent = 0.02, False, False
        while True:
            try:
                locations = self.locations(name, fresh=fresh)
                owner = locations[partition_id] if partition_id < len(locations) else ""
                if owner:
                    return self._call_at(owner, method, name, *args, queue=name, pid=partition_id)
                problem: HQueueError = NotPartitionOwner(name, partition_id, None)
            except (NotPartitionOwner, ServerUnavailable) as e:
                problem = e
                maybe_sent = maybe_sent or getattr(e, "maybe_sent", False)
            if time.monotonic() >= deadline:
                if maybe_sent:
                    raise OutcomeUnknown(
                        f"{what} to {name!r} partition {partition_id}: a request was sent but no answer came "
                        f"within {self.owner_timeout:g}s; it may have taken effect (a put's messages may have "
                        f"been written): {problem}"
                    ) from problem
                if isinstance(problem, ServerBusy):  # the owner is there, but had no room all along
                    raise problem
                raise NoPartitionOwner(name, partition_id, self.owner_timeout, problem) from problem
            logger.info("%s to %s/%d: %s; retrying in %.2fs", what, name, partition_id, problem, delay)
            time.sleep(delay)
            delay, fresh = min(delay * 2, 1.0), True

    # -- timers (SPEC X1) ------------------------------------------------------------------

    def schedule(self, name: str, messages: Sequence[Message], partition_id: int, due: int) -> list[Timer]:
        topics, values = message_columns(self.enabled_queue(name), messages)
        self.put_limits.check_whole(len(topics), sum(map(len, values)) + sum(map(len, topics)))
        blob = packed.pack(topics, values)
        what = f"timer put of {len(topics)} message(s)"
        try:
            result = self._owner_call(name, partition_id, what, "scheduleTimers", partition_id, blob, due)
        except LimitExceeded as e:
            self.put_limits.learn(e)  # for the next ones; timers go in one call, so this one is refused
            raise
        return [Timer(partition_id, due, i) for i in consecutive(wire.from_tid(result.firstID), result.count)]

    def cancel_timer(self, name: str, timer: Timer) -> bool:
        return self._owner_call(name, timer.partition_id, "cancel", "cancelTimer", wire.to_ttimer(timer))

    # -- scans ----------------------------------------------------------------------

    def open_cursor(self, queue: str, partition_id: int, scan: Scan, caching: int) -> RemoteCursor:
        return RemoteCursor(self, queue, partition_id, scan, caching)

    # -- lifetime -------------------------------------------------------------------

    def release(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


class RemoteCursor:
    """A server-side scanner over one partition, read ``caching`` at a time.

    The server binds a scanner to the connection that opened it, so the
    cursor keeps one connection of the pool until it is closed.
    """

    def __init__(self, engine: RemoteEngine, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.engine, self.queue, self.caching = engine, queue, min(caching, wire.MAX_SCAN_BATCH)
        # Any server can serve a scan (the store is shared); prefer the owner.
        self.server = engine.locations(queue)[partition_id] or random.choice(engine._seeds)
        self._pool = engine._pool(self.server)
        try:
            self._connection: Connection | None = self._pool.take()
        except NotSent as e:
            raise ServerUnavailable(f"hqueue server {self.server}: {e}") from e.cause
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
        try:
            return getattr(self._connection.client, method)(*args)
        except (TTransportException, OSError) as e:
            self._release(broken=True)
            raise ServerUnavailable(f"hqueue server {self.server}: {method}: {e}") from e
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
                pass  # gone already (idle timeout, server restart): nothing to free
            self._release()

    def __del__(self) -> None:
        # Abandoned before the end: drop the connection (no call from a finalizer);
        # the server frees the scanner with it.
        if not getattr(self, "done", True):
            self.done = True
            self._release(broken=True)
