"""Partition ownership through ZooKeeper, with kazoo's SetPartitioner.

Every server joins one SetPartitioner over the set of all partitions of all
queues (items ``"<queue>#<pid>"``). The partitioner shares the set out among
the party's members and takes a kazoo Lock per item, so each partition has
exactly one owner at a time. Its state machine (kazoo's
``recipe/partitioner.py``) drives this module's loop::

    ALLOCATING --(party stable for time_boundary, locks taken)--> ACQUIRED
    ACQUIRED --(party changed: a server joined or died)--> RELEASE
    RELEASE --(we release our locks)--> ALLOCATING
    any --(session lost, or the queue set changed)--> FAILURE -> new partitioner

So a dead server's partitions move when its session expires (its party node
and locks are ephemeral), and a joining server triggers a rebalance.

Lease: a server should stop accepting puts before anyone else can take its
partitions, which they can only do once ZooKeeper *expires* its session, a
full session timeout after its last heartbeat. Two guards:

* a lease: ``owns()`` is true only within ``session_timeout / 3`` of the
  last successful ZooKeeper round trip (monotonic clock). A server that was
  paused (GC, SIGSTOP, a frozen VM) refuses new puts the moment it resumes,
  before it has even heard that its session is gone;
* kazoo's SUSPENDED/LOST: the listener drops every owned partition at once.

These refuse new calls; they cannot stop a put that was already past its
ownership check when the server paused. That one is stopped by the store:
every write carries the partition's fence, which the new owner bumped when
it took the partition (storage/fence.py, SPEC C10), so the late write is
refused and nothing of it is kept.

Owners: the partition function is kazoo's default (sorted items dealt
round-robin to sorted members), so any server computes every partition's
owner from the party's members, which it watches. Member identifiers are
``<id>@<host:port>``.

Queues: a server that creates or drops a queue bumps ``/queues-version``;
every server watches it (and re-reads the queue list every
``refresh_seconds`` for queues made by other means) and joins a new
partitioner over the new set.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.partitioner import SetPartitioner
from kazoo.security import make_digest_acl

from ..errors import CoordinationError, InvalidArgument, NotPartitionOwner
from ..storage.fence import Token
from .base import Coordinator

logger = logging.getLogger(__name__)

PARTITIONER_PATH = "/ownership"
VERSION_PATH = "/queues-version"
#: 16 random bytes, made by the first server on a new ZooKeeper: tells its fencing tokens from another's.
ENSEMBLE_PATH = "/ensemble"


#: The environment variable that gives ZooKeeper credentials, ``user:password`` (as ``--zk-auth``).
AUTH_ENV = "HQUEUE_ZK_AUTH"


def zookeeper_client(hosts: str, auth: str | None, timeout: float) -> KazooClient:
    """A kazoo client; with ``auth`` (``user:password``) it authenticates with ZooKeeper's
    digest scheme and creates every node under an ACL that grants that user
    everything and nobody else anything (so only servers and subscribers given the
    credential can read push keys or write registrations and presences).

    Raises:
        InvalidArgument: ``auth`` is not ``user:password``.
    """
    if not auth:
        return KazooClient(hosts=hosts, timeout=timeout)
    user, colon, password = auth.partition(":")
    if not colon or not user or not password:
        raise InvalidArgument(
            f"ZooKeeper credentials are user:password (--zk-auth or ${AUTH_ENV}), got a value without ':'"
        )
    return KazooClient(
        hosts=hosts,
        timeout=timeout,
        auth_data=[("digest", auth)],
        default_acl=[make_digest_acl(user, password, all=True)],
    )


def no_auth(hosts: str) -> str:
    return (
        f"ZooKeeper at {hosts} refused access (NoAuth): hqueue's nodes there are under an ACL; "
        f"give the credentials with --zk-auth or ${AUTH_ENV}"
    )


def secure(client: KazooClient, paths: Iterable[str]) -> None:
    """Put the client's default ACL on hqueue's nodes: the chroot and everything
    under it, or, without a chroot, ``paths`` and everything under them.

    Nodes made before the deployment turned ACLs on were open to anyone;
    the first server started with credentials closes them. A node gets the
    ACL only once everything below it has it, so a node that has it needs no
    walk: later starts cost a round trip, and a walk cut short is finished
    by the next start.
    """
    if client.default_acl:
        for path in ["/"] if client.chroot else paths:
            _secure_tree(client, path, client.default_acl)


def _secure_tree(client: KazooClient, path: str, acl: list) -> None:
    try:
        if client.get_acls(path)[0] == acl:
            return
        for child in client.get_children(path):
            _secure_tree(client, f"{path.rstrip('/')}/{child}", acl)
        client.set_acls(path, acl)
    except NoNodeError:
        return


def item(queue: str, pid: int) -> str:
    return f"{queue}#{pid:05d}"


def parse_item(text: str) -> tuple[str, int]:
    queue, _, pid = text.rpartition("#")
    return queue, int(pid)


def deal(members: Iterable[str], items: Iterable[str]) -> dict[str, str]:
    """kazoo's default partition function, for every member at once."""
    workers, everything = sorted(members), sorted(items)
    if not workers:
        return {}
    return {it: workers[i % len(workers)] for i, it in enumerate(everything)}


class ZooKeeperCoordinator(Coordinator):
    """Ownership shared among servers through ZooKeeper.

    Args:
        hosts: ``host:port[,host:port][/chroot]``.
        address: ``host:port`` clients use to reach this server.
        server_id: Name in the party (default: the address).
        session_timeout: ZooKeeper session timeout, seconds. A dead server's
            partitions move after about this long.
        time_boundary: How long the party must be stable before sharing
            out (kazoo's SetPartitioner), seconds.
        refresh_seconds: How often the queue list is re-read from storage.
        auth: ZooKeeper credentials, ``user:password``: every node is created
            under their digest ACL (see :func:`zookeeper_client`).
    """

    def __init__(
        self,
        hosts: str,
        address: str,
        *,
        server_id: str | None = None,
        session_timeout: float = 10.0,
        time_boundary: float = 0.5,
        refresh_seconds: float = 30.0,
        auth: str | None = None,
    ) -> None:
        super().__init__()
        self.address, self.hosts = address, hosts
        self.identifier = f"{server_id or address.replace(':', '_')}@{address}"
        self.time_boundary, self.refresh_seconds = time_boundary, refresh_seconds
        self.client = zookeeper_client(hosts, auth, session_timeout)
        self.auth = auth
        self.client.add_listener(self._on_state)
        self._lock = threading.RLock()
        self._owned: frozenset[str] = frozenset()
        #: item -> (our lock node, its czxid): the partition's fencing token.
        self._tokens: dict[str, tuple[str, int]] = {}
        self.ensemble = b""
        self._items: frozenset[str] = frozenset()
        self._owners: dict[str, str] = {}
        self._members: list[str] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.lease_seconds = session_timeout / 3
        self._lease_until = 0.0
        self._queues: Callable[[], Iterable[tuple[str, int]]] = lambda: ()
        self._partitioner: SetPartitioner | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------

    def start(self, queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._queues = queues
        try:
            self.client.start(timeout=max(15.0, self.client._session_timeout / 1000))
            self.client.ensure_path(VERSION_PATH)
            self.client.ensure_path(PARTITIONER_PATH + "/party")
            secure(self.client, [VERSION_PATH, ENSEMBLE_PATH, PARTITIONER_PATH, "/subscriptions"])
            self.ensemble = self._ensemble()
        except NoAuthError as e:
            raise CoordinationError(no_auth(self.client.hosts)) from e
        except (KazooTimeoutError, KazooException) as e:
            raise CoordinationError(f"cannot reach ZooKeeper at {self.client.hosts}: {e}") from e
        self.client.DataWatch(VERSION_PATH, lambda data, stat: self._wake.set())
        self.client.ChildrenWatch(PARTITIONER_PATH + "/party", self._on_members)
        self._thread = threading.Thread(target=self._run, name="hqueue-ownership", daemon=True)
        self._thread.start()

    def _ensemble(self) -> bytes:
        """This ZooKeeper's id, made once (a rebuilt ZooKeeper gets a new one)."""
        try:
            self.client.create(ENSEMBLE_PATH, uuid.uuid4().bytes)
        except NodeExistsError:
            pass
        data, _ = self.client.get(ENSEMBLE_PATH)
        if len(data) != 16:
            raise CoordinationError(f"ZooKeeper's {ENSEMBLE_PATH} holds {len(data)} bytes, not 16: not hqueue's")
        return data

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._set_owned(frozenset())
        if self._partitioner is not None:
            try:
                self._partitioner.finish()
            except KazooException:
                pass
        self.client.stop()
        self.client.close()

    # -- the fence and the membership watch ---------------------------------------

    def _on_state(self, state: str) -> None:
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            # Fence at once: others may take our partitions once the session expires.
            logger.warning("ZooKeeper connection %s: refusing puts on every partition", state)
            self._set_owned(frozenset())
        self._wake.set()

    def _on_members(self, children: list[str]) -> None:
        # ShallowParty node names are "<uuid hex>-<identifier>".
        members = sorted({c.split("-", 1)[1] for c in children if "-" in c})
        with self._lock:
            self._members = members
            self._owners = deal(members, self._items)
        self._wake.set()

    # -- the loop driving the partitioner -------------------------------------------

    def _run(self) -> None:
        version, next_refresh = None, 0.0
        while not self._stopping.is_set():
            try:
                asked = time.monotonic()
                current = self.client.exists(VERSION_PATH)
                if self.client.state == KazooState.CONNECTED:
                    self._lease_until = asked + self.lease_seconds  # from when we asked, not answered
                now = time.monotonic()
                if current is None or current.version != version or now >= next_refresh:
                    version, next_refresh = current.version if current else None, now + self.refresh_seconds
                    self._refresh_items()
                self._step()
            except (KazooException, KazooTimeoutError):
                logger.info("ZooKeeper unavailable; retrying", exc_info=True)
            except Exception:  # one bad turn never kills ownership
                logger.exception("ownership loop failed; retrying")
            self._wake.wait(min(0.5, self.lease_seconds / 3))
            self._wake.clear()

    def _refresh_items(self) -> None:
        items = frozenset(item(q, p) for q, n in self._queues() for p in range(n))
        if items != self._items or self._partitioner is None:
            with self._lock:
                self._items = items
                self._owners = deal(self._members, items)
            self._new_partitioner()

    def _new_partitioner(self) -> None:
        if self._partitioner is not None:
            self._set_owned(frozenset())
            self._partitioner.finish()
        self._partitioner = self.client.SetPartitioner(
            PARTITIONER_PATH,
            set=self._items,
            identifier=self.identifier,
            time_boundary=self.time_boundary,
            state_change_event=self._wake,
        )

    def _step(self) -> None:
        partitioner = self._partitioner
        if partitioner is None:
            return
        if partitioner.failed:
            if self.client.state == KazooState.CONNECTED:
                self._new_partitioner()
        elif partitioner.release:
            self._set_owned(frozenset())
            partitioner.release_set()
        elif partitioner.acquired:
            if self.client.state == KazooState.CONNECTED:
                self._read_tokens(partitioner)
                self._set_owned(frozenset(i for i in partitioner if i in self._tokens))

    def _read_tokens(self, partitioner: SetPartitioner) -> None:
        """Each held lock's czxid. Every owner of a partition created its lock node
        after the previous owner's (the lock goes to the oldest node, and a node
        made before the holder's would have held it first), so the czxid, which
        ZooKeeper only raises, grows from one owner to the next."""
        tokens, asked = {}, {}
        for lock in partitioner._locks:  # kazoo keeps no public list of them
            item = lock.path.rsplit("/", 1)[1]
            known = self._tokens.get(item)
            if known is not None and known[0] == lock.node:
                tokens[item] = known
            else:  # asked all at once: a rebalance of many partitions waits one round trip, not one each
                asked[item] = (lock.node, self.client.exists_async(f"{lock.path}/{lock.node}"))
        for item, (node, answer) in asked.items():
            stat = answer.get(timeout=self.lease_seconds)
            if stat is not None:
                tokens[item] = (node, stat.czxid)
        self._tokens = tokens

    def token(self, queue: str, partition_id: int) -> Token | None:
        found = self._tokens.get(item(queue, partition_id))
        if found is None:  # not held: a take without a token would bump past the real owner's epoch
            raise NotPartitionOwner(queue, partition_id, None)
        return Token(self.ensemble, found[1])

    def _set_owned(self, owned: frozenset[str]) -> None:
        with self._lock:
            old, self._owned = self._owned, owned
        if old != owned:
            gained = {parse_item(i) for i in owned - old}
            lost = {parse_item(i) for i in old - owned}
            logger.info("%s owns %d partition(s) (+%d, -%d)", self.address, len(owned), len(gained), len(lost))
            self._notify(gained, lost)

    # -- questions ------------------------------------------------------------------

    def owns(self, queue: str, partition_id: int) -> bool:
        return item(queue, partition_id) in self._owned and time.monotonic() < self._lease_until

    def owner(self, queue: str, partition_id: int) -> str | None:
        if self.owns(queue, partition_id):
            return self.address
        member = self._owners.get(item(queue, partition_id))
        return member.rsplit("@", 1)[1] if member else None

    def queues_changed(self) -> None:
        try:
            self.client.set(VERSION_PATH, b"")
        except KazooException as e:
            raise CoordinationError(f"cannot announce a queue change in ZooKeeper: {e}") from e
