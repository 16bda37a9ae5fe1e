"""Servers that give no answer in time: how long a client waits for one before it asks
another (a read any server answers: :func:`server_share`; a call at a partition's owner:
:func:`silent_owner_at`), and which servers it asks last (:class:`SilentServers`).

A server paused past its ZooKeeper session (SIGSTOP, a long GC, a frozen VM) holds every
call sent to it, unanswered, while another server takes its partitions over within
seconds: a client that waited for it until each call's deadline stood still as long.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import DeadlineExceeded, HQueueError, NotPartitionOwner, OutcomeUnknown, ServerUnavailable

#: The least time a read any server can answer gives one server (see :func:`server_share`):
#: a read slower than that is not answered by a server that has more seeds after it.
MIN_SERVER_TRY = 5.0


def server_share(deadline: float, now: float, servers_left: int) -> float:
    """When one try of a read any server can answer gives up on its server: at its share
    of what is left, with ``servers_left`` to try (this one too), at least
    :data:`MIN_SERVER_TRY` (the last one tried has all that is left). A paused server took
    the whole deadline, and the next one, which would have answered, was never asked (a put
    following its partition's new owner after a failover raised DeadlineExceeded)."""
    return min(deadline, now + max(MIN_SERVER_TRY, (deadline - now) / servers_left))


#: Seconds a server that gave no answer within a try's share is asked last by its client.
SILENT_FOR = 30.0
#: Seconds a client trusts the addresses a server's name resolved to (SilentServers).
RESOLVED_FOR = 60.0


def endpoint(sockaddr: tuple) -> str:
    """``ip:port`` of a resolved socket address."""
    return f"{sockaddr[0]}:{sockaddr[1]}"


class SilentServers:
    """Servers that lately gave no answer within a try's share (a paused one, most likely):
    a client asks them last, for :data:`SILENT_FOR` seconds. A paused server among the
    seeds otherwise took a share of every read that drew it first (up to half a 24 s
    deadline, again at each one), and a put's look for its partition's new owner asked it first too."""

    def __init__(self, resolve: bool = True) -> None:
        #: Until when each endpoint ("ip:port", each its address resolves to) is asked last.
        self._until: dict[str, float] = {}
        #: Each address's endpoints and when they were resolved: a seed spelled
        #: "localhost:9700" is the owner that advertises "127.0.0.1:9700" (and was asked
        #: first though silent). Names are looked up only when ``resolve`` (an event loop's
        #: client must not wait on DNS: its addresses are compared as IP literals only).
        self._endpoints: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._flags = 0 if resolve else socket.AI_NUMERICHOST

    def _resolved(self, address: str) -> tuple[str, ...]:
        now = time.monotonic()
        known = self._endpoints.get(address)
        if known is not None and now - known[0] < RESOLVED_FOR:
            return known[1]
        host, _, port = address.rpartition(":")
        try:
            infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=self._flags)
        except (OSError, ValueError, UnicodeError):  # (a name not looked up, or not now: as it is spelled)
            return (address,)
        endpoints = tuple(sorted({endpoint(info[4]) for info in infos})) or (address,)
        self._endpoints[address] = (now, endpoints)
        return endpoints

    def mark(self, address: str) -> None:
        until = time.monotonic() + SILENT_FOR
        for endpoint in self._resolved(address):
            self._until[endpoint] = until

    def silent(self, address: str) -> bool:
        """Whether ``address`` (however it is spelled) gave no answer lately."""
        return any(endpoint in self._until for endpoint in self._resolved(address))

    def put_unanswered(self, owner: str, error: DeadlineExceeded, until: float, deadline: float) -> None:
        """A put at ``owner`` got no answer by ``until`` (:func:`silent_owner_at`): ``error`` again
        if that was its deadline; else ``owner`` is marked silent, and a put that never went is
        a ServerUnavailable the caller sends to whoever owns the partition. Returning, the put
        may have gone: the caller asks who owns the partition now (:func:`still_owner`)."""
        if until >= deadline:
            raise error
        self.mark(owner)  # (asked last: the look for the owner goes to the others first)
        if not error.maybe_sent:
            raise not_sent_to(owner, error) from error

    def order(self, seeds: list[str]) -> list[str]:
        """The servers to ask, in random order, the silent ones last."""
        servers = random.sample(seeds, len(seeds))
        if self._until:
            now = time.monotonic()
            for address, until in list(self._until.items()):
                if until <= now:
                    self._until.pop(address, None)
            servers.sort(key=self.silent)  # (stable: still random within each)
        return servers


#: The least time a put waits for its partition's owner before the client asks the other
#: servers who owns the partition now (:func:`silent_owner_at`).
MIN_OWNER_TRY = 2.0


def silent_owner_at(deadline: float, now: float) -> float:
    """When a put stops waiting for its partition's owner and asks the other servers who owns
    the partition now: after an eighth of what is left of its deadline, at least
    :data:`MIN_OWNER_TRY`. An owner paused past its ZooKeeper session (SIGSTOP, a long GC, a
    frozen VM) held every put sent to it until its deadline, though another server had taken
    its partitions over within seconds. Named still, the owner gets the put again (marked
    resent: written once, :mod:`hqueue.requests`) with the rest of the deadline; moved, the
    put is not sent to the new owner: it may be half written at the paused one (an HBase
    write is undone by a writer the fence refuses, after the new owner could have read its
    record), so it is OutcomeUnknown at once, and the next puts go to the new owner."""
    return min(deadline, next_share(deadline, now))


def owner_try(deadline: float, now: float) -> float:
    """How long a call waits for a partition's owner before it asks who owns the partition
    now: an eighth of what is left of its ``deadline``, at least :data:`MIN_OWNER_TRY`."""
    return max(MIN_OWNER_TRY, (deadline - now) / 8)


def next_share(deadline: float, now: float) -> float:
    """When a group call still waiting for its partitions' owner reads the owners again
    (:func:`owner_try` from ``now``)."""
    return now + owner_try(deadline, now)


def group_call_unanswered(owner: str, method: str, seconds: float) -> ServerUnavailable:
    """The failure of a group call (a receive, an ack…) that got no answer from its
    partitions' ``owner``, which owns none of them any more (paused past its ZooKeeper
    session: another server took them over): one the call goes on from at the new
    owners. A paused owner held every group call sent to it until the call's deadline,
    then raised DeadlineExceeded, though another server had its partitions within seconds."""
    failure = ServerUnavailable(
        f"hqueue server {owner}: {method}: no answer in {seconds:.1f}s, and it owns none of the "
        "queue's partitions any more: going on at their owners"
    )
    failure.maybe_sent = True
    return failure


def not_sent_to(owner: str, error: ServerUnavailable) -> ServerUnavailable:
    """A put that could not even be sent to its silent owner: safe to send to whoever owns the partition."""
    failure = ServerUnavailable(f"hqueue server {owner}: silent, the put not sent: {error}")
    failure.maybe_sent = False
    return failure


@contextmanager
def maybe_went(
    name: str, partition_id: int, what: str, silent: str, started: float, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """Around what follows a put's first try, which may have reached its owner ``silent``:
    a later try that could not go (its deadline passed while the owner was looked for)
    leaves the put unsure, not unsent (said not sent, a put the resumed owner then wrote was
    put again by its caller: a duplicate, a timer fired twice; an attacker's pass). One the
    resumed owner refuses as no longer its partition's is OutcomeUnknown: the first try may
    have been written before the move (see :func:`silent_owner_at`)."""
    try:
        yield
    except ServerUnavailable as e:
        e.maybe_sent = True
        e.silent_owner = silent  # type: ignore[attr-defined]  # (the put goes to no other owner: _owner_call)
        raise
    except NotPartitionOwner as e:  # (Fenced too: its owner is not said)
        raise owner_moved(name, partition_id, what, silent, e.owner or "another server", clock() - started) from e


def still_owner(name: str, partition_id: int, what: str, silent: str, owner: str | None, seconds: float) -> None:
    """Raise OutcomeUnknown if the partition of a put its owner ``silent`` did not answer has
    another ``owner`` now (None: none could say: the owner may be slow, not paused)."""
    if owner is not None and owner != silent:
        raise owner_moved(name, partition_id, what, silent, owner, seconds)


#: What to do about a put whose outcome is unknown; another call's (``advice``) says its own.
PUT_ADVICE = "scan for it, or put it again and accept a possible duplicate"


def owner_moved(
    name: str, partition_id: int, what: str, silent: str, owner: str, seconds: float, advice: str = PUT_ADVICE
) -> OutcomeUnknown:
    """The OutcomeUnknown of a put (or another call: ``advice``) whose owner went silent and
    whose partition moved meanwhile."""
    return OutcomeUnknown(
        f"{what} to {name!r} partition {partition_id}: sent to hqueue server {silent}, which gave no answer in "
        f"{seconds:.1f}s, and {owner or 'no server'} owns the partition now: it may have taken effect before the "
        f"takeover, so it is not sent again ({advice})",
        name,
        partition_id,
    )


def owner_gone(name: str, partition_id: int, what: str, silent: str, idempotent: bool, seconds: float) -> HQueueError:
    """What a call at a partition's owner (a timer's cancel, a group's replay) raises once
    the silent owner owns the partition no more: one that may go twice is a
    NotPartitionOwner (sent to the new owner), another is OutcomeUnknown at once."""
    if idempotent:
        return NotPartitionOwner(name, partition_id, None)
    return owner_moved(name, partition_id, what, silent, "another server", seconds, "see whether it took effect")
