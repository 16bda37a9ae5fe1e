"""The hqueue server: Thrift API, server-side IDs, partition ownership."""

from .app import DEFAULT_PORT, HQueueServer

__all__ = ["DEFAULT_PORT", "HQueueServer"]
