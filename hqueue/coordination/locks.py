"""Partition locks in ZooKeeper, taken and given back one partition at a time.

A partition's lock is the oldest ephemeral sequential node under
``<locks>/<item>/`` (kazoo's ``Lock`` layout: ``<uuid hex>__lock__<seq>``,
so a kazoo Lock on the same path is excluded too). A take never waits:
a partition another server holds (or is queueing for) is left for the
next turn, so one busy partition holds up no other.

Each held lock's fencing token is its node's ``czxid``: a take wins only
when its node is the oldest under the partition, so every earlier owner's
node was made, and its czxid given, before it (SPEC C10).
"""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

#: kazoo's lock node marker (kazoo.recipe.lock.Lock._NODE_NAME).
MARK = "__lock__"


def _sequence(node: str) -> str:
    return node.rsplit(MARK, 1)[1]


class PartitionLocks:
    """The locks one ZooKeeper session holds: ``item -> (node path, czxid)``.

    Only the coordinator's loop thread calls these; ``held`` may be read anywhere.
    """

    def __init__(self, client: KazooClient, path: str) -> None:
        self.client, self.path = client, path
        self.held: dict[str, tuple[str, int]] = {}

    def take(self, item: str) -> bool:
        """Hold ``item``'s lock if no one else holds it or waits for it; False if someone does."""
        parent = f"{self.path}/{item}"
        if self._contenders(parent):
            return False
        node, stat = self.client.create(
            f"{parent}/{uuid.uuid4().hex}{MARK}", ephemeral=True, sequence=True, makepath=True, include_data=True
        )
        name, contenders = node.rsplit("/", 1)[1], self._contenders(parent)
        if not contenders or min(contenders, key=_sequence) != name:  # someone took it in between: give way
            self._delete(node)
            return False
        self.held[item] = (node, stat.czxid)
        return True

    def give_back(self, item: str) -> None:
        held = self.held.pop(item, None)
        if held is not None:
            self._delete(held[0])

    def forget(self) -> None:
        """The session ended: ZooKeeper deleted every node of it already."""
        self.held.clear()

    def _contenders(self, parent: str) -> list[str]:
        try:
            return [c for c in self.client.get_children(parent) if MARK in c]
        except NoNodeError:
            return []

    def _delete(self, node: str) -> None:
        try:
            self.client.delete(node)
        except NoNodeError:
            pass
