"""fork(): what a child process must not inherit from its parent's hqueue.

A child forked from a process with a store open (``multiprocessing``'s default
start method on Linux) gets a copy of the parent's engines, connection pools and
put lanes, but none of its threads: RocksDB written from both processes is
corrupted, and a client's copied lanes answer one process's puts with the other's
IDs. So, in the child:

* the registries of open stores are emptied (:func:`on_fork`): a handle opened
  there opens the store afresh (a ``local://`` store the parent holds and serves:
  as its client);
* a handle opened before the fork refuses every call (:func:`check`);
* the engines it inherited are kept referenced, never closed: closing a RocksDB
  copy in the child would write to the parent's files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: Forks this process came through, counted by a fork hook: a check compares two ints,
#: not a getpid() system call each time.
_count = [0]
#: What the child inherited and must never close (see the module's docstring).
_inherited: list[Any] = []
_resets: list[Callable[[], list[Any]]] = []


def generation() -> int:
    """The number of forks this process came through (0 in a process that never forked)."""
    return _count[0]


def on_fork(reset: Callable[[], list[Any]]) -> None:
    """Call ``reset()`` in each child after a fork; what it returns (what it let go of) is
    kept referenced, so that nothing inherited is closed in the child."""
    _resets.append(reset)


def check(fork: int, what: str) -> None:
    """Raise unless ``fork`` (a :func:`generation`) is this process's."""
    if fork != _count[0]:
        raise RuntimeError(f"{what} was opened before this process forked: open one in this process")


def _after_fork_in_child() -> None:
    _count[0] += 1
    for reset in _resets:
        _inherited.extend(reset())


os.register_at_fork(after_in_child=_after_fork_in_child)
