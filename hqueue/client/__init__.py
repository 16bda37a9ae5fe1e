"""The client of hqueue servers: ``hqueue://`` URLs.

* ``engine.py``: :class:`RemoteEngine`, the engine API over the servers
  (routing each partition's calls to its owner, following moves).
* ``groups.py``, ``subscriptions.py``: its ``groups`` and ``subscriptions``.
* ``pool.py``: connections per server.
"""

from __future__ import annotations

from .engine import RemoteEngine
from .groups import RemoteGroups
from .subscriptions import RemoteSubscriptions

__all__ = ["RemoteEngine", "connect"]


def connect(url: str, *, token: str | None = None, timeout: float | None = None) -> RemoteEngine:
    """A client of the hqueue servers ``url`` names, with its consumer groups and
    push subscriptions attached (``engine.groups``, ``engine.subscriptions``)."""
    engine = RemoteEngine(url, token=token, timeout=timeout)
    engine.groups = RemoteGroups(engine)
    engine.subscriptions = RemoteSubscriptions(engine)
    return engine
