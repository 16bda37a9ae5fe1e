"""The client of hqueue servers: ``hqueue://`` URLs.

* ``engine.py``: :class:`RemoteEngine`, the engine API over the servers
  (routing each partition's calls to its owner, following moves).
* ``groups.py``, ``subscriptions.py``: its ``groups`` and ``subscriptions``,
  which it attaches to itself.
* ``pool.py``: connections per server.
* ``put_limits.py``: how a put is split into calls, within the servers' limits.
"""

from __future__ import annotations

from .engine import RemoteEngine

__all__ = ["RemoteEngine"]
