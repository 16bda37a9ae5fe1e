"""Serving an embedded store to the other local processes that open it (hqueue/sharing.py).

The process that opens a ``local://`` store runs an :class:`~hqueue.server.app.HQueueServer`
on the engine it opened, listening on the store's Unix socket instead of a
TCP port: the same calls as ``hqueue server``, no token (the socket file's
permissions decide who may connect). It starts with the store's first
opening in the process and stops when the store closes there (the socket
file is removed then, while this process still holds the store's lock).
An ``hqueue server`` on the store serves the socket itself, beside its TCP
port (``local_socket``); then this is not needed.
"""

from __future__ import annotations

import logging
import os
import threading

from ..engine import Engine
from ..groups.limits import GroupLimits
from ..sharing import claim_socket, drop_socket, socket_access
from .app import HQueueServer

logger = logging.getLogger(__name__)

#: Seconds the store's closing waits for other processes' calls under way.
CLOSE_GRACE = 2.0

_lock = threading.Lock()


def share(engine: Engine, group_limits: GroupLimits | None = None) -> None:
    """Serve ``engine``'s ``local://`` store on its Unix socket, once per engine.

    An engine whose socket something else in this process serves (an ``hqueue
    server`` on the store) is left to that.
    """
    with _lock:
        path = claim_socket(engine, share)
        if path is None:
            return
        try:
            server = HQueueServer(
                engine.url,
                engine=engine,
                unix_socket=path,
                unix_socket_access=socket_access(os.path.dirname(path)),
                group_limits=group_limits,
            )
        except BaseException:
            drop_socket(engine, share)
            raise
    server.start()
    engine.on_close(lambda: server.stop(grace=CLOSE_GRACE))
    logger.debug("sharing %s on %s", engine.url, path)
