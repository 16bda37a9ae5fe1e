"""The push threads (SPEC C7): a fixed pool runs every subscriber's loop.

A :class:`SubscriberLoop` holds one subscriber's partition workers
(delivery.py) and its one connection to the subscriber; a loop runs on one
thread at a time, so batches of a partition go out in order. The
:class:`PushPool`'s threads (``--push-threads``, 8 by default) take the
loops that have work in turn, one worker step each, so 300 subscribers cost
8 threads, not 300, and a slow subscriber holds at most one of them for a
send (up to the send timeout); slow ones together hold at most a quarter of
them (:data:`SLOW_SHARE`), and one that does not answer its connection's
challenge is let go after :data:`HANDSHAKE_TIMEOUT`.

The connection (:meth:`SubscriberLoop.send`) is where the push channel is
guarded (push.py): the server pushes only to an address some server
approved (or in ``--subscriber-allow``), only to a subscriber that
announced a key, over TLS pinned to the subscriber's certificate when it
announced one (a TLS server pushes over nothing else), and proves each push.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TApplicationException, TClient, TException
from thriftpy2.transport import TFramedTransportFactory

from ..auth import PushCredentials
from ..errors import HQueueError
from ..groups.state import STARVE_GUARD
from ..rpc import packed, wire
from ..rpc.bounded import BoundedSocket, BoundedSSLSocket
from ..rpc.connections import RateLimitedLog
from .delivery import AGAIN, FINISHED, IDLE, Batch, Manager, PartitionWorker
from .push import check_pin, mac, mac_packed, pinned_context
from .registry import Registration

logger = logging.getLogger(__name__)

#: Push threads per server, by default.
DEFAULT_PUSH_THREADS = 8
#: Seconds a subscriber has to accept a connection and answer its challenge (the send
#: timeout, a minute by default, is for pushes: a listener may take that long over a batch).
HANDSHAKE_TIMEOUT = 5.0
#: A subscriber whose last push took longer than this (or timed out) is slow: at most
#: one push thread in SLOW_SHARE runs slow subscribers at once, so that subscribers
#: which never answer (a hostile listener held all 8 threads for a minute at a time, and
#: every other subscriber's pushes waited) leave the others most of the pool.
SLOW_PUSH = 5.0
SLOW_SHARE = 4
#: The largest answer a subscriber may send (a status, a challenge, a refusal's words), in bytes.
MAX_PUSH_ANSWER = 64 * 1024
#: Seconds stop() waits for a subscriber's workers, all of them together.
STOP_TIMEOUT = 10.0
#: Seconds a worker that stops waits for a push of another partition of its subscriber to
#: end by itself, before it cuts it short (its batch comes again).
PUSH_GRACE = 1.0


class PushPool:
    """The threads that run every :class:`SubscriberLoop` of a server, in turn."""

    def __init__(self, threads: int = DEFAULT_PUSH_THREADS) -> None:
        if threads < 1:
            raise ValueError("a push pool needs a thread at least")
        lock = threading.Lock()
        #: Work for the pool's threads: a loop ready, or a timer sooner than the one they wait for.
        self.cond = threading.Condition(lock)
        #: A step ended (what stop() waits for); apart from ``cond`` so that it wakes no pool thread.
        self.settled = threading.Condition(lock)
        self._ready: deque[SubscriberLoop] = deque()
        self._timers: list[tuple[float, int, SubscriberLoop, PartitionWorker]] = []
        self._seq = itertools.count()
        self._stopped = False
        #: Threads that may run slow subscribers at once, and how many do.
        self.slow_threads, self._slow_running = max(1, threads // SLOW_SHARE), 0
        self._threads = [
            threading.Thread(target=self._run, name=f"hqueue-push-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    # -- called under self.cond ----------------------------------------------------------

    def schedule(self, loop: SubscriberLoop) -> None:
        if not loop.running and not loop.queued:
            loop.queued = True
            self._ready.append(loop)
            self.cond.notify()

    def later(self, delay: float, loop: SubscriberLoop, worker: PartitionWorker) -> None:
        entry = (time.monotonic() + delay, next(self._seq), loop, worker)
        heapq.heappush(self._timers, entry)
        if self._timers[0] is entry:  # sooner than what the waiting threads wait for
            self.cond.notify()

    def _next(self) -> tuple[SubscriberLoop, PartitionWorker] | None:
        while True:
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, loop, worker = heapq.heappop(self._timers)
                if loop.workers.get(worker.partition_id) is worker:
                    loop.ready_now(worker)
            waiting: list[SubscriberLoop] = []  # slow ones while their threads are all taken
            taken = None
            while self._ready:
                loop = self._ready.popleft()
                stop = loop.stopping_first()  # (a worker's stop saves and pushes nothing: never held back)
                if loop.slow and not stop and self._slow_running >= self.slow_threads:
                    waiting.append(loop)
                    continue
                loop.queued = False
                if loop.has_ready():
                    loop.running, loop.ran_slow = True, loop.slow and not stop
                    self._slow_running += loop.ran_slow
                    taken = loop, loop.pick()
                    break
            self._ready.extendleft(reversed(waiting))  # (in their turn, once a slow one ends)
            if taken is not None:
                return taken
            if self._stopped:
                return None
            self.cond.wait(self._timers[0][0] - now if self._timers else None)

    # -- the threads ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cond:
                taken = self._next()
            if taken is None:
                return
            loop, worker = taken
            result = worker.step(loop)
            with self.cond:
                loop.after(worker, result)
                loop.running = False
                if loop.ran_slow:
                    loop.ran_slow = False
                    self._slow_running -= 1
                    if self._ready:
                        self.cond.notify()  # a slow one waiting may run now
                if loop.has_ready():
                    self.schedule(loop)  # behind the other subscribers: round robin
                self.settled.notify_all()  # stop() may wait for the loop to be idle

    def stop(self) -> None:
        with self.cond:
            self._stopped = True
            self.cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)


class SubscriberLoop:
    """Every partition this server delivers to one subscriber, over one connection."""

    def __init__(self, manager: Manager, pool: PushPool, queue: str, name: str) -> None:
        self.manager, self.pool, self.queue, self.subscriber = manager, pool, queue, name
        self.workers: dict[int, PartitionWorker] = {}
        self._ready: deque[PartitionWorker] = deque()
        #: Kept under the pool's lock: on a pool thread now; in the pool's ready queue; counted
        #: among the slow ones running.
        self.running = self.queued = self.ran_slow = False
        #: Its last push took over SLOW_PUSH, or timed out (set on its pool thread).
        self.slow = False
        self._socket: Any = None
        #: The worker whose push is under way (None: none).
        self._sending: PartitionWorker | None = None
        self._picks = 0
        self._client: Any = None
        self._connected_to: tuple[str, PushCredentials] | None = None
        self._challenge = b""
        self._sequence = 0
        #: Whether the subscriber on the connection takes packed pushes (until it says it does not).
        self._packed = True
        self._refusals = RateLimitedLog(log=logger)
        # Bound once: a push counts at a counter's cost, with no label lookup.
        metrics = manager.metrics
        self._seconds = metrics.delivery_seconds.labels(queue, name)
        self._delivered = metrics.delivered.labels(queue, name)
        self._failures = metrics.delivery_failures.labels(queue, name)

    # -- scheduling (under the pool's lock) --------------------------------------------------

    def ready_now(self, worker: PartitionWorker) -> None:
        """Run ``worker`` in its turn; one that stops first (it only saves its checkpoint)."""
        worker.idle = False
        if worker.stopping.is_set():
            if worker.queued:
                self._ready.remove(worker)
            worker.queued = True
            self._ready.appendleft(worker)
            if self.queued:  # (held back as slow, maybe: a thread looks again, now that it may run)
                self.pool.cond.notify()
        elif not worker.queued:
            worker.queued = True
            self._ready.append(worker)
        self.pool.schedule(self)

    def has_ready(self) -> bool:
        return bool(self._ready)

    def stopping_first(self) -> bool:
        """Whether the next worker to run stops (it pushes nothing: a slow subscriber's
        stop does not wait for a slow one's thread)."""
        return bool(self._ready) and self._ready[0].stopping.is_set()

    def pick(self) -> PartitionWorker:
        """The next ready worker: one that stops first; else in turn, but on a queue with
        priority tiers the highest tier's first, except one pick in STARVE_GUARD (SPEC X4)."""
        worker = self._ready.popleft() if self.stopping_first() else self._in_turn()
        worker.queued = worker.dirty = False  # a write from here on wakes it again
        return worker

    def _in_turn(self) -> PartitionWorker:
        self._picks += 1
        try:
            info = self.manager.engine.queue_info(self.queue)
        except HQueueError:
            info = None
        if info is None or info.priorities == 1 or self._picks % STARVE_GUARD == 0:
            return self._ready.popleft()
        worker = max(self._ready, key=lambda w: info.tier_of(w.partition_id))  # the first of the highest tier
        self._ready.remove(worker)
        return worker

    def after(self, worker: PartitionWorker, result: float) -> None:
        """Where a worker goes after a step."""
        if result == FINISHED:
            if self.workers.get(worker.partition_id) is worker:
                del self.workers[worker.partition_id]
            worker.done.set()
        elif result == AGAIN or (result == IDLE and worker.dirty):
            self.ready_now(worker)  # behind the other partitions; or written to while it scanned
        else:
            worker.idle = result == IDLE
            self.pool.later(self.manager.idle_wakeup if result == IDLE else result, self, worker)

    # -- the manager's calls (any thread) -------------------------------------------------

    def add(self, *workers: PartitionWorker) -> None:
        """Start ``workers`` together: the first pick sees them all (on a queue with priority
        tiers, the highest tier's goes first from the start)."""
        with self.pool.cond:
            for worker in workers:
                self.workers[worker.partition_id] = worker
                self.ready_now(worker)

    def wake(self, worker: PartitionWorker) -> None:
        """A write to the worker's partition: run it now if it waits for one."""
        with self.pool.cond:
            worker.dirty = True
            if worker.idle:
                self.ready_now(worker)

    def stopping(self, worker: PartitionWorker) -> None:
        """Ask ``worker`` to stop, first of the subscriber's (:meth:`removed` waits for it):
        the manager asks every worker it stops first, and then waits for each, so that a
        subscriber's other workers push nothing meanwhile."""
        worker.stopping.set()
        with self.pool.cond:
            self.ready_now(worker)

    def removed(self, worker: PartitionWorker) -> None:
        """Wait for ``worker``, asked to stop: its push under way, or another partition's
        that holds up the connection for PUSH_GRACE, is cut short."""
        if self._sending is worker:
            self._abort()
        elif not worker.done.wait(timeout=PUSH_GRACE) and self._sending is not None:
            self._abort()  # another partition's push holds the connection (not a wait for a thread)
        worker.done.wait(timeout=STOP_TIMEOUT)

    def stop(self) -> None:
        """Stop every worker (each saves its checkpoint), then close the connection. A push
        under way is cut short (its batch is delivered again later): a subscriber whose
        listener never returns held each worker's stop for a whole send timeout."""
        with self.pool.cond:
            workers = list(self.workers.values())
            for worker in workers:
                worker.stopping.set()
                self.ready_now(worker)
        self._abort()
        deadline = time.monotonic() + STOP_TIMEOUT
        for worker in workers:
            worker.done.wait(timeout=max(0.0, deadline - time.monotonic()))
        with self.pool.cond:
            self.pool.settled.wait_for(lambda: not self.running, timeout=max(0.0, deadline - time.monotonic()))
        self._drop_client()

    def _abort(self) -> None:
        """End the connection's push under way, if any (from another thread: its pool thread
        then sees the connection fail)."""
        sock = getattr(self._socket, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- MessageSender's connection (on a pool thread) ------------------------------------------

    def send(self, worker: PartitionWorker) -> bool | None:
        """Push the worker's buffer. True: the subscriber took it; False: it refused it
        (a listener failed); None: not reached, or the push was not allowed."""
        registration, batch = worker.registration, worker.buffer
        self._sending = worker
        try:
            key = self._connect(registration).key
            started = time.perf_counter()
            sock = self._socket  # (None: a stop dropped it meanwhile, and the push fails)
            if sock is not None:
                sock.deadline = time.monotonic() + self.manager.send_timeout_ms / 1000  # (the push's, all told)
            status = self._push(key, worker.partition_id, registration.epoch, batch)
        except wire.T.TPushRefused as e:
            self._refusals.warning(
                "refused", "subscriber %s on %s refused a push: %s", self.subscriber, self.queue, e.message
            )
            self._failed()
            return None
        except (TException, OSError, ssl.SSLError, HQueueError) as e:
            self._refusals.warning("failed", "%s: sending %d message(s) failed: %s", self.subscriber, len(batch), e)
            self.slow = self.slow or isinstance(e, TimeoutError)
            self._failed()
            return None
        finally:
            self._sending = None
        took = time.perf_counter() - started
        self.slow = took > SLOW_PUSH
        self._seconds.observe(took)
        if status != 0:
            logger.info("%s: subscriber returned status %s for %d message(s)", self.subscriber, status, len(batch))
            self._failures.inc()
            return False if status == 1 else None  # 2: it is stopping, which is no refusal
        self._delivered.inc(len(batch))
        return True

    def _push(self, key: bytes, pid: int, epoch: int, batch: Batch) -> int:
        """One push of ``batch``, proven (:meth:`_send`), after the key's proof on a new connection."""
        if self._sequence == 0:
            self._introduce(key, pid, epoch)
        return self._send(key, pid, epoch, batch)

    def _introduce(self, key: bytes, pid: int, epoch: int) -> None:
        """A connection's first push carries no messages: it proves the key, and the subscriber
        then takes calls over 4 KiB from it (push.py). An older subscriber refuses it, and
        takes big pushes unproven."""
        try:
            self._send(key, pid, epoch, Batch())
        except wire.T.TPushRefused:
            pass

    def _send(self, key: bytes, pid: int, epoch: int, batch: Batch) -> int:
        """One proven push of ``batch``: packed (consumePacked) unless this connection's
        subscriber does not know it, then as TMessages (consumeMessages); its status."""
        if self._packed:
            blob = packed.pack(batch.keys, batch.values)
            try:
                return self._client.consumePacked(blob, self._proof(key, pid, epoch, mac_packed, blob))
            except TApplicationException as e:
                if e.type != TApplicationException.UNKNOWN_METHOD:
                    raise
                self._packed = False  # an older subscriber: it answered, and the connection goes on
        messages = wire.to_tmessages(batch.messages())
        return self._client.consumeMessages(messages, self._proof(key, pid, epoch, mac, messages))

    def _proof(self, key: bytes, pid: int, epoch: int, sign: Callable[..., bytes], content: Any) -> Any:
        """The next push's proof: the connection's next sequence, and ``sign``'s MAC over
        the header and ``content`` (push.py)."""
        self._sequence += 1
        digest = sign(key, self._challenge, self._sequence, epoch, self.queue, self.subscriber, pid, content)
        return wire.T.TPushProof(
            queue=self.queue, subscriber=self.subscriber, partitionID=pid, epoch=epoch, sequence=self._sequence,
            mac=digest,
        )  # fmt: skip

    def _failed(self) -> None:
        self._drop_client()
        self._failures.inc()

    def _connect(self, registration: Registration) -> PushCredentials:
        """Open (or keep) the connection to the registration's address, guarded; the
        push credentials it was opened for."""
        address, push = registration.address or "", registration.push
        if self._client is not None and push is not None and self._connected_to == (address, push):
            return push
        self._drop_client()
        if push is None:
            raise HQueueError(f"subscriber {self.subscriber} announced no push key (an older hqueue?)")
        ip, port = self.manager.push_policy.check_push(address, registration.approved)
        if push.certificate is None and self.manager.require_tls:
            raise HQueueError(f"this server pushes only over TLS; subscriber {self.subscriber} listens in clear")
        timeout = self.manager.send_timeout_ms
        handshake = min(timeout, int(HANDSHAKE_TIMEOUT * 1000))
        sock: Any  # to the IP that was checked: no second lookup (see PushPolicy)
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        if push.certificate is not None:
            sock = BoundedSSLSocket(
                ip, port, socket_family=family, socket_timeout=handshake, ssl_context=pinned_context()
            )
        else:
            sock = BoundedSocket(ip, port, socket_family=family, socket_timeout=handshake)
        # The challenge's answer within the handshake's time all told (a subscriber dripping a
        # byte every few seconds held a push thread for as long as it liked: 8 of them held
        # every thread, an attacker's pass), and no answer over MAX_PUSH_ANSWER (a declared
        # 2 GB was read into memory).
        sock.deadline, sock.max_answer = time.monotonic() + handshake / 1000, MAX_PUSH_ANSWER
        transport = TFramedTransportFactory().get_transport(sock)
        self._socket = sock  # (a stop may cut the handshake short too)
        try:
            transport.open()
        except TException:
            self.slow = True  # (refused at once, or not answered within the handshake's time)
            raise
        try:
            if push.certificate is not None:
                check_pin(sock.sock, push.certificate)
            client = TClient(wire.T.HQueueSubscriberService, TBinaryProtocolFactory().get_protocol(transport))
            self._challenge = client.pushChallenge()
            sock.set_timeout(timeout)
        except BaseException:  # (a challenge not answered in time makes it slow: send's except)
            transport.close()
            raise
        self._client, self._connected_to, self._sequence, self._packed = client, (address, push), 0, True
        return push

    def _drop_client(self) -> None:
        client, self._client, self._socket = self._client, None, None  # (stop() may drop it as the pool thread does)
        if client is not None:
            client.close()
