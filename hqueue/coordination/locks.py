"""Partition locks in ZooKeeper, taken and given back one partition at a time.

A partition's lock is the oldest ephemeral sequential node under
``<locks>/<item>/`` (kazoo's ``Lock`` layout: ``<prefix>__lock__<seq>``,
so a kazoo Lock on the same path is excluded too). A take never waits:
a partition another server holds (or is queueing for) is left for the
next turn, so one busy partition holds up no other.

Every node of one session starts with that session's own prefix, so a node
whose creation answer was lost (the connection broke) is found on the next
turn, kept if it is the oldest, else deleted: it never blocks the partition.

Each held lock's fencing token is its node's ``czxid``: a take wins only
when its node is the oldest under the partition, so every earlier owner's
node was made, and its czxid given, before it (SPEC C10).
"""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from .znodes import SessionNodes

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
        self._prefix = uuid.uuid4().hex
        #: Which of others' lock nodes are sessions' (a planted persistent one is not counted).
        self._sessions = SessionNodes(client)

    def take(self, item: str) -> bool:
        """Hold ``item``'s lock if no one else holds it or waits for it; False if someone does."""
        parent = f"{self.path}/{item}"
        contenders = self._contenders(parent)
        if not any(c.startswith(self._prefix) for c in contenders):
            if contenders:
                return False
            self.client.create(f"{parent}/{self._prefix}{MARK}", ephemeral=True, sequence=True, makepath=True)
            contenders = self._contenders(parent)
        ours = [c for c in contenders if c.startswith(self._prefix)]
        first = min(contenders, key=_sequence) if contenders else None
        if first is None or first not in ours:  # someone came first: give way
            for node in ours:
                self._delete(f"{parent}/{node}")
            return False
        for node in ours:
            if node != first:
                self._delete(f"{parent}/{node}")  # a duplicate from a broken call
        stat = self.client.exists(f"{parent}/{first}")
        if stat is None:
            return False
        self.held[item] = (f"{parent}/{first}", stat.czxid)
        return True

    def give_back(self, item: str) -> None:
        """Delete the lock node (if that fails, ``held`` keeps it, to be given back next turn)."""
        held = self.held.get(item)
        if held is not None:
            self._delete(held[0])
            del self.held[item]

    def forget(self) -> None:
        """The session ended: ZooKeeper deleted every node of it already."""
        self.held.clear()
        self._prefix = uuid.uuid4().hex

    def _contenders(self, parent: str) -> list[str]:
        """The lock nodes under ``parent``: ours, and others' that are sessions' (a persistent
        one, made by hand or planted, would hold the partition for ever: it is deleted)."""
        try:
            children = [c for c in self.client.get_children(parent) if MARK in c]
        except NoNodeError:
            return []
        return [c for c in children if c.startswith(self._prefix) or self._sessions.check(f"{parent}/{c}")]

    def _delete(self, node: str) -> None:
        try:
            self.client.delete(node)
        except NoNodeError:
            pass
