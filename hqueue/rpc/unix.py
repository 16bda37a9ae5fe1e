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
import secrets
import socket
import stat
from collections.abc import Iterator

logger = logging.getLogger(__name__)


def unix_listener(path: str, backlog: int, mode: int = 0o600, group: int | None = None) -> socket.socket:
    """A Unix socket listening at ``path``, its file made with permissions ``mode`` and, when
    given, group ``group``.

    The socket is made in a private directory beside ``path`` (``0700``, this process's),
    given its group and mode there, then linked into place: it appears at ``path`` with
    its final permissions, so no one is let in meanwhile. Every step after the private
    directory is made goes through descriptors of it and of ``path``'s directory, never a
    path another user of that directory could change (rename the private directory, swap
    a symlink in) to have this process change or delete another file. A file already at
    ``path`` is an error (``EADDRINUSE``). A group this process may not give (it is no
    member) leaves the socket ``0600``, with a warning. Paths too long for ``sun_path``
    need nothing more: the bind goes through ``/proc/self/fd/N/name`` (Linux).
    """
    directory, name = os.path.split(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = private = -1
    try:
        parent = os.open(directory or ".", _PARENT)
        private, private_name = _private_directory(parent)
        try:
            os.fchmod(sock.fileno(), 0o600)
            sock.bind(f"/proc/self/fd/{private}/{name}")
            mode = _give_group(private, name, path, mode, group)
            os.chmod(name, mode, dir_fd=private)  # (nobody else may reach it here: exact, whatever the umask)
            sock.listen(backlog)
            _into_place(private, parent, name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=private)
            _remove_private(parent, private, private_name)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {path}: {e.strerror or e}") from e
    finally:
        for fd in (private, parent):
            if fd >= 0:
                os.close(fd)
    return sock


#: How a directory is opened to work in it by descriptor (never through a symlink).
_DIRECTORY = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
#: How the socket's own directory is opened: its path may be a symlink (the store's, as configured).
_PARENT = _DIRECTORY & ~os.O_NOFOLLOW


def _private_directory(parent: int) -> tuple[int, str]:
    """A new directory in ``parent`` only this process's user may enter: its descriptor
    (checked to be the directory made, not one swapped in by name) and its name."""
    name = f".hqueue-{secrets.token_hex(8)}"
    os.mkdir(name, 0o700, dir_fd=parent)
    fd = os.open(name, _DIRECTORY, dir_fd=parent)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise PermissionError(errno.EPERM, f"{name}, made to bind the socket in, was replaced")
    return fd, name


def sweep_private(directory: str) -> None:
    """Remove the private directories processes of this user killed while making a socket
    left in ``directory`` (call it holding what the socket is for: the store's lock). Only
    this user's ``0700`` ones, emptied and removed through descriptors."""
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(".hqueue-")]
        parent = os.open(directory, _PARENT)
    except OSError:
        return
    try:
        for name in names:
            with contextlib.suppress(OSError):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
                try:
                    info = os.fstat(fd)
                    if info.st_uid == os.geteuid() and not stat.S_IMODE(info.st_mode) & 0o077:
                        for entry in os.listdir(fd):
                            os.unlink(entry, dir_fd=fd)
                        _remove_private(parent, fd, name)
                finally:
                    os.close(fd)
    finally:
        os.close(parent)


def _give_group(private: int, name: str, path: str, mode: int, group: int | None) -> int:
    """Give the socket ``group``; the mode to make it (``0600`` if the group may not be given)."""
    if group is None:
        return mode
    try:
        os.chown(name, -1, group, dir_fd=private, follow_symlinks=False)
    except PermissionError as e:
        logger.warning(
            "%s is left to this user alone: it cannot be given group %d (%s); run as a member of that group, "
            "or make its directory setgid (chmod g+s)", path, group, e,
        )  # fmt: skip
        return 0o600
    return mode


def _into_place(private: int, parent: int, name: str) -> None:
    """The socket at ``name`` in ``parent`` too, never over a file there (a hard link);
    where the file system has no hard links, moved there if nothing is."""
    try:
        os.link(name, name, src_dir_fd=private, dst_dir_fd=parent, follow_symlinks=False)
    except FileExistsError:
        raise OSError(errno.EADDRINUSE, "a file is there already") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        try:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, name, src_dir_fd=private, dst_dir_fd=parent)
            return
        raise OSError(errno.EADDRINUSE, "a file is there already") from None


def _remove_private(parent: int, private: int, name: str) -> None:
    """Remove the private directory, if ``name`` in ``parent`` is still it (not one put there since)."""
    with contextlib.suppress(OSError):
        made = os.fstat(private)
        there = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (there.st_dev, there.st_ino) == (made.st_dev, made.st_ino):
            os.rmdir(name, dir_fd=parent)


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
    fd = os.open(directory, _PARENT)
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
