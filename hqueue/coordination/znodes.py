"""What hqueue trusts in ZooKeeper: the ACL walk that closes nodes made while the
tree was open, and the check that a node only sessions make is a session's.

A server makes its party node, its locks and the presences it writes ephemeral
(and, with ``--zk-auth``, under the servers' ACL). A node in those places that
is persistent was made by hand or planted: trusting one would deal partitions
to a "server" that never answers (and that clients send their tokens to), or
hold a lock nobody ever gives back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

logger = logging.getLogger(__name__)


def secure(client: KazooClient, paths: Iterable[str]) -> None:
    """Put the client's default ACL on hqueue's nodes: the chroot and everything
    under it, or, without a chroot, ``paths`` and everything under them.

    Nodes made before the deployment turned ACLs on were open to anyone;
    the first server started with credentials closes them. What anyone could
    write then is not trusted: an ephemeral node among them is deleted, not
    closed (it is a session that is no server of this deployment: a "server"
    in the party, a lock, a subscriber's presence, planted before the ACL came;
    every server of the deployment makes its nodes under the ACL). A node gets
    the ACL once everything below it has it, so a node that has it needs no walk:
    later starts cost a round trip, and a walk cut short is finished by the next
    start; a node's children are looked at again once it has the ACL (one made
    meanwhile, while it was still open).
    """
    if client.default_acl:
        for path in ["/"] if client.chroot else paths:
            _secure_tree(client, path, client.default_acl)


def _secure_tree(client: KazooClient, path: str, acl: list) -> None:
    try:
        acls, stat = client.get_acls(path)
        if acls == acl:
            return
        if stat.ephemeralOwner:
            logger.warning("ZooKeeper node %s was made without the servers' credentials: deleted", path)
            client.delete(path)
            return
        for child in client.get_children(path):
            _secure_tree(client, f"{path.rstrip('/')}/{child}", acl)
        client.set_acls(path, acl)
        for child in client.get_children(path):  # (made while it was open still)
            _secure_tree(client, f"{path.rstrip('/')}/{child}", acl)
    except NoNodeError:
        return


class SessionNodes:
    """Which nodes, where only sessions make nodes (a party member, a lock), are a live
    session's (ephemeral), remembered: a node's kind never changes, so each is looked at once.

    A persistent one was made by hand or planted: it is deleted (with what was put under
    it), with a warning, and never counted; so it is if it cannot be deleted (warned of once:
    every turn of the loop meets it again), and it never stops the caller.
    """

    #: The most nodes remembered (then forgotten, and looked at again).
    REMEMBERED = 100_000

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._sessions: set[str] = set()
        self._ignored: set[str] = set()

    def check(self, path: str) -> bool:
        """Whether ``path`` is a session's node; False if there is no such node."""
        if path in self._sessions:
            return True
        stat = self.client.exists(path)
        if stat is None:
            return False
        if stat.ephemeralOwner:
            _remember(self._sessions, path)
            return True
        try:
            self.client.delete(path, recursive=True)
            logger.warning("ZooKeeper node %s is persistent where only sessions make nodes: deleted", path)
        except NoNodeError:
            pass
        except KazooException as e:
            if path not in self._ignored:
                _remember(self._ignored, path)
                logger.warning("ZooKeeper node %s is persistent where only sessions make nodes: ignored (%s)", path, e)
        return False


def _remember(paths: set[str], path: str) -> None:
    if len(paths) >= SessionNodes.REMEMBERED:
        paths.clear()
    paths.add(path)
