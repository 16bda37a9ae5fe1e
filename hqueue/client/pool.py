"""Pooled Thrift connections to one hqueue server (the remote client's transport).

A :class:`Pool` hands each caller a :class:`Connection` of its own
(thriftpy2 clients are not thread-safe), checks an idle one before reuse so
that the first call after a server restart or an idle timeout does not
fail, authenticates new ones when a token is set, and speaks TLS when given
an SSL context. :class:`NotSent` says a request never left: no connection
could be made, so a retry cannot write anything twice.
"""

from __future__ import annotations

import queue as queue_module
import select
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.thrift import TClient
from thriftpy2.transport import TFramedTransportFactory, TSocket, TSSLSocket, TTransportException

from ..rpc import wire


class Connection:
    """One Thrift client and its socket (thriftpy2 clients are not thread-safe)."""

    def __init__(self, pool: Pool) -> None:
        if pool.ssl_context is not None:
            self.socket: TSocket = TSSLSocket(
                pool.host, pool.port, socket_timeout=pool.timeout_ms, ssl_context=pool.ssl_context
            )
        else:
            self.socket = TSocket(pool.host, pool.port, socket_timeout=pool.timeout_ms)
        transport = TFramedTransportFactory().get_transport(self.socket)
        transport.open()
        self.client = TClient(wire.T.HQueueService, TBinaryProtocolFactory().get_protocol(transport))
        if pool.token is not None:
            try:
                self.client.authenticate(pool.token)
            except BaseException:
                self.socket.close()  # refused, or broken: this connection is of no use
                raise

    def stale(self) -> bool:
        """Whether the server closed this idle connection (restart, idle timeout)."""
        sock = self.socket.sock
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)  # an idle connection has nothing to read but EOF

    def close(self) -> None:
        self.socket.close()


class Pool:
    """Connections to one server."""

    def __init__(
        self, address: str, timeout_ms: int, token: str | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address, self.host, self.port, self.timeout_ms = address, host, int(port), timeout_ms
        self.token, self.ssl_context = token, ssl_context
        self._idle: queue_module.SimpleQueue = queue_module.SimpleQueue()

    def take(self) -> Connection:
        """A connection for the caller alone; give it back with :meth:`give_back`."""
        while True:
            try:
                connection = self._idle.get_nowait()
            except queue_module.Empty:
                try:
                    return Connection(self)
                except (TTransportException, OSError) as e:
                    raise NotSent(e) from e
            if not connection.stale():
                return connection
            connection.close()

    def give_back(self, connection: Connection, broken: bool = False) -> None:
        if broken:
            connection.close()
        else:
            self._idle.put(connection)

    @contextmanager
    def client(self) -> Iterator[Any]:
        connection = self.take()
        try:
            yield connection.client
        except (TTransportException, OSError):
            self.give_back(connection, broken=True)  # the connection is in an unknown state
            raise
        except BaseException:
            self.give_back(connection)  # an answer came back (a typed error): the connection is fine
            raise
        self.give_back(connection)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue_module.Empty:
                return


class NotSent(Exception):
    """No connection could be made: the request never left."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause
