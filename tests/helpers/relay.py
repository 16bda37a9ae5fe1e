"""A TCP relay on loopback, between a client under test and a real server.

It keeps every byte it forwards (``seen``: what a wire tap reads), and may
reset its first ``breaks`` connections once their request came, the way a
server killed mid-call breaks them (``broken`` counts them).
"""

from __future__ import annotations

import socket
import struct
import threading


class Relay:
    """Forwards each connection to ``target``; resets the first ``breaks`` instead."""

    def __init__(self, target: tuple[str, int], breaks: int = 0) -> None:
        self.target, self.breaks, self.broken = target, breaks, 0
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
            if self.broken < self.breaks:
                self.broken += 1
                client.recv(65536)  # the request came: it may have been acted on
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # RST: the peer reads "connection reset"
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                self.seen += data
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def close(self) -> None:
        self.sock.close()
