"""A server's connection places: at most ``max_connections``, and whose connection is closed
to make room for a new one when all are taken.

* A connection that proved nothing (``trusted_after``: it has not authenticated, or proved a
  push) within ``FRESH`` seconds goes first, the oldest first: peers that connect and say
  nothing cannot keep out those that do.
* Then a proven connection past its owner's share (``connection_share`` of the places; the
  owner is what ``owner_of`` names: the principal with tokens, else the connection itself),
  of the owner with the most connections, its oldest: one token cannot keep every place, nor
  churn connections to close everyone else's newcomers. Those within the share are *kept*,
  never closed to make room. A proven connection past its owner's share waits in that
  owner's line, and a kept place its owner frees goes to the oldest in it; a connection
  that authenticates again counts for its new owner.
* Then a connection that has not proved anything yet but is fresher than ``FRESH``.
* With none to close, the newcomer is closed. At most ``MAX_EVICTING`` connections are being
  closed at once (shut down, their thread or the loop not done with them yet): past that a
  newcomer is closed too, so that the connections open stay within ``max_connections`` plus
  that however fast they come (a victim chosen again by every connect while it was not gone
  yet let 7,062 in of 1,024).

Every count changes under one lock, with the table of open connections: an accept sees a
place either taken or free.

:func:`fit_descriptors` makes the places fit the process's file descriptors: with the usual
soft limit of 1,024, silent peers took every descriptor before the 1,024 places were taken,
so none was closed to make room, and clients that would have proved themselves were shut
out (the accept failed: "Too many open files").
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

from .connections import Connection

logger = logging.getLogger(__name__)

#: File descriptors a server keeps beside its connections' (the store's files, its listeners,
#: ZooKeeper, the metrics and console ports, the push connections to subscribers).
SPARE_DESCRIPTORS = 512

#: Connections being closed to make room at once, at most.
MAX_EVICTING = 16
#: Seconds a new connection has to prove itself (its TLS handshake and log-in) before it
#: goes to make room ahead of proven connections past their share.
FRESH = 2.0


class Places:
    """The places of one server's connections (see the module's docstring)."""

    def __init__(self, max_connections: int, share: float, owner_of: Callable[[Connection], str]) -> None:
        self.max_connections, self.owner_of = max_connections, owner_of
        #: Connections a share keeps at most.
        self.share = max(1, int(max_connections * share))
        self.lock = threading.Lock()
        #: Places taken (the connections open, and those let in and not registered yet).
        self.taken = 0
        #: Open connections, oldest first: id -> (connection, the socket to shut down to make room).
        self.open: dict[int, tuple[Connection, Any]] = {}
        #: Connections shut down to make room and not ended yet (counted in ``taken``).
        self.evicting = 0
        #: Connections kept, per owner.
        self.kept: dict[str, int] = {}
        #: Proven connections past their owner's share, per owner, oldest first: in line for a place.
        self.waiting: dict[str, dict[int, Connection]] = {}

    def take(self) -> tuple[bool, Any]:
        """A place for a connection just accepted: (whether it gets one, the socket of the
        connection to shut down to make room for it, or None)."""
        with self.lock:
            full = self.taken >= self.max_connections
            victim = self._victim() if full else None
            if not full or victim is not None:
                self.taken += 1
                return True, victim
            return False, None

    def opened(self, connection: Connection, sock: Any) -> None:
        """``connection`` (its place taken) is open on ``sock``."""
        with self.lock:
            self.open[connection.id] = (connection, sock)

    def wrapped(self, connection: Connection, wrap: Callable[[], Any]) -> Any:
        """``wrap()`` (a TLS wrap, which detaches the socket it wraps), recorded as the socket to
        shut down to make room, all under the lock: none shuts down the detached one meanwhile."""
        with self.lock:
            sock = wrap()
            if connection.id in self.open:
                self.open[connection.id] = (connection, sock)
            return sock

    def ended(self, connection: Connection) -> None:
        """``connection`` ended: its place is free, and a kept one's goes to its owner's line."""
        with self.lock:
            self.open.pop(connection.id, None)
            self.taken -= 1
            if connection.evicted:
                self.evicting -= 1
            if connection.kept_as is not None:
                self._give(connection)
            self._unwait(connection)

    def trust(self, connection: Connection, trusted_after: Callable[[Connection], bool]) -> None:
        """After a call: whether the connection proved who it is now, and, proved, whether it
        is kept (its owner's share has room) or waits in its owner's line."""
        if not connection.trusted:
            connection.trusted = trusted_after(connection)
        if connection.trusted and (connection.kept_as is None or connection.kept_by is not connection.principal):
            owner = self.owner_of(connection)
            with self.lock:  # (one hold of it: another thread may give this connection a place meanwhile)
                if connection.id not in self.open:  # (ended meanwhile: nothing to keep)
                    return
                if connection.kept_as is not None and connection.kept_by is not connection.principal:
                    self._give(connection)
                if connection.kept_as is None and not self._hold(connection, owner):
                    self._wait(connection, owner)

    # -- under the lock ---------------------------------------------------------------------

    def _victim(self) -> Any:
        """The socket of the connection to close to make room, now marked as being closed."""
        if self.evicting >= MAX_EVICTING:
            return None
        fresh = None
        started = time.monotonic() - FRESH
        for connection, sock in self.open.values():  # (oldest first)
            if not connection.trusted and not connection.evicted:
                if connection.opened < started:
                    return self._evict(connection, sock)
                fresh = (connection, sock)
                break  # (the ones after it are fresher still)
        # A proven connection past its owner's share: the oldest of the owner holding the most.
        over_share, most = None, -1
        for owner, line in self.waiting.items():
            first = next((c for c in line.values() if not c.evicted), None)
            held = self.kept.get(owner, 0) + len(line)
            if first is not None and held > most:
                over_share, most = first, held
        if over_share is not None:
            return self._evict(over_share, self.open[over_share.id][1])
        return self._evict(*fresh) if fresh is not None else None

    def _evict(self, connection: Connection, sock: Any) -> Any:
        connection.evicted = True
        self.evicting += 1
        return sock

    def _hold(self, connection: Connection, owner: str) -> bool:
        """Keep ``connection`` for ``owner`` if its share has room."""
        kept = self.kept.get(owner, 0)
        if kept >= self.share or connection.evicted or connection.kept_as is not None:
            return False
        self._unwait(connection)
        self.kept[owner] = kept + 1
        connection.kept_as, connection.kept_by = owner, connection.principal
        return True

    def _wait(self, connection: Connection, owner: str) -> None:
        """A proven connection past ``owner``'s share: in line for a place in it."""
        if connection.waits_as != owner:
            self._unwait(connection)
            self.waiting.setdefault(owner, {})[connection.id] = connection
            connection.waits_as = owner

    def _unwait(self, connection: Connection) -> None:
        """Out of the line for a place (kept now, ended, or another owner's)."""
        if connection.waits_as is not None:
            line = self.waiting[connection.waits_as]
            del line[connection.id]
            if not line:
                del self.waiting[connection.waits_as]
            connection.waits_as = None

    def _give(self, connection: Connection) -> None:
        """``connection`` is no longer kept: its place goes to the oldest in its owner's line."""
        owner = connection.kept_as
        assert owner is not None
        connection.kept_as = connection.kept_by = None
        self.kept[owner] -= 1
        if not self.kept[owner]:
            del self.kept[owner]
        for other in list(self.waiting.get(owner, {}).values()):
            now_of = self.owner_of(other)
            if now_of != owner:  # (it authenticated again: its new owner's)
                if not self._hold(other, now_of):
                    self._wait(other, now_of)
            elif self._hold(other, owner):
                return


def fit_descriptors(max_connections: int, *, raise_limit: bool) -> int:
    """The connections a server may keep open: ``max_connections`` if the process's soft limit
    on open files holds them and :data:`SPARE_DESCRIPTORS` more; fewer where it does not.

    ``raise_limit`` (``hqueue server``, which owns its process): the soft limit is raised first,
    within the hard limit, and a server left with fewer places says so. A server inside an
    application (its embedded store's, a subscriber's push port) leaves the process's limits
    as they are and keeps what fits, quietly.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + SPARE_DESCRIPTORS
    if raise_limit and soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
            )
        except (ValueError, OSError) as e:
            logger.warning("could not raise the limit on open files (%d): %s", soft, e)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fits = max(1, soft - SPARE_DESCRIPTORS) if soft > 2 * SPARE_DESCRIPTORS else max(1, soft // 2)
    logger.log(
        logging.WARNING if raise_limit else logging.DEBUG,
        "the process may open %d files (ulimit -n; the hard limit is %s): it keeps at most %d connections, "
        "not --max-connections %d (raise the limit: LimitNOFILE= in a systemd unit, ulimit -Hn)",
        soft, "unlimited" if hard == resource.RLIM_INFINITY else hard, fits, max_connections,
    )  # fmt: skip
    return min(fits, max_connections)
