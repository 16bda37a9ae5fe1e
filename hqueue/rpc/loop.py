"""One event loop over all of a server's plain connections: a quick call costs no thread switch.

With a thread per connection, every call's ``recv`` and ``send`` let go of
the GIL and must take it back from the other connections' threads: with 16
busy clients that costs a Python server 19.5–25 µs of CPU per call where one
``selectors`` loop over all of them costs 8–10 (``bench/io_floor.py``), and
the threads queue on the locks of the state they share (a group's lock).
:class:`LoopServer` serves plain TCP and Unix connections from one loop
and keeps every bound of :class:`~hqueue.rpc.threaded.ThreadedServer`,
which it extends:

* Accepting is unchanged (the accept threads, ``max_connections``, eviction
  of unproven connections, the back-off). An accepted connection is handed
  to the loop once. A TLS connection keeps a thread of its own, as does any
  other transport.
* The loop reads what each ready connection sent, without blocking (64 KiB
  at most at once), and runs each whole call of at most 64 KiB whose
  handler the server marks ``inline`` (``inline(method)``) on its own
  thread: no hand-off, no lock contention. Such a handler calls
  :func:`may_block` before anything that would wait (a receive with nothing
  to hand out yet), and before it has done anything: on the loop that
  raises :class:`WouldBlock`, and the call is run again, from its frame, on
  a worker thread.
* A SYNC_WAL write on the loop does not wait for its fsync (the store's
  ``defer_syncs``, given as ``syncs``): the answers of a turn that wrote are
  held until, at the turn's end, one fsync has made every write of it
  durable (``settle``), then sent, as Redis does at ``appendfsync always``.
  A connection with answers held runs its next calls in the same turn if
  the loop runs them; one that needs a worker waits for the fsync first, so
  that answers go in order. Held answers count in the in-flight budget.
* Every other call runs on a worker thread (admin calls, log-ins, calls
  that wait); so does a frame over 64 KiB (a batch put): the worker reads,
  admits and runs it exactly as the threaded server does (the in-flight
  budget's wait, a refused frame skipped unread, ``body_timeout`` over its
  body). Meanwhile the loop reads nothing more of that connection: its
  calls are answered in order, and what it holds here stays bounded (TCP's
  own backpressure holds the rest). The worker then serves the
  connection's next calls of the same kinds while each comes within
  ``STAY_MS`` (a producer's SYNC_WAL puts pay one hand-off, not one each),
  and gives any other back to the loop, unread.
* A reply is sent without blocking; what the socket does not take goes as
  it drains, within ``body_timeout``, and the connection's next call waits.
* With nothing to do, the loop polls for the next call for up to
  ``limits.idle_poll_us`` before it sleeps, while calls come that soon
  (:class:`~hqueue.rpc.spin.Spin`): a client's next call finds it awake and warm.
* Every second a sweep closes a connection idle past ``idle_timeout``, and
  one whose started frame or reply is not done within ``body_timeout``
  (a slow loris).
* :meth:`close` stops reading calls: idle connections are closed at once,
  busy ones once their call is answered.
"""

from __future__ import annotations

import contextlib
import functools
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import HQueueError
from .answers import Answers
from .connections import Connection, WouldBlock, _current
from .connections import may_block as may_block  # (the handlers' API, here since the loop's)
from .connections import on_loop as on_loop
from .frames import _HEAD, MAX_DECLARED, FrameError, FrameReader, TooManyItems, call_head, check_call, head_of_frame
from .handoff import Handoff
from .links import Link, Syncs, Watching
from .spin import Spin
from .threaded import logger
from .workers import Workers

#: The largest call the loop reads itself, with its head (a bigger one goes to a worker).
SMALL = FrameReader.CHUNK
#: Seconds between sweeps for idle and slow connections.
SWEEP = 1.0
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
#: Calls of one connection the loop runs in one turn at most (the rest in the next turns):
#: a turn's answers wait for its end, and one client's pipeline must not make it long.
CALLS_A_TURN = 8


class LoopServer(Answers, Handoff, Watching):
    """:class:`~hqueue.rpc.threaded.ThreadedServer`'s limits, served from one event loop."""

    def __init__(
        self,
        *args: Any,
        inline: Callable[[str], bool] | None = None,
        syncs: Syncs | None = None,
        **kwargs: Any,
    ) -> None:
        """``inline(method)``: whether a call to ``method`` may run on the loop (it calls
        :func:`may_block` before any wait); None: no call does, all run on workers.
        ``big_answers`` (ThreadedServer's): here also the replies kept for a socket that did
        not take them all, and answers held for a turn's fsync, count in the budget.
        ``syncs``: the store, whose SYNC_WAL writes on the
        loop share one fsync a turn (None: a store whose writes on the loop never wait)."""
        super().__init__(*args, **kwargs)
        self._inline_of = inline or (lambda method: False)
        self._inline: dict[str, bool] = {}
        self._small = min(SMALL, 4 + self.limits.max_frame_bytes)
        self._selector = selectors.DefaultSelector()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector.register(self._wake_in, _READ, None)
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._woken = False
        self._links: dict[int, Link] = {}
        self._syncs = syncs
        #: The connections with answers held for this turn's fsync, in the order they wrote.
        self._held: list[Link] = []
        #: Connections with whole calls left over from a turn (CALLS_A_TURN), for the next.
        self._more: list[Link] = []
        #: Turns of the loop so far: each connection's share (CALLS_A_TURN) is counted in one.
        self._turn = 0
        # One call per connection at a time: never more workers than connections.
        self._workers = Workers()

    def serve(self) -> None:
        threading.Thread(target=self._run_loop, name="hqueue-loop", daemon=True).start()
        super().serve()

    def sockets(self) -> list[Any]:
        links = getattr(self, "_links", {})  # (none before it is made: a fork while it was being made)
        return super().sockets() + [link.sock for link in list(links.values())]

    def close(self) -> None:
        super().close()
        self._post(("close",))

    # -- the hand-offs between the accept threads, the workers and the loop ----------------

    def _start(self, sock: socket.socket, connection: Connection) -> None:
        if (self.ssl_context is not None and not connection.local) or not self._checked_frames:
            super()._start(sock, connection)
        else:
            self._post(("open", sock, connection))

    def _post(self, item: tuple[Any, ...]) -> None:
        """Give the loop ``item`` (from any thread), waking it if it is not woken already."""
        self._inbox.append(item)
        if not self._woken:
            self._woken = True
            try:
                self._wake_out.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # woken already (a full pipe), or closed with the loop

    def _take_inbox(self) -> None:
        try:
            while self._wake_in.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        self._woken = False  # before the inbox is read: a later post wakes the loop again
        while self._inbox:
            item = self._inbox.popleft()
            if item[0] == "open":
                self._open_link(item[1], item[2])
            elif item[0] == "done":
                self._safely(item[1], self._done, item[1], item[2])

    # -- the loop -------------------------------------------------------------------------

    def _run_loop(self) -> None:
        select = self._selector.select
        spin, poll, clock = Spin(self.limits.idle_poll_us), functools.partial(select, 0), time.perf_counter
        sweep_at = time.monotonic() + SWEEP
        if self._syncs is not None:
            self._syncs.defer_syncs()
        try:
            while not (self.closed and self._closing()):
                if self._held or self._more:
                    events = select(0)
                else:  # the next calls, polled for a little first while they come that soon (rpc/spin.py)
                    started = clock()
                    events = spin.poll(poll) or []
                    if not events:
                        events = select(SWEEP)
                        spin.blocked(clock() - started)  # (an idle SWEEP too: no run of short waits spans it)
                self._turn += 1
                more, self._more = self._more, []
                for key, mask in events:
                    link = key.data
                    if link is None:
                        self._take_inbox()
                    else:
                        self._safely(link, self._ready, link, mask)
                for link in more:  # the calls left from their share of the last turn
                    link.more = False
                    self._safely(link, self._calls, link)
                if self._syncs is not None and self._syncs.deferred():
                    self._settle()  # answers held, or writes no answer waits for (a member's leases let go)
                now = time.monotonic()
                if now >= sweep_at:
                    self._sweep(now)
                    sweep_at = now + SWEEP
        except Exception:
            logger.exception("the server's event loop failed: the server stops serving, its connections are closed")
            self.close()
            for link in list(self._links.values()):
                self._close(link)
        finally:
            self._workers.close()
            self._selector.close()
            self._wake_in.close()
            self._wake_out.close()
            while self._inbox:  # connections accepted as the loop ended
                item = self._inbox.popleft()
                if item[0] == "open":
                    self._ended(item[2], item[1])

    def _ready(self, link: Link, mask: int) -> None:
        if mask & _WRITE:
            self._flush(link)
        if mask & _READ and not link.closed:
            self._read(link)

    def _safely(self, link: Link, step: Callable[..., None], *args: Any) -> None:
        """``step(*args)`` for one connection: if it fails (a fault of the server's own, which
        no client should be able to cause), that connection ends, logged with the fault,
        and the loop goes on serving the others (before, the whole server stopped)."""
        try:
            step(*args)
        except Exception:
            self.log.exception(
                "loop-fault", "the event loop failed serving connection %d from %s: closed", link.connection.id,
                link.connection.who,
            )  # fmt: skip
            self._broken(link)

    def _broken(self, link: Link) -> None:
        """End a connection whose step on the loop failed, whatever state it was left in."""
        if link.busy:  # a worker has it: its end reaches the worker (EOF), whose done closes it
            link.connection.close_after_reply = True
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_RDWR)
            return
        with contextlib.suppress(Exception):  # (its steps each run: see _close)
            self._close(link)

    def _closing(self) -> bool:
        """The server is closed: close what is idle; True once nothing is left."""
        self._take_inbox()
        for link in list(self._links.values()):
            if not link.busy and link.out is None and link.waiting is None:
                self._close(link)
        return not self._links

    def _open_link(self, sock: socket.socket, connection: Connection) -> None:
        link = Link(sock, connection, last=time.monotonic())
        self._links[connection.id] = link
        try:
            sock.setblocking(False)
        except OSError:
            self._close(link)
            return
        self._listen(link)

    def _read(self, link: Link) -> None:
        try:
            chunk = link.sock.recv(SMALL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(link)
            return
        if not chunk:  # the peer closed its side (maybe only that): what it sent is answered first
            link.eof = True
            self._calls(link)
            return
        link.buffer += chunk
        link.last = time.monotonic()
        if not link.more:  # else its calls run after this turn's reads, its share of the turn
            self._calls(link)

    def _calls(self, link: Link) -> None:
        """Run the connection's whole calls, in order, while it may: at most its share of
        the turn, wherever in the turn they run (read, a reply sent, a worker done)."""
        buffer = link.buffer
        if link.turn != self._turn:
            link.turn, link.ran = self._turn, 0
        while not (link.busy or link.closed or link.out is not None or link.paused):
            if link.skip:  # (a call refused from its head: its body goes as it comes)
                dropped = min(len(buffer), link.skip)
                del buffer[:dropped]
                link.skip -= dropped
                if link.skip:
                    link.started = link.started or time.monotonic()  # (all of it within body_timeout)
                    break
                link.started = None
            if link.ran >= CALLS_A_TURN and len(buffer) >= 4:  # its share of this turn: the rest in the next
                if not link.more:
                    link.more = True
                    self._more.append(link)
                break
            if len(buffer) < 4:
                link.started = (link.started or time.monotonic()) if buffer else None
                break
            size = _HEAD.unpack_from(buffer)[0]
            if not 0 < size <= MAX_DECLARED:
                self._drop(link, FrameError(f"frame of {size} bytes"))
                return
            if 4 + size > self._small:  # a big call (or one over the limit): a worker reads it
                unproven = self._unproven(size, link.connection)
                if unproven is not None:  # refused unread, on the loop (ThreadedServer._unproven)
                    if not self._refuse_unread(link, size, unproven):
                        break
                    continue
                if link.waiting is not None:  # once the answers held for the fsync are sent
                    link.paused = True
                    break
                self._to_worker(link)
                return
            if len(buffer) < 4 + size:
                link.started = link.started or time.monotonic()
                break
            with memoryview(buffer) as view:
                frame = bytes(view[4 : 4 + size])
            del buffer[: 4 + size]
            link.started = None
            link.ran += 1
            self._call(link, frame)
        self._listen(link)

    def _call(self, link: Link, frame: bytes) -> None:
        """Run one whole call: here, if its handler may run on the loop; else on a worker."""
        try:
            check_call(frame, self.limits.max_items)
        except TooManyItems as e:
            try:
                self._answered(link, self.too_many_items(frame, e))
            except FrameError as failure:
                self._fail(link, failure)
            return
        except FrameError as e:
            self._fail(link, e)
            return
        size = len(frame)
        method, seqid = call_head(frame)
        busy = self._no_room_for_answer(method, link.connection)
        if busy is not None:
            self._refuse(link, method, seqid, busy)
            return
        if not self._runs_inline(method):
            self._to_worker_after(link, frame)
            return
        self.budget.reserve(size, None)  # it is in memory: counted, never waiting
        connection = link.connection
        connection.on_loop = True
        _current.connection = connection
        try:
            reply = self._process(frame, checked=True)
        except WouldBlock:
            reply = None
        except Exception as e:
            self.budget.release(size)
            self._fail(link, e)
            return
        finally:
            connection.on_loop = False  # before a worker may have it
            _current.connection = None
        self.budget.release(size)
        if reply is None:  # it would have waited: a worker runs it again
            self._to_worker_after(link, frame, blocked=method)
            return
        self._answered(link, reply)

    def _fail(self, link: Link, error: Exception) -> None:
        """End a connection whose call failed; answers held for the turn's fsync go first."""
        if link.waiting is None:
            self._drop(link, error)
            return
        self._ending(error, link.connection)
        link.connection.close_after_reply, link.paused = True, True

    def _refuse(self, link: Link, method: str, seqid: int, busy: HQueueError) -> None:
        """Answer a call whose answer may be big with ``busy``, unread (see
        :meth:`~hqueue.rpc.threaded.ThreadedServer._no_room_for_answer`)."""
        self.log.warning("refused", "refused %s from %s: %s", method, link.connection.who, busy)
        try:
            reply = self._refusal(method, seqid, busy)
        except FrameError as e:
            self._drop(link, e)
            return
        self._answered(link, reply)

    def _refuse_unread(self, link: Link, size: int, refused: HQueueError) -> bool:
        """Answer the call whose frame (``size`` bytes) ``link``'s buffer begins with
        ``refused``, once its head has come (its method and number), and throw its body away
        as it comes, here (:meth:`_calls`): no worker, no buffer of its size. Whether it did
        (False: its head is still to come, within body_timeout of its first byte)."""
        if size > self.limits.max_frame_bytes:  # (no call could be that big: not worth reading past)
            self._drop(link, FrameError(f"frame of {size} bytes from a connection that has not proved who it is"))
            return True
        try:
            head = head_of_frame(link.buffer)
        except FrameError as e:
            self._drop(link, e)
            return True
        if head is None:
            link.started = link.started or time.monotonic()
            return False
        link.skip = 4 + size
        self._refuse(link, *head, refused)
        return True

    def _runs_inline(self, method: str) -> bool:
        inline = self._inline.get(method)
        if inline is None:
            inline = self._inline_of(method)
            if method in self.service.thrift_services:  # an unknown name is not kept
                self._inline[method] = inline
        return inline

    # -- ends -------------------------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        """Close connections idle too long, and those whose frame or reply takes too long."""
        limits = self.limits
        for link in list(self._links.values()):
            if link.busy:
                continue
            if link.started is not None and now - link.started > limits.body_timeout:
                what = "a reply was not taken" if link.out is not None else "a frame did not come whole"
                self._drop(link, TimeoutError(f"{what} within {limits.body_timeout:g}s"))
            elif (
                limits.idle_timeout is not None
                and not link.buffer
                and link.out is None
                and now - link.last > limits.idle_timeout
            ):
                self._drop(link, TimeoutError("idle past the timeout"))

    def _drop(self, link: Link, error: Exception) -> None:
        """End a connection for ``error``, logged as the kind of end it is."""
        self._ending(error, link.connection)
        self._close(link)

    def _close(self, link: Link) -> None:
        if link.closed:
            return
        link.closed = True
        try:  # (each step, whatever the one before did: a close that failed part way kept its place)
            self._let_go(link)
        finally:
            try:
                # (by the selector's key, not link.events alone: the loop's state is not trusted here)
                self._unwatch(link)
            finally:
                self._links.pop(link.connection.id, None)
                self._ended(link.connection, link.sock)
