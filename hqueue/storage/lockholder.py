"""Which process holds an embedded store's lock: named in the error a second process gets.

RocksDB locks ``<directory>/LOCK`` with ``fcntl``; Linux lists such locks in
``/proc/locks`` (pid and inode), and a process's command line is in
``/proc/<pid>/cmdline``. Elsewhere, or when any of it cannot be read, the
holder is simply not named.
"""

from __future__ import annotations

import os

#: The longest command line shown.
MAX_SHOWN = 120


def lock_holder(directory: str) -> str | None:
    """``"pid 4242: hqueue tail q"`` for the process holding ``directory``'s lock, or None."""
    pid = lock_pid(directory)
    return None if pid is None else f"pid {pid}" + _command(str(pid))


def lock_pid(directory: str) -> int | None:
    """The process ID holding ``directory``'s lock (as /proc/locks lists it), or None."""
    try:
        inode = os.stat(os.path.join(directory, "LOCK")).st_ino
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not the holder
            continue
        if len(fields) >= 6 and fields[5].rsplit(":", 1)[-1] == str(inode) and fields[4].isdigit():
            return int(fields[4])
    return None


def command_words(pid: int) -> list[str]:
    """Process ``pid``'s whole command line as words, an hqueue command's as ``hqueue …``
    (``python -m hqueue.cli …`` and ``python …/bin/hqueue …`` alike); [] if it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return []
    if len(words) >= 3 and os.path.basename(words[0]).startswith(b"python") and words[1] == b"-m":
        words = [words[2].split(b".")[0], *words[3:]]  # python -m hqueue.cli …: hqueue …
    else:
        words = [os.path.basename(words[0]), *words[1:]]
        if len(words) >= 2 and words[0].startswith(b"python") and os.path.basename(words[1]) == b"hqueue":
            words = words[1:]  # python /…/bin/hqueue …
            words[0] = b"hqueue"
    return [word.decode("utf-8", "backslashreplace") for word in words]


def _command(pid: str) -> str:
    words = command_words(int(pid))
    if not words:
        return ""
    text = " ".join(words)
    return ": " + (text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…")
