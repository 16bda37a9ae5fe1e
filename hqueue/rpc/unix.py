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
import errno
import logging
import os
import socket
import tempfile
from collections.abc import Iterator

logger = logging.getLogger(__name__)


def unix_listener(path: str, backlog: int, mode: int = 0o600, group: int | None = None) -> socket.socket:
    """A Unix socket listening at ``path``, its file made with permissions ``mode`` and, when
    given, group ``group`` (a path too long for ``sun_path`` goes through its directory's
    descriptor, ``/proc/self/fd/N/name``, on Linux).

    The socket is bound in a private directory beside ``path`` (``0700``), given its group
    and mode there, then linked into place: it appears at ``path`` with its final
    permissions, so no one is let in meanwhile, and no other user of ``path``'s directory
    can swap a symlink in between the bind and a ``chown``/``chmod`` by path to have them
    change another file. A file already at ``path`` is an error (``EADDRINUSE``). A group
    this process may not give (it is no member) leaves the socket ``0600``, with a warning.
    """
    directory, name = os.path.split(path)
    try:
        private = tempfile.mkdtemp(prefix=".hqueue-", dir=directory or ".")
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {path}: {e.strerror or e}") from e
    staged = os.path.join(private, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(sock.fileno(), 0o600)
        with short_unix_path(staged) as short:
            sock.bind(short)
        if group is not None:
            try:
                os.chown(staged, -1, group)
            except PermissionError as e:
                mode = 0o600
                logger.warning(
                    "%s is left to this user alone: it cannot be given group %d (%s); run as a member of "
                    "that group, or make its directory setgid (chmod g+s)", path, group, e,
                )  # fmt: skip
        os.chmod(staged, mode)  # (only this process may reach it here: the mode is exact, whatever the umask)
        sock.listen(backlog)
        _into_place(staged, path)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {path}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        with contextlib.suppress(OSError):
            os.rmdir(private)
    return sock


def _into_place(staged: str, path: str) -> None:
    """``staged`` at ``path`` too, never over a file there (a hard link); where the file
    system has no hard links, renamed there if nothing is."""
    try:
        os.link(staged, path)
    except FileExistsError:
        raise OSError(errno.EADDRINUSE, "a file is there already") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK) or os.path.lexists(path):
            raise
        os.rename(staged, path)


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
