"""The HTTP endpoint ``/metrics`` is served on, bounded as the Thrift port is.

prometheus_client's ``start_http_server`` serves a ThreadingHTTPServer: a
thread per connection, without bound, each waiting on its client as long as
it likes. This one:

* checks the credential first: a request without the right
  ``Authorization: Bearer <token>`` gets 401 before anything is collected;
* serves at most ``MAX_CLIENTS`` connections at once (one thread each);
  when all are taken, a new connection closes the oldest one that has not
  yet sent a whole request (connections held open and silent cannot keep
  a scrape out), or is closed at once if every one has;
* gives each connection ``DEADLINE`` seconds in all, and reads at most
  ``MAX_REQUEST`` bytes of request line and headers (a slow or endless
  request ends with its connection, not with a thread held);
* answers GET ``/metrics`` (and ``/``) only: one request per connection.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .. import forks

logger = logging.getLogger(__name__)

MAX_CLIENTS = 8
#: Seconds a new connection waits for the slot of the silent one it closed.
EVICT_WAIT = 1.0
DEADLINE = 5.0
MAX_REQUEST = 8192
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsEndpoint:
    """Serves ``render()`` at ``/metrics`` on ``host:port`` in a thread.

    Args:
        render: The body of a scrape.
        allows: Whether an ``Authorization`` header value (None: absent), from a peer host, may read
            (True or 200; False or 401; 403: a right token without the role;
            429: that host must wait, answered at once);
            None: every request may.

    Raises:
        OSError: the port is taken (the message names it).
    """

    def __init__(
        self, render: Callable[[], bytes], host: str, port: int, allows: Callable[[str | None, str], bool | int] | None
    ) -> None:
        check = staticmethod(allows) if allows is not None else None
        handler = type("Handler", (_Handler,), {"render": staticmethod(render), "allows": check})
        try:
            self._server = _Server((host, port), handler)
        except OSError as e:
            raise OSError(e.errno, f"metrics port {port} on {host}: {e.strerror}") from e
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="hqueue-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        #: Connections still waiting for their whole request, and since when (oldest first).
        self.silent: dict[socket.socket, float] = {}
        self._silent_lock = threading.Lock()
        super().__init__(address, handler)
        forks.closed_in_child(self)

    def sockets(self) -> list[socket.socket]:
        """Its listening socket, and the connections still waiting for their request."""
        return [self.socket, *list(self.silent)]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False) and not self._evict_for_one():
            self.shutdown_request(request)  # full of connections that sent their request: closed, nothing waits
            return
        with self._silent_lock:
            self.silent[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.spoke(request)
            self.slots.release()
            raise

    def _evict_for_one(self) -> bool:
        """Close the oldest connection that has not sent its whole request; whether its slot came free."""
        with self._silent_lock:
            oldest = min(self.silent, key=self.silent.__getitem__, default=None)
            if oldest is None:
                return False
            del self.silent[oldest]
        logger.info("metrics: all %d connections taken; closed the oldest one still silent", MAX_CLIENTS)
        try:
            oldest.shutdown(socket.SHUT_RDWR)  # its handler's read ends now, and frees the slot
        except OSError:
            pass
        return self.slots.acquire(timeout=EVICT_WAIT)

    def spoke(self, request: Any) -> None:
        """``request``'s connection sent its whole request: it is no longer closed to make room."""
        with self._silent_lock:
            self.silent.pop(request, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.spoke(request)
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("metrics request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    #: A request line without a version is answered as HTTP/1.0 (with a status line and
    #: headers), not as HTTP/0.9 (a bare body: a 401 or 429 looked like a scrape's output).
    default_request_version = "HTTP/1.0"

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if self.request_version == "HTTP/0.9":  # (said outright: answered with a status line all the same)
            self.request_version = "HTTP/1.0"
        return parsed

    render: Callable[[], bytes]
    allows: Callable[[str | None, str], bool | int] | None

    def setup(self) -> None:
        super().setup()
        self.rfile = _Bounded(self.rfile, self.connection, time.monotonic() + DEADLINE)  # type: ignore[assignment]

    def do_GET(self) -> None:
        self.server.spoke(self.request)  # type: ignore[attr-defined]
        allows = type(self).allows
        verdict = True if allows is None else allows(self.headers.get("Authorization"), self.client_address[0])
        if verdict is False or verdict == 401:
            self._reply(401, b"a bearer token with the metrics role is needed\n", {"WWW-Authenticate": "Bearer"})
        elif verdict == 403:
            self._reply(403, b"this token does not hold the metrics role\n")
        elif verdict == 429:
            self._reply(429, b"too many wrong tokens from this host: try again later\n", {"Retry-After": "2"})
        elif urlsplit(self.path).path not in ("/metrics", "/"):
            self._reply(404, b"only /metrics is served here\n")
        else:
            self._reply(200, type(self).render())

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics %s: " + format, self.address_string(), *args)


class _Bounded:
    """The request's reader: every read within the connection's deadline, at most
    MAX_REQUEST bytes in all (BaseHTTPRequestHandler ends the connection on the
    TimeoutError either raises)."""

    def __init__(self, raw: Any, connection: socket.socket, deadline: float) -> None:
        self._raw, self._connection, self._deadline, self._left = raw, connection, deadline, MAX_REQUEST
        self._lines = 0  # (the first is the request line)

    def _before(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0 or self._left <= 0:
            raise TimeoutError("the request took too long or was too large")
        self._connection.settimeout(left)  # writes of the reply keep what is left too

    def readline(self, size: int = -1) -> bytes:
        # One socket read at a time (peek), each within what is left of the deadline:
        # a client sending a byte at a time cannot stretch one readline past it.
        self._lines += 1
        limit = self._left if size < 0 else min(size, self._left)
        out = bytearray()
        while len(out) < limit:
            self._before()
            data = self._raw.peek(1)
            if not data:
                break
            end = data.find(b"\n", 0, limit - len(out))
            take = end + 1 if end >= 0 else min(len(data), limit - len(out))
            out += self._raw.read(take)  # buffered already: no wait
            self._left -= take
            if end >= 0:
                break
        if self._lines > 1 and self._left <= 0 and not out.endswith(b"\n"):
            # A header cut at the limit, or none left: not the end of the headers (an empty
            # read was taken as that, and the request answered as if whole): 431.
            raise http.client.LineTooLong(f"headers: the request is over {MAX_REQUEST} bytes")
        return bytes(out)

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while size < 0 or len(out) < size:
            self._before()
            data = self._raw.read1(self._left if size < 0 else min(size - len(out), self._left))
            if not data:
                break
            out += data
            self._left -= len(data)
        return bytes(out)

    def close(self) -> None:
        self._raw.close()
