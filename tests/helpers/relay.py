"""A TCP relay on loopback, between a client under test and a real server.

It keeps every byte it forwards (``seen``: what a wire tap reads), and may
reset a connection once a request came (the first ``breaks`` requests that
hold the bytes ``on``), the way a server killed mid-call breaks it
(``broken`` counts them). With ``acted``, the request reaches the server
first, and the answer is what is lost (a server killed after its write).
"""

from __future__ import annotations

import socket
import struct
import threading


class Relay:
    """Forwards each connection to ``target``; resets the connection of the first ``breaks``
    requests holding ``on`` (any request: ``b""``) instead of forwarding them, or after
    forwarding them with ``acted``."""

    def __init__(self, target: tuple[str, int], breaks: int = 0, on: bytes = b"", acted: bool = False) -> None:
        self.target, self.breaks, self.broken, self.on, self.acted = target, breaks, 0, on, acted
        self.seen = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            lost = threading.Event()  # set: no answer goes back on this connection any more
            for a, b, requests in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, requests, lost), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, requests: bool, lost: threading.Event) -> None:
        try:
            while data := a.recv(65536):
                if requests and self.on in data and self.broken < self.breaks:
                    self.broken += 1  # the request came: it may have been acted on
                    lost.set()  # before the server can answer: a quick answer must not slip back
                    if self.acted:
                        b.sendall(data)
                    a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    a.close()  # RST: the peer reads "connection reset"
                    break
                if lost.is_set():
                    break
                self.seen += data
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def close(self) -> None:
        self.sock.close()
