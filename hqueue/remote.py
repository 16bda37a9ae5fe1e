"""The remote client: the engine's API, served by hqueue servers over Thrift.

``HQueue("q", url="hqueue://h1:9700,h2:9700")`` uses a :class:`RemoteEngine`
in place of the in-process engine, so the whole Python API works the same.

* Puts go to the partition's owner (from ``getQueueLocations``, cached).
  ``TNotPartitionOwner`` or a dead server makes the client refresh the
  locations and retry with backoff, for up to ``owner_timeout`` seconds;
  after that it raises :class:`~hqueue.errors.NotPartitionOwner`.
* A put is acknowledged when its IDs come back. If a server dies after
  writing but before answering, the retry writes the batch again: delivery
  is at least once, never lost.
* Scanners are server-side (``messageScannerOpen``/``GetList``/``Close``),
  ``caching`` messages a round trip, freed by close or the server's idle
  timeout.
"""

from __future__ import annotations

import logging
import queue as queue_module
import random
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TException
from thriftpy2.transport import TFramedTransportFactory, TTransportException

from .config import InfoCache, QueueInfo, QueueState
from .engine import check_messages
from .errors import HQueueError, NoPartitionOwner, NotPartitionOwner, ServerUnavailable
from .message import Message, MessageID
from .scanner import Scan
from .server import wire

logger = logging.getLogger(__name__)


def parse_servers(url: str) -> list[str]:
    """``hqueue://h1:9700,h2:9700`` -> ``["h1:9700", "h2:9700"]``."""
    if not url.startswith("hqueue://"):
        raise ValueError(f"not an hqueue:// URL: {url!r}")
    servers = [s.strip() for s in url[len("hqueue://") :].strip("/").split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"an hqueue:// URL lists host:port servers, got {server!r} in {url!r}")
    if not servers:
        raise ValueError(f"an hqueue:// URL needs at least one host:port: {url!r}")
    return servers


class _Pool:
    """Thrift clients to one server; thriftpy2 clients are not thread-safe."""

    def __init__(self, address: str, timeout_ms: int) -> None:
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port, self.timeout_ms = address, host, int(port), timeout_ms
        self._idle: queue_module.SimpleQueue = queue_module.SimpleQueue()

    @contextmanager
    def client(self) -> Iterator[Any]:
        try:
            client = self._idle.get_nowait()
        except queue_module.Empty:
            client = make_client(
                wire.T.HQueueService,
                self.host,
                self.port,
                proto_factory=TBinaryProtocolFactory(),
                trans_factory=TFramedTransportFactory(),
                timeout=self.timeout_ms,
            )
        try:
            yield client
        except (TTransportException, OSError):
            client.close()  # the connection is in an unknown state
            raise
        except BaseException:
            self._idle.put(client)  # an answer came back (a typed error): the connection is fine
            raise
        self._idle.put(client)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue_module.Empty:
                return


class RemoteEngine:
    """The engine API over hqueue servers.

    Args:
        url: ``hqueue://host:port[,host:port…]``.
        timeout: Socket timeout of one call, in seconds.
        owner_timeout: How long a put waits for its partition to have an
            owner (failover, rebalance) before it fails.
    """

    def __init__(self, url: str, *, timeout: float = 30.0, owner_timeout: float = 30.0) -> None:
        self.url = url
        self._seeds = parse_servers(url)
        self._timeout_ms = int(timeout * 1000)
        self.owner_timeout = owner_timeout
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()
        self._locations: dict[str, list[str]] = {}
        self._infos = InfoCache(self._describe_info, stale_on=(ServerUnavailable,))

    # -- calls ----------------------------------------------------------------------

    def _pool(self, address: str) -> _Pool:
        with self._lock:
            pool = self._pools.get(address)
            if pool is None:
                pool = self._pools[address] = _Pool(address, self._timeout_ms)
            return pool

    def _call_at(self, address: str, method: str, *args, queue: str | None = None, pid: int = -1):
        """One call at one server; IDL exceptions become hqueue errors."""
        try:
            with self._pool(address).client() as client:
                return getattr(client, method)(*args)
        except (TTransportException, OSError) as e:
            raise ServerUnavailable(f"hqueue server {address}: {method}: {e}") from e
        except TException as e:
            raise wire.from_thrift_error(e, queue, pid) from e

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

    def locations(self, name: str, *, fresh: bool = False) -> list[str]:
        """``host:port`` of each partition's owner (``""`` where none)."""
        if fresh or name not in self._locations:
            self._locations[name] = list(self._call("getQueueLocations", name, queue=name))
        return self._locations[name]

    # -- subscriptions ----------------------------------------------------------------

    def add_subscriber(
        self, queue: str, name: str, topics: Collection[bytes] | None, partitions: dict[int, MessageID | None] | None
    ) -> None:
        starts = None
        if partitions is not None:
            starts = [
                wire.T.TPartitionStart(partitionID=pid, startID=wire.to_tid(start) if start else None)
                for pid, start in sorted(partitions.items())
            ]
        self._call("addSubscriber", queue, name, sorted(topics) if topics is not None else None, starts, queue=queue)

    def delete_subscriber(self, name: str, queue: str) -> None:
        self._call("deleteSubscriber", name, queue, queue=queue)

    def list_subscribers(self, queue: str) -> list[str]:
        return list(self._call("listSubscribers", queue, queue=queue))

    def describe_subscriber(self, name: str, queue: str) -> dict[str, Any]:
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
        check_messages(self.enabled_queue(name), messages)
        tmessages = [wire.T.TMessage(topic=m.topic, value=m.value) for m in messages]
        deadline = time.monotonic() + self.owner_timeout
        delay, fresh = 0.02, False
        while True:
            try:
                locations = self.locations(name, fresh=fresh)
                owner = locations[partition_id] if partition_id < len(locations) else ""
                if owner:
                    ids = self._call_at(
                        owner, "putMessagesWithPid", name, partition_id, tmessages, queue=name, pid=partition_id
                    )
                    return [wire.from_tid(i) for i in ids]
                problem: HQueueError = NotPartitionOwner(name, partition_id, None)
            except (NotPartitionOwner, ServerUnavailable) as e:
                problem = e
            if time.monotonic() >= deadline:
                raise NoPartitionOwner(name, partition_id, self.owner_timeout, problem) from problem
            logger.info("put to %s/%d: %s; retrying in %.2fs", name, partition_id, problem, delay)
            time.sleep(delay)
            delay, fresh = min(delay * 2, 1.0), True

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
    """A server-side scanner over one partition, read ``caching`` at a time."""

    def __init__(self, engine: RemoteEngine, queue: str, partition_id: int, scan: Scan, caching: int) -> None:
        self.engine, self.queue, self.caching = engine, queue, caching
        # Any server can serve a scan (the store is shared); prefer the owner.
        owner = engine.locations(queue)[partition_id] or random.choice(engine._seeds)
        self.server = owner
        self.scanner_id = engine._call_at(
            owner, "messageScannerOpen", queue, partition_id, wire.to_tscan(scan), queue=queue
        )
        self.done = False

    def fetch(self) -> list[Message]:
        tmessages = self.engine._call_at(self.server, "messageScannerGetList", self.scanner_id, self.caching)
        if len(tmessages) < self.caching:
            self.close()
        return [wire.from_stored_tmessage(t) for t in tmessages]

    def close(self) -> None:
        if not self.done:
            self.done = True
            try:
                self.engine._call_at(self.server, "messageScannerClose", self.scanner_id)
            except HQueueError:
                pass  # gone already (idle timeout, server restart): nothing to free
