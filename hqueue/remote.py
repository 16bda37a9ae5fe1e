"""The remote client: the engine's API, served by hqueue servers over Thrift.

``HQueue("q", url="hqueue://h1:9700,h2:9700")`` uses a :class:`RemoteEngine`
in place of the in-process engine, so the whole Python API works the same.

* Puts go to the partition's owner (from ``getQueueLocations``, cached).
  ``TNotPartitionOwner`` or a dead server makes the client refresh the
  locations and retry with backoff, for up to ``owner_timeout`` seconds;
  after that it raises :class:`~hqueue.errors.NotPartitionOwner`.
* A put of more than 10,000 messages or 16 MiB is split into calls, each
  atomic; if one fails, the error's note says which messages are written.
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
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict
from operator import add
from typing import Any

from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from .checks import check_partition, message_columns
from .config import InfoCache, QueueInfo, QueueState
from .errors import HQueueError, InvalidArgument, NoPartitionOwner, NotPartitionOwner, OutcomeUnknown, ServerUnavailable
from .ids import consecutive
from .keys.timers import Timer
from .message import Message, MessageID, messages_from_columns, rowkeys_by_partition
from .rpc import packed, wire
from .rpc.pool import Connection, NotSent, Pool
from .scanner import Scan

logger = logging.getLogger(__name__)


def parse_url(url: str) -> tuple[list[str], str | None, dict[str, str]]:
    """``hqueue://[TOKEN@]h1:9700,h2:9700[?k=v…]`` -> (servers, token, options)."""
    if not isinstance(url, str) or not url.startswith("hqueue://"):
        raise InvalidArgument(f"an hqueue server URL starts with hqueue://, got {url!r}")
    rest, _, query = url[len("hqueue://") :].partition("?")
    token, at, hosts = rest.rpartition("@")
    servers = [s.strip() for s in hosts.strip("/").split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"an hqueue:// URL lists host:port servers, got {server!r}")
    if not servers:
        raise InvalidArgument(f"an hqueue:// URL needs at least one host:port: {url!r}")
    options = dict(urllib.parse.parse_qsl(query))
    unknown = set(options) - {"timeout", "tls", "ca"}
    if unknown:
        raise InvalidArgument(f"unknown hqueue:// URL options {sorted(unknown)} (known: timeout, tls, ca)")
    return servers, urllib.parse.unquote(token) if at else None, options


def _batches(topics: list[bytes], values: list[bytes]) -> Iterator[tuple[int, int]]:
    """(start, stop) of each put call: at most MAX_PUT_BATCH messages and about MAX_PUT_BYTES."""
    if len(topics) <= wire.MAX_PUT_BATCH and sum(map(len, values)) + sum(map(len, topics)) <= wire.MAX_PUT_BYTES:
        yield 0, len(topics)  # the common case, decided in C
        return
    start, size = 0, 0
    for index, message_size in enumerate(map(add, map(len, topics), map(len, values))):
        if index > start and (index - start >= wire.MAX_PUT_BATCH or size + message_size > wire.MAX_PUT_BYTES):
            yield start, index
            start, size = index, 0
        size += message_size
    yield start, len(topics)


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

    serves_subscriptions = True

    def __init__(
        self, url: str, *, timeout: float | None = None, owner_timeout: float = 30.0, token: str | None = None
    ) -> None:
        self._seeds, url_token, options = parse_url(url)
        self.url = "hqueue://" + url.partition("?")[0][len("hqueue://") :].rpartition("@")[2]  # never the token
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
        self.owner_timeout = owner_timeout
        self._pools: dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._locations: dict[str, list[str]] = {}
        self._infos = InfoCache(self._describe_info, stale_on=(ServerUnavailable,))
        self._turn = -1  # group_receive asks the owners in turn
        self._locations_checked: dict[str, float] = {}

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

    # -- subscriptions ----------------------------------------------------------------

    def add_subscriber(
        self,
        queue: str,
        name: str,
        topics: Collection[bytes] | None,
        partitions: dict[int, MessageID | None] | None,
        dead_letter_after: int | None = None,
    ) -> None:
        starts = None
        if partitions is not None:
            starts = [
                wire.T.TPartitionStart(partitionID=pid, startID=wire.to_tid(start) if start else None)
                for pid, start in sorted(partitions.items())
            ]
        topic_list = sorted(topics) if topics is not None else None
        self._call("addSubscriber", queue, name, topic_list, starts, dead_letter_after, queue=queue)

    def delete_subscriber(self, queue: str, name: str) -> None:
        self._call("deleteSubscriber", name, queue, queue=queue)

    def list_subscribers(self, queue: str) -> list[str]:
        return list(self._call("listSubscribers", queue, queue=queue))

    def describe_subscriber(self, queue: str, name: str) -> dict[str, Any]:
        t = self._call("describeSubscriber", name, queue, queue=queue)
        return {
            "name": name,
            "queue": queue,
            "address": t.address or None,
            "topics": frozenset(t.topics) if t.topics is not None else None,
            "partitions": frozenset(t.partitions) if t.partitions is not None else None,
            "checkpoints": {p: wire.from_tid(i) for p, i in (t.checkpoints or {}).items()},
            "lag_messages": dict(t.lagMessages or {}),
            "lag_millis": dict(t.lagMillis or {}),
        }

    def set_checkpoint(self, queue: str, name: str, partition_id: int | None, start: MessageID) -> None:
        self._call(
            "setCheckpoint", queue, name, -1 if partition_id is None else partition_id, wire.to_tid(start), queue=queue
        )

    def coordination(self) -> str:
        return self._call("getCoordination")

    def subscriber_heartbeat(self, queue: str, name: str, address: str, topics: Collection[bytes] | None) -> None:
        self._call("subscriberHeartbeat", queue, name, address, sorted(topics) if topics else None, queue=queue)

    def subscriber_leave(self, queue: str, name: str) -> None:
        self._call("subscriberLeave", queue, name, queue=queue)

    # -- puts -----------------------------------------------------------------------

    def put(self, name: str, messages: Sequence[Message], partition_id: int) -> list[MessageID]:
        """Write to the partition's owner, following moves until ``owner_timeout``."""
        # Check here too, so a bad batch fails at once, with the argument named.
        topics, values = message_columns(self.enabled_queue(name), messages)
        ids: list[MessageID] = []
        for start, stop in _batches(topics, values):
            try:
                ids += self._put_packed(name, partition_id, topics[start:stop], values[start:stop])
            except HQueueError as e:
                if ids:  # a split batch is atomic call by call: say what is written already
                    e.add_note(f"{len(ids)} of the {len(topics)} messages were written, IDs {ids[0]} to {ids[-1]}")
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
                raise NoPartitionOwner(name, partition_id, self.owner_timeout, problem) from problem
            logger.info("%s to %s/%d: %s; retrying in %.2fs", what, name, partition_id, problem, delay)
            time.sleep(delay)
            delay, fresh = min(delay * 2, 1.0), True

    # -- timers (SPEC X1) ------------------------------------------------------------------

    def schedule(self, name: str, messages: Sequence[Message], partition_id: int, due: int) -> list[Timer]:
        topics, values = message_columns(self.enabled_queue(name), messages)
        if len(topics) > wire.MAX_PUT_BATCH or sum(map(len, values)) > wire.MAX_PUT_BYTES:
            raise InvalidArgument(
                f"a timer put takes at most {wire.MAX_PUT_BATCH} messages and {wire.MAX_PUT_BYTES} bytes in one call"
            )
        blob = packed.pack(topics, values)
        what = f"timer put of {len(topics)} message(s)"
        result = self._owner_call(name, partition_id, what, "scheduleTimers", partition_id, blob, due)
        return [Timer(partition_id, due, i) for i in consecutive(wire.from_tid(result.firstID), result.count)]

    def cancel_timer(self, name: str, timer: Timer) -> bool:
        return self._owner_call(name, timer.partition_id, "cancel", "cancelTimer", wire.to_ttimer(timer))

    # -- consumer groups (SPEC X3) -----------------------------------------------------------

    def _group_locations(self, name: str, fresh: bool = False) -> list[str]:
        """Partition owners for group calls: cached, and read again every few seconds
        (so a member finds servers that joined) or after a failure."""
        now = time.monotonic()
        if fresh or now >= self._locations_checked.get(name, 0.0) + LOCATION_REFRESH:
            self._locations_checked[name] = now
            return self.locations(name, fresh=True)
        return self.locations(name)

    def _owners(self, name: str, fresh: bool = False) -> list[str]:
        return sorted({owner for owner in self._group_locations(name, fresh) if owner})

    def group_open(
        self, queue: str, group: str, topics: Collection[bytes] | None, start: int, max_retries: int
    ) -> None:
        topic_list = sorted(topics) if topics is not None else None
        self._call("openGroup", queue, group, topic_list, start, max_retries, queue=queue)

    def group_receive(
        self, queue: str, group: str, member: str, max_messages: int, lease: float, wait: float
    ) -> list[tuple[Message, int]]:
        """Ask each owner for work without waiting, then wait at one (in turn) for the rest of ``wait``."""
        deadline = time.monotonic() + wait
        owners = self._owners(queue)
        if not owners:
            raise NoPartitionOwner(queue, -1, 0, None)
        self._turn = (self._turn + 1) % len(owners)
        owners = owners[self._turn :] + owners[: self._turn]
        while True:
            for index, owner in enumerate(owners):
                last = index == len(owners) - 1
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000)) if last else 0
                try:
                    deliveries = self._call_at(
                        owner,
                        "groupReceive",
                        queue,
                        group,
                        member,
                        max_messages,
                        int(lease * 1000),
                        wait_ms,
                        queue=queue,
                    )
                except ServerUnavailable:
                    self._locations_checked.pop(queue, None)  # find the partitions' new owners next time
                    raise
                if deliveries.attempts:
                    messages = messages_from_columns(*packed.unpack(deliveries.messages))
                    return list(zip(messages, deliveries.attempts, strict=True))
            if time.monotonic() >= deadline:
                return []

    def _by_owner(self, queue: str, rowkeys: Sequence[bytes], fresh: bool = False) -> dict[str, list[bytes]]:
        locations = self._group_locations(queue, fresh)
        by_owner: dict[str, list[bytes]] = {}
        for pid, mine in rowkeys_by_partition(rowkeys).items():
            owner = locations[pid] if pid < len(locations) else ""
            if not owner:
                raise NoPartitionOwner(queue, pid, 0, None)
            by_owner.setdefault(owner, []).extend(mine)
        return by_owner

    def _receipts_call(
        self, queue: str, rowkeys: Sequence[bytes], method: str, before: tuple = (), after: tuple = ()
    ) -> int:
        """``method(queue, *before, rowkeys, *after)`` at each owner, with the rowkeys of its
        partitions; the sum of what they answer."""
        return sum(
            self._call_at(owner, method, queue, *before, wire.pack_rowkeys(mine), *after, queue=queue)
            for owner, mine in self._by_owner(queue, rowkeys).items()
        )

    def group_ack(self, queue: str, group: str, rowkeys: Sequence[bytes]) -> int:
        return self._receipts_call(queue, rowkeys, "groupAck", (group,))

    def group_nack(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes], delay: float | None) -> int:
        delay_ms = -1 if delay is None else int(delay * 1000)
        return self._receipts_call(queue, rowkeys, "groupNack", (group, member), (delay_ms,))

    def group_dead_letter(self, queue: str, group: str, member: str, rowkeys: Sequence[bytes]) -> int:
        return self._receipts_call(queue, rowkeys, "groupDeadLetter", (group, member))

    def group_leave(self, queue: str, group: str, member: str) -> None:
        for owner in self._owners(queue):
            try:
                self._call_at(owner, "groupLeave", queue, group, member, queue=queue)
            except ServerUnavailable:
                pass  # its leases run out there

    def list_groups(self, queue: str) -> list[str]:
        return list(self._call("listGroups", queue, queue=queue))

    def describe_group(self, queue: str, group: str) -> dict[str, Any]:
        """Each owner's part, merged: every partition once, members as any owner sees them."""
        result: dict[str, Any] = {}
        partitions: dict[int, dict[str, Any]] = {}
        members: set[str] = set()
        for owner in self._owners(queue):
            t = self._call_at(owner, "describeGroup", queue, group, queue=queue)
            members.update(t.members or [])
            result = {
                "queue": queue,
                "group": group,
                "topics": frozenset(t.topics) if t.topics is not None else None,
                "start": t.startMillis,
                "max_retries": t.maxRetries,
                "dead_letters": t.deadLetters,
            }
            for pid, p in (t.partitions or {}).items():
                partitions[pid] = {
                    "done": wire.from_tid(p.done),
                    "scan": wire.from_tid(p.scan),
                    "in_flight": p.inFlight,
                    "retrying": p.retrying,
                    "acked_ahead": p.ackedAhead,
                    "retries": p.retries,
                    "lag_messages": p.lagMessages,
                    "lag_millis": p.lagMillis,
                }
        return {**result, "members": sorted(members), "partitions": dict(sorted(partitions.items()))}

    def group_set_position(self, queue: str, group: str, partition_id: int | None, start: MessageID) -> None:
        info = self.queue_info(queue, fresh=True)
        pids = range(info.partitions) if partition_id is None else [check_partition(info, partition_id)]
        for pid in pids:
            self._owner_call(queue, pid, "replay", "setGroupPosition", group, pid, wire.to_tid(start))

    def delete_group(self, queue: str, group: str) -> None:
        self._call("deleteGroup", queue, group, queue=queue)

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
