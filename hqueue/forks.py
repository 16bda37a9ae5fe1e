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
  copy in the child would write to the parent's files;
* the sockets the parent serves on (Thrift, its Unix socket, metrics, the
  console) are closed in the child (:func:`closed_in_child`).
"""

from __future__ import annotations

import contextlib
import os
import weakref
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


#: What serves connections in this process: a forked child closes its copies of their sockets.
_listeners: weakref.WeakSet[Any] = weakref.WeakSet()


def closed_in_child(listener: Any) -> None:
    """In a child forked after this call, close the child's copies of ``listener.sockets()``
    (the sockets it listens on, and its connections'): else, once the parent is gone, a
    child that never used them (a ``multiprocessing`` worker) keeps its peers connected to
    nobody and its port taking connections nobody accepts (a shared store not taken over,
    a port that cannot be bound again). The copies are closed, not shut down: the parent's
    sockets are not touched."""
    _listeners.add(listener)


def _close_listeners() -> list[Any]:
    listeners = list(_listeners)
    for listener in listeners:
        try:
            sockets = list(listener.sockets())
        except Exception:  # (forked while it was being made: it has nothing of its own yet)
            continue
        for sock in sockets:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.close(sock.detach())
    return listeners


def _after_fork_in_child() -> None:
    _count[0] += 1
    _inherited.extend(_close_listeners())
    for reset in _resets:
        _inherited.extend(reset())


os.register_at_fork(after_in_child=_after_fork_in_child)
