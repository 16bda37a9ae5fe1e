"""Serving an embedded store to the other local processes that open it (hqueue/sharing.py).

The process that opens a ``local://`` store runs an :class:`~hqueue.server.app.HQueueServer`
on the engine it opened, listening on the store's Unix socket instead of a
TCP port: the same calls as ``hqueue server``, no token (the socket file's
permissions decide who may connect). It starts with the store's first
opening in the process and stops when the store closes there (the socket
file is removed then, while this process still holds the store's lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref

from ..engine import Engine
from ..groups.state import GroupLimits
from ..sharing import socket_mode, socket_path
from .app import HQueueServer

logger = logging.getLogger(__name__)

#: Seconds the store's closing waits for other processes' calls under way.
CLOSE_GRACE = 2.0

_shared: weakref.WeakKeyDictionary[Engine, HQueueServer] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def share(engine: Engine, group_limits: GroupLimits | None = None) -> None:
    """Serve ``engine``'s ``local://`` store on its Unix socket, once per engine.

    An engine that something else in this process opened first (an ``hqueue
    server`` on it) is left to that: it serves the store already.
    """
    url = engine.url
    if not url.startswith("local://"):
        return
    with _lock:
        if engine in _shared or engine._refs > 1:
            return
        path = socket_path(url)
        # This process holds the store's lock: a socket file there is a stale one, of a process killed.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = HQueueServer(
            url,
            engine=engine,
            unix_socket=path,
            unix_socket_mode=socket_mode(os.path.dirname(path)),
            group_limits=group_limits,
        )
        _shared[engine] = server
    server.start()
    engine.on_close(lambda: server.stop(grace=CLOSE_GRACE))
    logger.debug("sharing %s on %s", url, path)
