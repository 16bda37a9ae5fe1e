"""Unix sockets: where a process serves its embedded store to other local processes.

``sun_path`` holds 108 bytes, and a store's directory may be deeper than that:
a longer path is bound or connected to through an ``O_PATH`` descriptor of
its directory (``/proc/self/fd/N/name``, Linux), open only meanwhile.

Both ends of a connection widen their send buffer (:func:`widen`). A Unix
stream socket sends at most half its send buffer in one message, and waits
while what it sent and the peer has not read passes the whole buffer: with
Linux's default (208 KiB), a put of 1,000 100-byte messages (a 130 KB
frame) went as two, the sender waited for the server to read the first, and
each call cost two wake-ups of the server where loopback TCP (its buffers
grow to 4 MiB by themselves) costs one: measured 0.91x of TCP's puts under
SYNC_WAL, whose fsync leaves the CPUs idle in between (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator


def unix_listener(path: str, backlog: int, mode: int = 0o600) -> socket.socket:
    """A Unix socket listening at ``path``, its file made with permissions ``mode`` (a
    path too long for ``sun_path`` goes through its directory's descriptor,
    ``/proc/self/fd/N/name``, on Linux).

    The mode is given to the socket before it is bound: Linux makes the file
    from it (less the umask), so no other user can connect in between, as
    one could where a ``chmod`` after ``bind`` follows a permissive umask."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(sock.fileno(), mode)
        with short_unix_path(path) as short:
            sock.bind(short)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {path}: {e.strerror or e}") from e
    return sock


#: The longest Unix socket path bound or connected to as it is (``sun_path`` holds 108 bytes).
MAX_UNIX_PATH = 100


@contextlib.contextmanager
def short_unix_path(path: str) -> Iterator[str]:
    """``path``, or for one longer than ``sun_path`` holds, the same file through an
    ``O_PATH`` descriptor of its directory (``/proc/self/fd/N/name``), open meanwhile."""
    if len(os.fsencode(path)) <= MAX_UNIX_PATH:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


#: The send buffer asked for (the kernel caps it at ``net.core.wmem_max``, and doubles it).
SEND_BUFFER = 4 * 1024 * 1024


def widen(sock: socket.socket) -> None:
    """Have a Unix socket send a frame of up to a few MB as one message, without waiting on its peer."""
    with contextlib.suppress(OSError):  # a smaller buffer is slower, not wrong
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
