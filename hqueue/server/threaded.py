"""thriftpy2's threaded server, adjusted for a long-running service.

* The socket binds before serving, so port 0 resolves to a real port first.
* ``close()`` ends the accept loop (thriftpy2's only sets a flag).
* A peer that vanishes (reset, closed mid-frame) ends its own connection
  quietly; a malformed request ends it with one warning line. Neither
  touches other connections.
"""

from __future__ import annotations

import logging
import threading

from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.server import TThreadedServer
from thriftpy2.thrift import TProcessor
from thriftpy2.transport import TFramedTransportFactory, TServerSocket, TTransportException

logger = logging.getLogger(__name__)


class ListeningSocket(TServerSocket):
    """Binds on the first listen() only, so the caller can bind early."""

    @classmethod
    def bound(cls, host: str, port: int) -> ListeningSocket:
        """A socket listening on ``host:port`` now (port 0: a free one)."""
        sock = cls(host=host, port=port, client_timeout=None)
        sock.listen()
        return sock

    def listen(self):
        if self.sock is None:
            super().listen()

    @property
    def bound_port(self) -> int:
        """The port actually bound (``port`` may be 0)."""
        return self.sock.getsockname()[1]


class ThreadedServer(TThreadedServer):
    """A thread per connection; framed transport and binary protocol by default."""

    def __init__(self, service, handler, socket: ListeningSocket, *, transport=None, protocol=None) -> None:
        self.socket = socket
        super().__init__(
            TProcessor(service, handler),
            self.socket,
            iprot_factory=protocol or TBinaryProtocolFactory(),
            itrans_factory=transport or TFramedTransportFactory(),
            daemon=True,
        )

    @property
    def port(self) -> int:
        return self.socket.bound_port

    def serve(self) -> None:
        while not self.closed:
            try:
                client = self.trans.accept()
            except OSError:
                if self.closed:
                    return
                logger.warning("accept failed", exc_info=True)
                continue
            threading.Thread(target=self.handle, args=(client,), daemon=True, name="thrift-conn").start()

    def serve_in_thread(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.serve, name=name, daemon=True)
        thread.start()
        return thread

    def handle(self, client) -> None:
        itrans = self.itrans_factory.get_transport(client)
        otrans = self.otrans_factory.get_transport(client)
        iprot = self.iprot_factory.get_protocol(itrans)
        oprot = self.oprot_factory.get_protocol(otrans)
        try:
            while not self.closed:
                self.processor.process(iprot, oprot)
        except (TTransportException, OSError):
            pass  # the peer went away
        except Exception as e:
            logger.warning("connection ended by a malformed request: %s: %s", type(e).__name__, e)
        finally:
            itrans.close()
            otrans.close()

    def close(self) -> None:
        self.closed = True
        self.trans.close()
