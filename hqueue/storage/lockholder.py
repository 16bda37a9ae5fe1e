"""Which process holds an embedded store's lock: named in the error a second process gets.

RocksDB locks ``<directory>/LOCK`` with ``fcntl``; Linux lists such locks in
``/proc/locks`` (pid, device and inode), and a process's command line is in
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
        lock = os.stat(os.path.join(directory, "LOCK"))
        with open("/proc/locks") as locks:
            listed = locks.read()
    except OSError:
        return None
    return holder_listed(listed, lock)


def holder_listed(listed: str, lock: os.stat_result) -> int | None:
    """The pid that ``listed`` (the text of /proc/locks) names as holding the file ``lock``
    describes, or None.

    A lock is listed by its file's device (major:minor, in hex) and inode. Inode numbers
    repeat across file systems (two tmpfs mounts, say), so a lock listed on another device
    is not this file's, unless the process holding it has this very file open: btrfs
    subvolumes list the file system's device there, not the subvolume's that stat gives.
    """
    device = (os.major(lock.st_dev), os.minor(lock.st_dev))
    same_inode: list[int] = []
    for line in listed.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or not fields[4].isdigit():  # (a waiter, not the holder)
            continue
        major, minor, inode = (fields[5].split(":") + ["", ""])[:3]
        if inode != str(lock.st_ino):
            continue
        try:
            listed_device = (int(major, 16), int(minor, 16))
        except ValueError:
            listed_device = None
        if listed_device == device:
            return int(fields[4])
        same_inode.append(int(fields[4]))
    return next((pid for pid in same_inode if _has_open(pid, lock)), None)


#: The most descriptors of one process looked through for a file it has open.
MAX_DESCRIPTORS = 65536


def _has_open(pid: int, file: os.stat_result) -> bool:
    """Whether process ``pid`` has ``file`` open (False where its descriptors cannot be read)."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as descriptors:
            for count, descriptor in enumerate(descriptors):
                if count >= MAX_DESCRIPTORS:
                    return False
                try:
                    opened = os.stat(descriptor.path)
                except OSError:
                    continue
                if (opened.st_dev, opened.st_ino) == (file.st_dev, file.st_ino):
                    return True
    except OSError:
        pass
    return False


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
