"""Failed ``authenticate`` calls: slowed down, then the connection closed, and logged sparingly.

A client that tries wrong tokens gets its first :attr:`FailedLogins.free`
failures answered at once (a mistyped token should fail fast). After that
each failure is answered only after a delay that doubles from
``base_delay`` up to ``max_delay``, and the ``close_after``-th failure on
one connection (or from one peer host within ``host_window`` seconds) is
the last: the server answers it, then closes the connection. Counting per
peer host too (at most ``max_hosts`` hosts kept) means a client that
reconnects after each try is slowed down and cut off as much. A successful
authentication is never delayed.

The warning is logged for a connection's first failure and for its
closing, at most once per ``log_interval`` seconds over the whole server;
the next line says how many were left out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from ..backoff import doubled
from ..rpc.connections import Connection, RateLimitedLog

logger = logging.getLogger(__name__)


class FailedLogins:
    """Counts failed authentications; says how long to hold each answer and when to close."""

    def __init__(
        self,
        *,
        free: int = 3,
        close_after: int = 10,
        base_delay: float = 0.1,
        max_delay: float = 2.0,
        host_window: float = 60.0,
        max_hosts: int = 10_000,
        log_interval: float = 10.0,
    ) -> None:
        self.free, self.close_after = free, close_after
        self.base_delay, self.max_delay = base_delay, max_delay
        self.host_window, self.max_hosts = host_window, max_hosts
        self.log = RateLimitedLog(log_interval, logger)
        self._hosts: OrderedDict[str, tuple[float, int]] = OrderedDict()  # host -> (last failure, failures)
        self._lock = threading.Lock()

    def failed(self, connection: Connection | None) -> tuple[float, bool]:
        """Record one failure: (seconds to wait before answering, whether to close the connection after)."""
        if connection is None:  # called in process (tests): nothing to slow down
            return 0.0, False
        connection.auth_failures += 1
        host = connection.peer[0]
        failures = max(connection.auth_failures, self._host_failed(host))
        delay = 0.0 if failures <= self.free else doubled(self.base_delay, failures - self.free - 1, self.max_delay)
        close = failures >= self.close_after
        if close:
            self.log.warning(
                "auth", "refused %d tokens from %s (this connection: %d); closed the connection",
                failures, host, connection.auth_failures,
            )  # fmt: skip
        elif connection.auth_failures == 1:
            self.log.warning("auth", "refused a token from %s", connection.peer[0])
        return delay, close

    def _host_failed(self, host: str) -> int:
        now = time.monotonic()
        with self._lock:
            last, count = self._hosts.pop(host, (now, 0))
            count = count + 1 if now - last < self.host_window else 1
            self._hosts[host] = (now, count)  # the most recent last
            while len(self._hosts) > self.max_hosts:
                self._hosts.popitem(last=False)
            return count
