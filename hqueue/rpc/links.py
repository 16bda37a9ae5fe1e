"""The event loop's side of each connection (:class:`Link`), and what the loop watches
each for: its next call, room for its reply, or nothing (rpc/loop.py's LoopServer)."""

from __future__ import annotations

import selectors
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .connections import Connection
from .threaded import ThreadedServer

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


@dataclass(eq=False)
class Link:
    """The loop's side of one connection."""

    sock: socket.socket
    connection: Connection
    #: What came and is not yet a whole call (and whole calls waiting for their turn).
    buffer: bytearray = field(default_factory=bytearray)
    #: What of a reply the socket has not taken yet.
    out: memoryview | None = None
    #: Bytes of the in-flight budget that reply holds until it is all sent, and whose they are.
    held: int = 0
    owner: str = ""
    #: A worker has the connection (its call, or a big frame's reading): the loop leaves it alone.
    busy: bool = False
    #: When the frame now partly read, or the reply partly sent, began (None: neither).
    started: float | None = None
    #: When the connection last did anything.
    last: float = 0.0
    #: The events the selector watches for it.
    events: int = 0
    closed: bool = False
    #: Answers held for the turn's fsync (:meth:`LoopServer._settle`), in order, and the
    #: bytes they hold of whose share of the budget.
    waiting: list[bytes] | None = None
    waiting_held: dict[str, int] = field(default_factory=dict)
    #: Its next call needs a worker: it waits until the held answers are sent.
    paused: bool = False
    #: It has whole calls left from its share of the last turn (LoopServer._more): nothing
    #: more is read of it meanwhile, so what it holds here stays bounded.
    more: bool = False
    #: The peer closed its side: its calls read already are still answered, then it ends.
    eof: bool = False
    #: Bytes of a call refused from its head still to come, thrown away as they do.
    skip: int = 0
    #: The turn of the loop it last ran calls in, and how many it ran then (CALLS_A_TURN).
    turn: int = -1
    ran: int = 0


class Syncs(Protocol):
    """What the loop needs of the store for SYNC_WAL writes (hqueue.storage.base.Storage)."""

    def defer_syncs(self) -> None: ...

    def deferred(self) -> bool: ...

    def settle(self) -> None: ...


class Watching(ThreadedServer):
    """The selector's watch of each link, kept as what the link needs now (a part of LoopServer)."""

    _selector: selectors.BaseSelector

    if TYPE_CHECKING:

        def _close(self, link: Link) -> None: ...

    def _listen(self, link: Link) -> None:
        """Watch for what the connection waits for now: its next call, its reply's room, or
        nothing (a worker has it, it has calls left to run, or its peer sent all it will);
        a connection whose peer closed ends once nothing of it is left to do."""
        if link.closed:
            return
        if link.eof and not (link.busy or link.out is not None or link.more or link.paused) and link.waiting is None:
            self._close(link)  # its calls are all answered (a partial frame never will be)
            return
        want = 0 if link.busy else _WRITE if link.out is not None else 0 if link.more or link.eof else _READ
        if want != link.events:
            try:
                if not link.events:
                    self._selector.register(link.sock, want, link)
                elif not want:
                    self._selector.unregister(link.sock)
                else:
                    self._selector.modify(link.sock, want, link)
            except (KeyError, ValueError) as e:  # the selector's watch is not what the link says
                self._rewatch(link, want, e)
            link.events = want

    def _watched(self, link: Link) -> selectors.SelectorKey | None:
        """The selector's key for the link's socket, if it watches it (by descriptor, or by the
        socket itself once closed)."""
        try:
            return self._selector.get_map().get(link.sock)
        except (KeyError, ValueError):
            return None

    def _rewatch(self, link: Link, want: int, error: Exception) -> None:
        """Watch the link for ``want`` from whatever the selector holds: a fault of the loop's
        own (the link thought itself watched for ``link.events``), logged with what it found,
        and set right rather than ending the loop."""
        key = self._watched(link)
        other = getattr(key, "data", None)
        whose = "it" if other is link else "the wake-up" if other is None else f"connection {other.connection.id}"
        found = "nothing" if key is None else f"{key.events} for {whose}"
        self.log.exception(
            "rewatch", "the loop's watch of connection %d was not as kept (%d; the selector: %s; %s): set again",
            link.connection.id, link.events, found, error,
        )  # fmt: skip
        if key is not None:
            self._selector.unregister(key.fileobj)
        if want:
            self._selector.register(link.sock, want, link)

    def _unwatch(self, link: Link) -> None:
        """The selector no longer watches the link's socket (what it kept of it aside)."""
        key = self._watched(link)
        if key is not None and key.data is link:
            self._selector.unregister(key.fileobj)
        link.events = 0
