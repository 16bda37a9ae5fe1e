"""The web console (``hqueue server --console-port``, ``hqueue console``): queues,
groups, lag, dead letters, timers and an audit log, as pages over the calls
the CLI makes. See docs/console.md."""

from .serve import AppendCounts, Console, server_counters

__all__ = ["AppendCounts", "Console", "server_counters"]
