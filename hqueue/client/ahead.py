"""A consumer group member's next batch, asked for ahead (``queue.consumer(group, prefetch=True)``
over a server: ``hqueue://``, or a ``local://`` store another process serves).

A member that receives, works, acks and receives again leaves its partitions' owner idle
while it works, and waits idle while the owner takes the next batch out: each batch costs
both times, one after the other. Prefetching, once receive hands out a whole batch the
member asks for the next one at once, on a connection of its own, and reads the answer at
its next receive: the owner takes the batch out while the member works on the last one
(RabbitMQ's prefetch, Kafka's fetch ahead). Where one server owns all the queue's
partitions, the member's first ack after that batch asks for the next one instead, in its
own call (``groupAckReceive``: the ack, then a receive that does not wait; one call a batch,
not two), and the next receive takes its answer. A member whose receive comes before the
ack that was to ask (acks from other threads) asks at the receive from then on.

What it costs, and how that is bounded:

* The batch's leases run from when the owner hands it out, not from the receive that
  returns it. One whose lease has run a quarter (PREFETCH_STALE_SHARE) by then goes back unseen
  (counting no delivery attempt) and the receive takes a fresh batch.
* A receive for fewer messages than the batch holds (or with another lease) hands back
  the rest, or all of it, unseen.
* ``close()`` reads the answer before the member leaves (for at most PREFETCH_CLOSE_WAIT:
  a paused server's is left, and the leave goes on), and the leave gives its messages
  back unseen. A member that dies holding a batch ahead has each of its messages' leases
  end as for any message it held: after its connections close (or its lease), as a
  failed delivery.
* A batch is asked for ahead only after a whole one (a queue drained leaves none asked),
  within ASK_SECONDS. An answer that does not come within the receive's deadline (its
  owner watched as any group call's), or a connection that broke, is dropped, and the
  receive goes on as one that asked nothing ahead, within the same deadline. One the
  server closed after answering (it stopped or died, and the leases went with it; or it
  closed an idle connection) is given back unseen, not handed out: an ack at the
  partitions' next owner would not count (for a batch an ack brought: if a connection to
  its server broke, or was found closed, since).
* A server without ``groupAckReceive`` (an older hqueue) answers that it does not know it,
  having done nothing: the member acks on its own there from then on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, NamedTuple

from thriftpy2.thrift import TException, args_to_kwargs
from thriftpy2.transport import TTransportException

from ..config import UNSEEN
from ..errors import HQueueError
from ..groups.limits import PREFETCH_CLOSE_WAIT, PREFETCH_STALE_SHARE
from ..message import ROWKEY_LENGTH, Message
from ..rpc import wire
from ..rpc.bounded import readable_now
from .groups import Received, RemoteGroups, lease_ms, received_pairs
from .pool import Connection, Pool

logger = logging.getLogger(__name__)

#: Seconds a member gives the request for its next batch to go (a connection to make, or
#: a server slow to take it): past them it asks nothing ahead this time.
ASK_SECONDS = 1.0

_RECEIVE_SPEC = wire.T.HQueueService.groupReceive_args.thrift_spec


class _Asked(NamedTuple):
    """A groupReceive sent ahead, its answer still to read."""

    owner: str
    pool: Pool
    connection: Connection
    sent: float  # time.monotonic() when it went
    lease: float
    max_messages: int


class _Answered(NamedTuple):
    """A batch an ack asked for in its call (``groupAckReceive``), answered already."""

    pairs: Received
    sent: float
    lease: float


class GroupAhead:
    """One member's batch asked for ahead; its :meth:`receive` is :meth:`RemoteGroups.receive`'s."""

    def __init__(self, groups: RemoteGroups, queue: str, group: str, member: str) -> None:
        self._groups, self.queue, self.group, self.member = groups, queue, group, member
        self._lock = threading.Lock()
        self._asked: _Asked | _Answered | None = None
        #: (max_messages, lease) of a whole batch received at a sole owner: the next ack asks
        #: for the next batch in its call.
        self._ack_asks: tuple[int, float] | None = None
        #: A receive came before the ack that was to ask (acks from other threads, after the
        #: next receive): from then on, a receive asks ahead, as with several owners.
        self._acks_lag = False
        self.closed = False

    def receive(self, max_messages: int, lease: float, wait: float) -> list[tuple[Message, int]]:
        """Up to ``max_messages`` (message, attempt) pairs: the batch asked for ahead if it is
        there and fits, else from :meth:`RemoteGroups.receive`; after a whole batch, the next
        one is asked for. Two threads receiving at once: the second asks the owners itself."""
        with self._lock:
            asked, self._asked = self._asked, None
            if self._ack_asks is not None:  # no ack came since the last whole batch: acks lag the
                self._ack_asks, self._acks_lag = None, True  # receives (other threads'): ask at the receive
        with self._groups._engine.deadline(extra=wait):  # (one deadline for the answer and a receive afresh)
            pairs = None if asked is None else self._taken(asked, max_messages, lease)
            if pairs is None:
                if self.closed:  # (by another thread, meanwhile: its leave ended this receive)
                    return []
                pairs = self._groups.receive(self.queue, self.group, self.member, max_messages, lease, wait)
        if len(pairs) >= max_messages:
            with self._lock:
                if not self.closed and self._asked is None:
                    if not self._acks_lag and self._groups.sole_owner(self.queue) is not None:
                        self._ack_asks = (max_messages, lease)  # the ack asks, in its call
                    else:
                        self._asked = self._ask(max_messages, lease)
        return pairs

    def ack(self, rowkeys: list[bytes]) -> int:
        """:meth:`RemoteGroups.ack`; the first after a whole batch received at a sole owner asks
        for the next batch in its call (``groupAckReceive``: one call a batch, not two)."""
        with self._lock:
            asks = self._ack_asks if rowkeys else None  # (an empty ack asks nothing: the next one does)
            if asks is not None:
                self._ack_asks = None
            if self.closed or self._asked is not None:
                asks = None
        if asks is None:
            return self._groups.ack(self.queue, self.group, rowkeys)
        sent = time.monotonic()
        acked, pairs = self._groups.ack_asking(self.queue, self.group, self.member, rowkeys, *asks)
        if pairs is None:  # (the ack went on its own: nothing received)
            return acked
        with self._lock:
            closed, kept = self.closed, bool(pairs) and not self.closed and self._asked is None
            if kept:
                self._asked = _Answered(pairs, sent, asks[1])
        if closed:  # (by another thread, whose leave it may have come after, its receive counting
            with contextlib.suppress(HQueueError, RuntimeError):  # the member in again: leave again)
                self._groups.leave(self.queue, self.group, self.member)
        elif pairs and not kept:  # (another thread asked meanwhile: back, unseen)
            self._hand_back(pairs)
        return acked

    def close(self) -> None:
        """Read the answer to what was asked ahead, if anything was, within PREFETCH_CLOSE_WAIT
        (before the member leaves: the leave gives it back unseen); ask nothing more."""
        with self._lock:
            self.closed = True
            asked, self._asked = self._asked, None
        if isinstance(asked, _Asked):  # (an answered one: the leave gives it back)
            engine = self._groups._engine
            with engine.deadline_at(time.monotonic() + min(PREFETCH_CLOSE_WAIT, engine.timeout)):
                self._answer(asked)  # (none by then: its connection is dropped, and the leave goes on)

    def _ask(self, max_messages: int, lease: float) -> _Asked | None:
        """A groupReceive sent, not waiting, to the next owner in turn, within ASK_SECONDS (a
        connection to make, a server that does not take it: not asked); None if it could not
        go. It never raises: the batch just received is the caller's."""
        groups, engine = self._groups, self._groups._engine
        try:
            with engine.deadline_at(time.monotonic() + min(ASK_SECONDS, engine.timeout)) as deadline:
                owners = groups._owners(self.queue)
                if not owners:
                    return None
                groups._turn = (groups._turn + 1) % len(owners)
                owner = owners[groups._turn]
                pool = engine._pool(owner)
                connection = pool.take(deadline)
                args = (self.queue, self.group, self.member, max_messages, lease_ms(lease), 0)
                try:
                    connection.client._send("groupReceive", **args_to_kwargs(_RECEIVE_SPEC, *args))
                except BaseException:
                    pool.give_back(connection, broken=True)
                    raise
        except Exception as e:  # (no connection, refused at its authentication, a broken one...)
            logger.debug("consumer %s: asking ahead failed: %s", self.member, e)
            return None
        return _Asked(owner, pool, connection, time.monotonic(), lease, max_messages)

    def _answer(self, asked: _Asked) -> Any:
        """The answer (a TDeliveries) to what was ``asked``, read within the receive's deadline
        (the client's timeout for a close) and watched as any group call (its owner paused
        and moved: given up); None if none came, or a refusal (the receive that follows meets
        it again, and raises it)."""
        engine, connection = self._groups._engine, asked.connection
        with engine.deadline() as deadline:
            named, gone = self._groups._owner_watch(asked.owner, "groupReceive", self.queue)
            share, at_share = engine._watch(asked.owner, deadline, 0.0, named, gone)
            connection.socket.deadline, connection.socket.share, connection.socket.at_share = deadline, share, at_share
            try:
                deliveries = connection.client._recv("groupReceive")
            except TException as e:  # a typed refusal, read whole: the connection is fine
                asked.pool.give_back(connection, broken=isinstance(e, TTransportException))
                logger.debug("consumer %s: the batch asked ahead: %s", self.member, e)
                return None
            except (OSError, HQueueError) as e:
                asked.pool.give_back(connection, broken=True)
                logger.info("consumer %s: no answer to the batch asked ahead of %s: %s", self.member, asked.owner, e)
                return None
            except BaseException:
                asked.pool.give_back(connection, broken=True)
                raise
        if readable_now(connection.socket.sock):  # nothing more was asked: the server closed it since
            asked.pool.give_back(connection, broken=True)
            logger.info("consumer %s: %s closed the connection after its answer ahead", self.member, asked.owner)
            self._hand_back(received_pairs(deliveries))  # (gone: its leases went with it, and this changes nothing)
            return None
        asked.pool.give_back(connection)
        return deliveries

    def _taken(self, asked: _Asked | _Answered, max_messages: int, lease: float) -> list[tuple[Message, int]] | None:
        """What was ``asked`` ahead, if its answer came with messages that fit this receive
        (what does not fit goes back unseen); None: receive afresh."""
        if isinstance(asked, _Answered):
            pairs = asked.pairs
            if pairs.held is not None and not pairs.held():  # (its server may have stopped since: as _answer's)
                self._hand_back(pairs)
                return None
        else:
            deliveries = self._answer(asked)
            if deliveries is None:
                return None
            pairs = received_pairs(deliveries)
        if not pairs:
            return None
        given = asked.lease if pairs.lease is None else min(asked.lease, pairs.lease)  # (at most --max-lease)
        if lease != asked.lease or time.monotonic() - asked.sent > given * PREFETCH_STALE_SHARE:
            self._hand_back(pairs)
            return None
        if len(pairs) > max_messages:
            self._hand_back(pairs[max_messages:])
            del pairs[max_messages:]
        return pairs

    def _hand_back(self, pairs: list[tuple[Message, int]]) -> None:
        try:
            self._groups.nack(self.queue, self.group, self.member, [m[1][:ROWKEY_LENGTH] for m, _ in pairs], UNSEEN)
        except HQueueError as e:  # their leases run out instead
            logger.warning("consumer %s: handing back %d messages asked ahead: %s", self.member, len(pairs), e)
