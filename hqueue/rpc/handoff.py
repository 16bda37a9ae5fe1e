"""The event loop's hand-off of a connection to a worker thread, for a call that would
wait or a frame too big to read on the loop, and its return (a part of rpc/loop.py's
LoopServer): the worker serves the connection's next calls of the same kinds while each
comes within STAY_MS, then gives it back."""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING

from .connections import WouldBlock, _current
from .frames import _HEAD, FrameReader, call_head
from .links import Link
from .threaded import ThreadedServer, bare
from .workers import Workers

#: A worker serves a connection's next calls while each comes within this many milliseconds.
STAY_MS = 20


class Handoff(ThreadedServer):
    """Calls run on workers (see the module's docstring)."""

    _workers: Workers
    #: The largest call the loop reads itself, with its head.
    _small: int

    if TYPE_CHECKING:

        def _listen(self, link: Link) -> None: ...

        def _calls(self, link: Link) -> None: ...

        def _drop(self, link: Link, error: Exception) -> None: ...

        def _close(self, link: Link) -> None: ...

        def _post(self, item: tuple[object, ...]) -> None: ...

        def _reply(self, link: Link, reply: bytes) -> None: ...

        def _runs_inline(self, method: str) -> bool: ...

    def _to_worker_after(self, link: Link, frame: bytes, blocked: str | None = None) -> None:
        """A worker runs ``frame``'s call: now, or, while the connection has answers held
        for the turn's fsync, once they are sent (the frame back at the head of its buffer)."""
        if link.waiting is not None:
            link.buffer[:0] = _HEAD.pack(len(frame)) + frame
            link.paused = True
            return
        size = len(frame)
        self.budget.reserve(size, None)
        self._to_worker(link, frame, size, blocked)

    def _to_worker(self, link: Link, frame: bytes | None = None, size: int = 0, blocked: str | None = None) -> None:
        """Give the connection to a worker, for ``frame``'s call (``size`` bytes of the budget
        held for it), or with ``frame`` None to read a big one itself (:meth:`_work`)."""
        link.busy, link.started = True, None
        try:
            self._listen(link)
            self._workers.submit(self._work, link, frame, size, blocked)
        except Exception as e:  # no thread to be had, shut down, or any fault before a worker had it
            # (ended here: the loop's fault handling would wait for a worker that never had it)
            self.budget.release(size)
            link.busy = False
            self._drop(link, e)

    def _work(self, link: Link, frame: bytes | None, size: int = 0, blocked: str | None = None) -> None:
        """A worker has the connection: it runs the call the loop read (``frame``; ``blocked``:
        its method, when it came because it would have waited on the loop), or reads, admits
        and runs a big one (``frame`` None) as a thread per connection does; then
        :meth:`_stay` serves its next calls, and it goes back to the loop."""
        connection = link.connection
        _current.connection = connection
        error: Exception | None = None
        try:
            if frame is None:
                go_on = self._serve_one(self._frames(link), connection)
            else:
                self._run_on_worker(link, frame, size)
                del frame
                go_on = not connection.close_after_reply
            if go_on and link.out is None:
                go_on = self._stay(link, blocked)
            if not go_on:
                connection.close_after_reply = True  # the peer closed, or the handler asked
        except WouldBlock:  # a handler's mistake (may_block off the loop never raises): no answer to give
            error = RuntimeError("a call raised WouldBlock on a worker")
        except Exception as e:
            error = bare(e)  # (posted to the loop: no traceback holding this call's frames)
        finally:
            _current.connection = None
            try:
                link.sock.setblocking(False)
            except OSError:
                pass  # closed under it (evicted): the loop's close says so
            self._post(("done", link, error))

    def _run_on_worker(self, link: Link, frame: bytes, size: int) -> None:
        """Run the call the loop read (``size`` bytes of the budget held for it) and answer
        it; a call whose answer may be big holds room for it meanwhile (``answer_slots``),
        as on a thread per connection: workers run calls at once (a receive that waits
        gives it back while it waits)."""
        method, seqid = call_head(frame)
        slot, refused = self._answer_slot(method, size, link.connection)
        try:
            try:
                if refused is not None:
                    reply = self._refusal(method, seqid, refused)
                else:
                    reply = self._process(frame, checked=True, slot=slot)
            finally:
                self.budget.release(size)
            del frame
            owner = self.owner_of(link.connection)
            self.budget.hold(len(reply), owner)  # the reply is made: it counts until sent (or kept)
        finally:
            if slot is not None:
                slot.release()
        try:
            self._reply(link, reply)
        finally:
            self.budget.release(len(reply), owner)

    def _frames(self, link: Link) -> FrameReader:
        """The connection's frames on a blocking socket (with the limits' timeouts), from what
        the loop read of them already."""
        limits = self.limits
        return FrameReader(link.sock, limits.max_frame_bytes, limits.idle_timeout, limits.body_timeout, link.buffer)

    def _stay(self, link: Link, blocked: str | None) -> bool:
        """Serve the connection's next calls here, as a thread per connection would, while each
        comes within STAY_MS of the last answer and is one a worker would run anyway (a
        call the loop does not run, a big one, or another of the method that would have
        waited on the loop, ``blocked``): a client busy with SYNC_WAL puts or batch puts
        pays one hand-off, not one per call. Any other call goes back to the loop, unread.
        False once the connection is to end. A connection that has not proved who it is
        goes back at once: waiting here for its next bytes gave a stranger a thread for the
        body timeout (a review)."""
        if self.unproven_bytes is not None and not (link.connection.trusted or link.connection.local):
            return True
        frames = self._frames(link)
        poller = select.poll()
        poller.register(link.sock, select.POLLIN)
        while not self.closed:
            if not link.buffer and not poller.poll(STAY_MS):
                return True  # quiet: back to the loop
            size = frames.next_size()
            if size is None:
                return False  # the peer closed
            method, _ = frames.call_head()
            if 4 + size <= self._small and self._runs_inline(method) and method != blocked:
                return True  # the loop's to run: its bytes stay in the buffer
            if self._unproven(size, link.connection) is not None:
                return True  # the loop refuses it and throws its body away (no thread: _refuse_unread)
            if not self._serve_one(frames, link.connection):
                return False
        return True

    def _done(self, link: Link, error: Exception | None) -> None:
        """A worker gave the connection back."""
        link.busy, link.started = False, None
        if error is not None:
            self._drop(link, error)
            return
        link.last = time.monotonic()
        if link.out is None and (link.connection.close_after_reply or self.closed):
            self._close(link)
            return
        self._calls(link)
