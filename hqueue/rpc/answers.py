"""How the event loop answers: a reply sent without blocking, what the socket does not
take kept until it drains, and the answers of a turn that wrote held until its one fsync
(a part of rpc/loop.py's LoopServer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .frames import _HEAD
from .links import Link, Syncs
from .threaded import ThreadedServer, bare

#: Buffers one sendmsg is given at most (Linux takes 1024, IOV_MAX).
_MAX_PARTS = 512


class Answers(ThreadedServer):
    """The loop's answers (see the module's docstring)."""

    _syncs: Syncs | None
    #: The connections with answers held for this turn's fsync, in the order they wrote.
    _held: list[Link]
    #: Connections with whole calls left over from a turn (CALLS_A_TURN), for the next.
    _more: list[Link]

    if TYPE_CHECKING:

        def _listen(self, link: Link) -> None: ...

        def _calls(self, link: Link) -> None: ...

        def _drop(self, link: Link, error: Exception) -> None: ...

        def _close(self, link: Link) -> None: ...

        def _safely(self, link: Link, step: Callable[..., None], *args: Any) -> None: ...

    def _answered(self, link: Link, reply: bytes) -> None:
        if link.waiting is None and self._syncs is not None and self._syncs.deferred():
            link.waiting = []
            self._held.append(link)
        if link.waiting is not None:  # the turn wrote: every answer after it waits for its fsync
            self._trust(link.connection)
            if reply:
                link.waiting.append(reply)
                owner = self.owner_of(link.connection)  # held: counted like a reply not taken, in its share
                self.budget.hold(len(reply), owner)
                link.waiting_held[owner] = link.waiting_held.get(owner, 0) + len(reply)
            return
        self._deliver(link, self._reply, reply)

    def _deliver(self, link: Link, send: Callable[[Link, Any], None], what: Any) -> None:
        """``send(link, what)`` from the loop; then the connection ends if it was to end after it."""
        try:
            send(link, what)
        except OSError as e:
            self._drop(link, e)
            return
        if link.connection.close_after_reply and link.out is None:
            self._close(link)

    def _settle(self) -> None:
        """The turn's end: one fsync makes its SYNC_WAL writes durable, then the answers held
        for it go, and the connections go on with their next calls. If the fsync failed,
        none of those writes may be acknowledged: their connections are closed unanswered."""
        held, self._held = self._held, []
        assert self._syncs is not None
        try:
            self._syncs.settle()
            error = None
        except Exception as e:
            error = bare(e)
        for link in held:
            self._safely(link, self._settled, link, error)
        for link in held:  # their next calls in the next turn (a reply partly sent: once it is all)
            if not link.closed:
                self._safely(link, self._unpause, link)

    def _settled(self, link: Link, error: Exception | None) -> None:
        """Send the answers the link held for the fsync (``error``: it failed; none are sent)."""
        replies, link.waiting = link.waiting or [], None
        for owner, size in link.waiting_held.items():
            self.budget.release(size, owner)
        link.waiting_held.clear()
        if link.closed:
            return
        if error is not None:
            self._drop(link, error)
        else:
            self._deliver(link, self._send_all, replies)

    def _unpause(self, link: Link) -> None:
        link.paused = False
        if link.out is None and link.buffer and not link.more:
            link.more = True
            self._more.append(link)
        self._listen(link)

    def _reply(self, link: Link, reply: bytes) -> None:
        """A call's answer (from the loop, or the worker that has the link): the connection
        trusted if it now proved itself, and the reply sent (oneway calls have none)."""
        self._trust(link.connection)
        if reply:
            self._send(link, reply)

    def _send(self, link: Link, reply: bytes) -> None:
        """Send a reply without blocking (from the loop, or the worker that has the link):
        what the socket does not take now is kept for :meth:`_flush`."""
        head = _HEAD.pack(len(reply))
        try:
            sent = link.sock.sendmsg((head, reply))
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < 4 + len(reply):  # the rest when the socket drains (a copy only if the head is cut)
            self._keep(link, memoryview(head[sent:] + reply) if sent < 4 else memoryview(reply)[sent - 4 :])

    def _send_all(self, link: Link, replies: list[bytes]) -> None:
        """Send answers held for an fsync, in order, in one ``sendmsg`` (see :meth:`_send`)."""
        if not replies:  # oneway calls
            return
        if len(replies) == 1:
            self._send(link, replies[0])
            return
        parts = [part for reply in replies for part in (_HEAD.pack(len(reply)), reply)]
        if len(parts) > _MAX_PARTS:  # over what one sendmsg takes: one copy
            parts = [b"".join(parts)]
        try:
            sent = link.sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < sum(map(len, parts)):
            self._keep(link, memoryview(b"".join(parts))[sent:])

    def _keep(self, link: Link, rest: memoryview) -> None:
        link.out, link.started, link.held = rest, time.monotonic(), len(rest)
        link.owner = self.owner_of(link.connection)
        self.budget.hold(link.held, link.owner)  # until taken: counted like a frame, in its client's share

    def _flush(self, link: Link) -> None:
        out = link.out
        if out is None:
            return
        try:
            sent = link.sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(link)
            return
        link.last = time.monotonic()
        if sent < len(out):
            link.out = out[sent:]
            return
        link.out, link.started = None, None
        self._let_go(link)
        if link.connection.close_after_reply:
            self._close(link)
        else:
            self._calls(link)

    def _let_go(self, link: Link) -> None:
        if link.held:
            self.budget.release(link.held, link.owner)
            link.held = 0
