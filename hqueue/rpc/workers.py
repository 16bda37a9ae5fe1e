"""The threads an event-loop server (rpc/loop.py) hands its calls to: a thread per
call under way, none kept past a short idle time.

Not :class:`concurrent.futures.ThreadPoolExecutor`: it queues a task before it
starts the thread to run it, so a task refused for want of a thread (a pids
limit) could still run later, once another thread is free.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class Workers:
    """The threads that run what the loop hands over: a thread per call under way, kept
    ``idle`` seconds for the next one. :meth:`submit` fails (RuntimeError, no thread to
    be had) before anything is queued, so a call it refuses never runs later."""

    def __init__(self, idle: float = 10.0) -> None:
        self.idle = idle
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
        self._waiting = 0  # threads waiting for a task, less the tasks queued for them
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._waiting:
                self._waiting -= 1
                self._tasks.put((fn, args))
                return
        threading.Thread(target=self._run, args=(fn, args), name="hqueue-call", daemon=True).start()

    def close(self) -> None:
        """End the threads waiting for a task (those running one end after it)."""
        with self._lock:
            waiting, self._waiting = self._waiting, 0
            for _ in range(waiting):
                self._tasks.put((_END, ()))

    def _run(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        while fn is not _END:
            fn(*args)
            del args
            with self._lock:
                self._waiting += 1
            try:
                fn, args = self._tasks.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    try:  # a task queued as the wait ended is this thread's
                        fn, args = self._tasks.get_nowait()
                    except queue.Empty:
                        self._waiting -= 1
                        return


def _END() -> None:
    """What :meth:`Workers.close` hands a waiting thread: its end."""
