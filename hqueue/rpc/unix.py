"""Unix sockets: where a process serves its embedded store to other local processes.

``sun_path`` holds 108 bytes, and a store's directory may be deeper than that:
a longer path is bound or connected to through an ``O_PATH`` descriptor of
its directory (``/proc/self/fd/N/name``, Linux), open only meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator


def unix_listener(path: str, backlog: int) -> socket.socket:
    """A Unix socket listening at ``path`` (a path too long for ``sun_path`` goes
    through its directory's descriptor, ``/proc/self/fd/N/name``, on Linux)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
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
