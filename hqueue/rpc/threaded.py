"""A threaded Thrift server that a hostile or careless peer cannot take down.

Built on thriftpy2's processor, with hqueue's own socket handling:

* The socket binds before serving (port 0 resolves to a real port first),
  without SO_REUSEPORT: a second server on a taken port fails at once with
  "port P is in use", instead of silently sharing it.
* Each frame is read with a size limit and checked before it is decoded
  (:mod:`hqueue.rpc.frames`); a bad frame ends its own connection only.
* A call is admitted from its frame's head, before its body is read: one
  over ``max_frame_bytes``, or one that finds no room in the memory budget
  of all requests under way (:mod:`hqueue.rpc.budget`) within
  ``inflight_wait``, is read into a small buffer, thrown away, and answered
  with a typed error naming the limit (``refuse_with`` makes it); the
  connection goes on. Once decoded, a call's frame is let go before the
  call runs.
* At most ``max_connections`` connections. When all are taken, a new one
  closes the oldest connection not yet *trusted* (``trusted_after``: one that
  authenticated, or proved a push), else the oldest proven one past its
  owner's share (``connection_share``); with none to close, the new one is
  closed (:mod:`hqueue.rpc.places`). A connection idle for ``idle_timeout``
  seconds is closed (clients reconnect).
* When accept() fails for lack of file descriptors or memory, the server
  backs off (10 ms doubling to 1 s) and logs one line per 10 s, not one per
  attempt.
* It listens on TCP, on a Unix socket (``ListeningSocket.bound_unix``, rpc/connections.py,
  access by the socket file's permissions: the store a process shares with
  local processes, server/shared.py), or on both (``also``: one accept
  thread each, the same limits over all their connections). A connection
  that came over a Unix socket is ``local``.
* Optional TLS: an ``ssl.SSLContext`` wraps each accepted socket (the
  handshake runs in the connection's thread, bounded by ``body_timeout``).
* :func:`~hqueue.rpc.connections.current_connection` tells a handler which connection it serves
  (its peer address, and what it authenticated as); a handler may have the
  connection closed once its answer is sent (``close_after_reply``).

The default transport is framed with the binary protocol; other transports
(used by the HBase stand-in in tests) run through thriftpy2's own loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.server import TThreadedServer
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory, TSocket, TTransportException
from thriftpy2.transport.memory import TCyMemoryBuffer

from .. import forks
from ..errors import HQueueError, LimitExceeded, NotAuthorized, ServerBusy
from .budget import AnswerSlot, InflightBudget
from .connections import (
    LOCAL_PEER,
    NEEDS_TOKEN,
    Connection,
    ListeningSocket,
    RateLimitedLog,
    ServerLimits,
    _current,
    each_connection,
)
from .dispatch import CachedProcessor
from .frames import FrameError, FrameReader, TooManyItems, call_head, check_call
from .places import Places, fit_descriptors
from .unix import widen
from .wire import SCAN_REPLY_BYTES as BIGGEST_ANSWER

logger = logging.getLogger(__name__)

_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


#: The largest call of a connection that has not proved who it is, on a server with tokens.
UNPROVEN_FRAME_BYTES = 64 * 1024 - 4  # (with its 4-byte head, what an event loop reads itself: loop.SMALL)


_E = TypeVar("_E", bound=BaseException)


def bare(error: _E) -> _E:
    """``error`` without its traceback, cause and context, for an error kept past its
    ``except`` block. Its traceback leads to the frames it went through, and a frame that
    keeps the error makes a cycle: what those frames hold (a call's arguments, a frame
    buffer of up to 64 MiB) stays until the cyclic GC runs, which a flood of tiny requests
    that each fail seldom makes it do (connections each declaring a 20 MB frame and
    closing held 4.8 GB after 900 of them). The error's type and message are what is used."""
    error.__traceback__ = error.__cause__ = error.__context__ = None
    return error


class ThreadedServer(TThreadedServer):
    """A thread per connection, within :class:`ServerLimits`."""

    def __init__(
        self,
        service,
        handler,
        socket: ListeningSocket,
        *,
        transport=None,
        protocol=None,
        limits: ServerLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        refuse_with: Callable[[str, HQueueError], Exception] | None = None,
        trusted_after: Callable[[Connection], bool] | None = None,
        also: ListeningSocket | None = None,
        big_answers: frozenset[str] = frozenset(),
        answer_slots: Mapping[str, int] | None = None,
        owner_of: Callable[[Connection], str] | None = None,
        unproven_bytes: int | None = None,
        prove_how: str = NEEDS_TOKEN,
    ) -> None:
        """``trusted_after(connection)``, asked after each call, says whether the connection
        has proved who it is (default: any call it made). ``also``: a second socket to
        accept on (a Unix socket beside the TCP port), closed with the server.
        ``big_answers``: the methods whose answer may be big (a scanner's batch): they are
        refused (``ServerBusy``), unread, while the in-flight budget is full; a reply counts
        in it until its peer has taken it. ``answer_slots``: methods whose answer's bytes,
        at most so many, are taken from the budget before they run on a connection's thread
        (threads run them at once: each could otherwise make a big answer past the budget);
        a call that waits gives them back meanwhile (:func:`answer_slot_aside`).
        ``owner_of(connection)``: whose share of the budget (``inflight_share``) the
        connection's replies not taken yet count in (default: the connection itself; a server
        with tokens names the principal of a connection that authenticated): calls for big
        answers are refused while the owner's share is full, so one client cannot hold the
        whole budget.
        ``unproven_bytes``: a connection's calls over this many bytes are refused (NotAuthorized,
        saying ``prove_how``) until it is trusted (a server with tokens: UNPROVEN_FRAME_BYTES; a
        subscriber's push listener, whose proof is small); None: no such bound."""
        self.socket = socket
        self._big_answers = big_answers
        self._answer_slots = dict(answer_slots or {})
        self.also = also
        self.trusted_after = trusted_after or (lambda connection: True)
        #: The largest call of a connection not trusted yet (None: any a frame may be).
        self.unproven_bytes, self._prove_how = unproven_bytes, prove_how
        self.owner_of = owner_of or each_connection
        self.service = service
        self.limits = limits or ServerLimits()
        self.budget = InflightBudget(self.limits.max_inflight_bytes)
        self._share = max(1, int(self.limits.max_inflight_bytes * self.limits.inflight_share))
        if self._share < BIGGEST_ANSWER and self.limits.inflight_share < 1:
            logger.warning(
                "--max-inflight-bytes %d gives a client a share of %d bytes, less than one scan answer (%d): "
                "one client that stops reading can hold more than its share%s",
                self.limits.max_inflight_bytes, self._share, BIGGEST_ANSWER,
                " and the whole budget" if self.limits.max_inflight_bytes < 1.5 * BIGGEST_ANSWER else "",
            )  # fmt: skip
        #: The IDL exception a refused call is answered with (None: refused calls close their connection).
        self.refuse_with = refuse_with
        self.ssl_context = ssl_context
        self._checked_frames = transport is None and protocol is None
        super().__init__(
            CachedProcessor(service, handler),
            self.socket,
            iprot_factory=protocol or TBinaryProtocolFactory(),
            itrans_factory=transport or TFramedTransportFactory(),
            daemon=True,
        )
        #: Who has a place, and whose connection goes to make room (rpc/places.py).
        fits = fit_descriptors(self.limits.max_connections, raise_limit=self.limits.raise_open_files)
        if fits != self.limits.max_connections:
            self.limits = dataclasses.replace(self.limits, max_connections=fits)
        self.places = Places(self.limits.max_connections, self.limits.connection_share, self.owner_of)
        #: The sockets of the connections served on threads of their own (TLS-wrapped ones too).
        self._served: dict[int, Any] = {}
        self._ids = itertools.count(1)
        forks.closed_in_child(self)
        self._lock = threading.Lock()
        self.log = RateLimitedLog(log=logger)

    @property
    def port(self) -> int:
        return self.socket.bound_port

    def serve(self) -> None:
        """Accept connections until :meth:`close` (on ``also`` from a thread of its own)."""
        if self.also is not None:
            threading.Thread(
                target=self._accept, args=(self.also.sock,), name="thrift-accept-unix", daemon=True
            ).start()
        self._accept(self.socket.sock)

    def _accept(self, listener: socket.socket) -> None:
        backoff = 0.01
        while not self.closed:
            try:
                sock, peer = listener.accept()
                who = peer[0] if isinstance(peer, tuple) else "a local process (Unix socket)"
                peer = peer if isinstance(peer, tuple) else LOCAL_PEER
            except OSError as e:
                if self.closed:
                    return
                if e.errno in _OUT_OF_RESOURCES:
                    self.log.warning("accept", "accept failed: %s; backing off %.2fs", e.strerror, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                else:
                    self.log.warning("accept-other", "accept failed: %s", e)
                continue
            backoff = 0.01
            admitted, victim = self.places.take()
            if victim is not None:  # its thread (or the loop) ends it, and gives its place back
                self.log.warning("evict", "closed a connection to make room for one from %s", who)
                try:
                    victim.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            elif not admitted:
                self.log.warning(
                    "full", "refused a connection from %s: %d open (the limit)", who, self.limits.max_connections
                )
                sock.close()
                continue
            # Among the open ones at once: the next accept finds it, to count and to close to make room.
            connection = self._opened(sock, peer)
            try:
                self._start(sock, connection)
            except RuntimeError as e:  # no thread to be had
                self.log.warning("thread", "refused a connection from %s: %s", who, e)
                self._ended(connection, sock)

    @property
    def connections(self) -> int:
        """Connections open (their places taken)."""
        return self.places.taken

    def _trust(self, connection: Connection) -> None:
        """After a call: whether the connection proved who it is now, and is kept (Places.trust)."""
        self.places.trust(connection, self.trusted_after)

    def _start(self, sock: socket.socket, connection: Connection) -> None:
        """Serve an accepted connection: here, in a thread of its own."""
        threading.Thread(target=self._connection, args=(sock, connection), daemon=True, name="thrift-conn").start()

    def serve_in_thread(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.serve, name=name, daemon=True)
        thread.start()
        return thread

    def _connection(self, sock: socket.socket, connection: Connection) -> None:
        _current.connection = connection
        try:
            if self.ssl_context is not None and not connection.local:  # a Unix socket's stay clear
                sock.settimeout(self.limits.body_timeout)  # (one deadline for the whole handshake)
                context, raw = self.ssl_context, sock
                tls: ssl.SSLSocket = self.places.wrapped(
                    connection, lambda: context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                )
                sock = connection.sock = tls
                try:
                    tls.do_handshake()
                except (AttributeError, ValueError) as e:  # shut down to make room before it began
                    raise ConnectionAbortedError("closed before its TLS handshake") from e
            with self._lock:
                self._served[connection.id] = sock
            if self.closed:
                return
            if self._checked_frames:
                self._serve_frames(sock, connection)
            else:
                self._serve_thriftpy2(sock)
        except Exception as e:
            self._ending(e, connection)
        finally:
            _current.connection = None
            with self._lock:
                self._served.pop(connection.id, None)
            self._ended(connection, sock)

    def _opened(self, sock: socket.socket, peer: tuple) -> Connection:
        """The connection ``sock`` is, counted among those open (oldest first), its socket set up."""
        connection = Connection(next(self._ids), (peer[0], peer[1]), local=sock.family == socket.AF_UNIX, sock=sock)
        self.places.opened(connection, sock)
        try:
            if connection.local:
                widen(sock)  # a scan's reply in one message (rpc/unix.py)
            else:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # the peer went already: its first read says so
        return connection

    def _ending(self, e: Exception, connection: Connection) -> None:
        """Log why a connection ends, as what it was."""
        peer = connection.who
        if isinstance(e, TimeoutError):
            logger.debug("connection %d from %s: idle past the timeout, closed", connection.id, peer)
        elif isinstance(e, FrameError):
            self.log.warning("frame", "closed a connection from %s: %s", peer, e)
        elif isinstance(e, (TTransportException, ssl.SSLError, OSError)):
            pass  # the peer went away, or failed its handshake
        else:
            self.log.warning("bad-request", "closed a connection from %s: %s: %s", peer, type(e).__name__, e)

    def _ended(self, connection: Connection, sock: Any) -> None:
        """Close the connection: its place given back, then what it held freed."""
        self.places.ended(connection)
        sock.close()
        for callback in connection.on_close:
            try:
                callback()
            except Exception:
                logger.exception("freeing connection %d", connection.id)

    def _serve_frames(self, sock: socket.socket, connection: Connection) -> None:
        limits = self.limits
        frames = FrameReader(sock, limits.max_frame_bytes, limits.idle_timeout, limits.body_timeout)
        while not self.closed and self._serve_one(frames, connection):
            pass

    def _serve_one(self, frames: FrameReader, connection: Connection) -> bool:
        """Read, run and answer one call; False once the connection is to end (its peer closed)."""
        limits = self.limits
        size = frames.next_size()
        if size is None:
            return False
        if size > limits.max_frame_bytes and self.refuse_with is None:
            raise FrameError(f"frame of {size} bytes (the limit is {limits.max_frame_bytes})")
        method, seqid = frames.call_head()
        owner = self.owner_of(connection)
        refused = (
            self._no_room_for_answer(method, connection)
            or self._unproven(size, connection)
            or self._admit(size, frames.complete, owner)
        )
        slot = None  # bytes held for the answer while the call runs
        if refused is None:
            slot, refused = self._answer_slot(method, size, connection)
            if refused is not None:
                self.budget.release(size, owner, slot=True)
        try:
            if refused is not None:
                frames.skip()
                self.log.warning("refused", "refused %s from %s: %s", method, connection.who, refused)
                reply = self._refusal(method, seqid, refused)
            else:
                try:
                    reply = self._process(frames.body(), slot=slot)
                finally:
                    self.budget.release(size, owner, slot=True)
            if refused is None:
                self._trust(connection)
            if reply:  # oneway calls have none
                owner = self.owner_of(connection)  # (it may have authenticated)
                self.budget.hold(len(reply), owner)  # until the peer takes it (or the send times out)
                if slot is not None:
                    slot.release()
                try:
                    frames.send(reply)
                finally:
                    self.budget.release(len(reply), owner)
        finally:
            if slot is not None:
                slot.release()
        return not connection.close_after_reply

    def _answer_slot(
        self, method: str, size: int, connection: Connection
    ) -> tuple[AnswerSlot | None, ServerBusy | None]:
        """The bytes held for the answer of ``method``'s call while it runs on this thread
        (``answer_slots``; ``size``: the call's own, held beside), taken within
        ``inflight_wait`` and in its client's share: (the slot, None), (None, None) for a
        method that holds none, or (None, why the call is refused)."""
        if method not in self._answer_slots:
            return None, None
        wanted = min(self._answer_slots[method], max(1, self.budget.limit - size))
        owner = self.owner_of(connection)
        slot = AnswerSlot(self.budget, wanted, self.limits.inflight_wait, owner, self._share)
        if slot.held:
            return slot, None
        wait = self.limits.inflight_wait
        return None, self._busy(
            f"no room in {wait:g}s for the answer of {method} (up to {wanted} bytes) in the share of {owner} "
            f"({self.limits.inflight_share:g}, --inflight-share) or in"
        )

    def _unproven(self, size: int, connection: Connection) -> NotAuthorized | None:
        """Why a big call (over ``unproven_bytes``) of a connection that has not proved who it
        is is refused unread: it could not be run anyway, and a few such frames sent slowly
        held the whole budget for every client. Its body is thrown away as it comes, through
        a small buffer (LoopServer: on the loop, by no thread), and the connection goes on."""
        limit = self.unproven_bytes
        if limit is None or connection.trusted or connection.local or size <= limit:
            return None
        return NotAuthorized(
            f"a call of {size} bytes before the connection proved who it is (at most {limit} "
            f"until then): {self._prove_how}"
        )

    def _no_room_for_answer(self, method: str, connection: Connection) -> ServerBusy | None:
        """Why a call whose answer may be big is refused unread: replies not taken and calls
        under way hold the whole budget (memory stays bounded whoever stops reading), or the
        replies its own client has not taken hold that client's share of it (so one client
        that stops reading does not keep the others' big answers out)."""
        if method not in self._big_answers:
            return None
        if self.budget.used >= self.budget.limit:
            return self._busy("the replies waiting to be taken and the calls under way hold")
        return self._over_share(self.owner_of(connection))

    def _over_share(self, owner: str) -> ServerBusy | None:
        """Why ``owner``'s calls for big answers are refused now: its replies not taken yet
        hold its share of the budget; None while they do not."""
        held = self.budget.holds(owner)
        if held < self._share:
            return None
        share = self.limits.inflight_share
        return self._busy(
            f"the replies of {owner} not taken yet ({held} bytes) hold its share ({share:g}, --inflight-share) of"
        )

    def _busy(self, what: str) -> ServerBusy:
        limit = self.limits.max_inflight_bytes
        return ServerBusy(
            "max_inflight_bytes",
            limit,
            f"{what} this server's {limit} bytes (--max-inflight-bytes); nothing was done, try again",
        )

    def _admit(self, size: int, complete: bool, owner: str) -> HQueueError | None:
        """Take the frame's bytes from the budget, in ``owner``'s share (a frame that has not
        come whole waits while its client's frames and replies under way hold its share:
        one token's slow big puts cannot hold the whole budget); the error refusing it if
        it cannot be."""
        limits = self.limits
        if size > limits.max_frame_bytes:
            return LimitExceeded(
                "max_frame_bytes",
                limits.max_frame_bytes,
                f"a call of {size} bytes is over this server's limit of {limits.max_frame_bytes} (--max-frame-bytes)",
            )
        if self.budget.reserve(size, None if complete else limits.inflight_wait, owner, self._share, slot=True):
            return None
        if self.budget.held_by(owner) >= self._share:
            share = limits.inflight_share
            what = f"{owner}'s calls and replies under way hold its share ({share:g}, --inflight-share) of"
        else:
            what = "the requests under way hold"
        return self._busy(f"no room in {limits.inflight_wait:g}s for a call of {size} bytes: {what}")

    def _process(self, frame: bytes | bytearray, checked: bool = False, slot: AnswerSlot | None = None) -> bytes:
        """Check (unless ``checked`` already) and run the frame's call, holding ``slot`` for
        its answer (:func:`answer_slot_aside`); its reply.

        The frame, then its decoding buffer, are let go as soon as the
        arguments are decoded: while the call runs, only the arguments
        (and what the call makes of them) take memory.
        """
        if not checked:
            try:
                check_call(frame, self.limits.max_items)
            except TooManyItems as e:
                return self.too_many_items(frame, e)
        trans = TCyMemoryBuffer(frame)
        del frame
        api, seqid, result, call = self.processor.process_in(self.iprot_factory.get_protocol(trans))
        del trans
        out = TCyMemoryBuffer()
        oprot = self.iprot_factory.get_protocol(out)
        if call is None:  # an unknown method: result is the TApplicationException
            self.processor.send_exception(oprot, api, result, seqid)
            return out.getvalue()
        _current.slot = slot
        try:
            result.success = call()
        except TApplicationException as e:
            self.processor.send_exception(oprot, api, e, seqid)
            return out.getvalue()
        except Exception as e:
            if not self.processor.handle_exception(e, result):
                raise
            bare(e)  # (the reply keeps e: a cycle through this frame, which holds the reply)
        finally:
            _current.slot = None
        if not result.oneway:
            self.processor.send_result(oprot, api, result, seqid)
        return out.getvalue()

    def too_many_items(self, frame: bytes | bytearray, error: TooManyItems) -> bytes:
        """The reply to a whole call over ``max_items`` container elements: its method's
        LimitExceeded (FrameError, the connection closed, if no typed error can say it)."""
        method, seqid = call_head(frame)
        self.log.warning("refused", "refused %s: %s", method, error)
        limit = LimitExceeded(
            "max_items",
            self.limits.max_items,
            f"{method}: {error} (at most {self.limits.max_items:,}: this server's limit); split the call "
            "(a scan of that many topics: scan without topics, or in parts)",
        )
        return self._refusal(method, seqid, limit)

    def _refusal(self, method: str, seqid: int, error: HQueueError) -> bytes:
        """The reply to a call refused unread: ``method``'s result with the typed error.

        Raises:
            FrameError: no typed error can say it (an unknown method, or no
                ``refuse_with``): the connection is closed instead.
        """
        if self.refuse_with is None or method not in self.service.thrift_services:
            raise FrameError(str(error))
        result = getattr(self.service, method + "_result")()
        if not self.processor.handle_exception(self.refuse_with(method, error), result):
            raise FrameError(str(error))
        out = TCyMemoryBuffer()
        self.processor.send_result(self.iprot_factory.get_protocol(out), method, result, seqid)
        return out.getvalue()

    def _serve_thriftpy2(self, sock: socket.socket) -> None:
        sock.settimeout(self.limits.idle_timeout)
        client = TSocket(sock=sock)
        itrans = self.itrans_factory.get_transport(client)
        otrans = self.otrans_factory.get_transport(client)
        iprot = self.iprot_factory.get_protocol(itrans)
        oprot = self.oprot_factory.get_protocol(otrans)
        while not self.closed:
            self.processor.process(iprot, oprot)

    def sockets(self) -> list[Any]:
        """Every socket it has open: those it listens on, and its connections'. Taken without
        a lock: it is asked in a forked child, where no other thread runs (and a lock another
        thread of the parent held stays held)."""
        listening = [self.socket.sock] + ([self.also.sock] if self.also is not None else [])
        return listening + list(self._served.values())

    def close(self) -> None:
        """Stop accepting, and end the connections served on threads once their call under
        way is answered (their reads see the end now): what they hold is freed while the
        store is still open (a group member's leases go back)."""
        self.closed = True
        self.trans.close()
        if self.also is not None:
            self.also.close()
        with self._lock:
            served = list(self._served.values())
        for sock in served:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
