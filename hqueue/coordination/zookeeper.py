"""Partition ownership through ZooKeeper: a party of servers and a lock per partition.

Every server joins a party (an ephemeral node ``<uuid hex>-<id>@<host:port>``
under ``/ownership/party``) and deals the set of all partitions of all
queues (items ``"<queue>#<pid>"``) among the members with kazoo's default
partition function (sorted items dealt round-robin to sorted members), so
any server computes every partition's owner from the members it watches.
A partition is owned by whoever holds its lock (``coordination/locks.py``).

Sharing out is sticky (like Kafka's cooperative rebalancing, not kazoo's
``SetPartitioner``, which gives back every lock on any change): once the
party has been unchanged for ``time_boundary``, each server gives back only
the partitions dealt to others and takes those dealt to it; a partition it
keeps is never released, so its in-memory state (group leases, timers,
writers) stays, and the survivor of a failover only gains. The loop::

    party changed -> wait until it is stable for time_boundary
    stable -> give back what is no longer ours (fenced first), take what is
              newly ours (a partition still held elsewhere is tried again
              next turn, a tenth of a second later)
    session expired (LOST) -> every partition is given up at once; a new
              session joins the party again and takes its share anew

So a dead server's partitions move when its session expires (its party
node and locks are ephemeral), and a joining server takes its share.

Lease: a server should stop accepting puts before anyone else can take its
partitions, which they can only do once ZooKeeper *expires* its session, a
full session timeout after its last heartbeat. Two guards:

* a lease: ``owns()`` is true only within ``session_timeout / 3`` of the
  last successful ZooKeeper round trip (monotonic clock), and only in the
  session that took the locks. A server that was paused (GC, SIGSTOP, a
  frozen VM) refuses new puts the moment it resumes, before it has even
  heard that its session is gone;
* kazoo's SUSPENDED/LOST: ``owns()`` is false from that moment. A
  suspended connection keeps its partitions (the session, and so its locks,
  may live on: if it reconnects in time nothing moved); a lost session
  gives them all up.

These refuse new calls; they cannot stop a put that was already past its
ownership check when the server paused. That one is stopped by the store:
every write carries the partition's fence, which the new owner bumped when
it took the partition (storage/fence.py, SPEC C10), so the late write is
refused and nothing of it is kept.

Queues: a server that creates or drops a queue bumps ``/queues-version``;
every server watches it (and re-reads the queue list every
``refresh_seconds`` for queues made by other means) and deals the new set.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.hosts import collect_hosts
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from ..errors import CoordinationError, InvalidArgument, NotPartitionOwner
from ..storage.fence import Token
from .base import Coordinator
from .locks import PartitionLocks
from .znodes import SessionNodes, secure

logger = logging.getLogger(__name__)

PARTITIONER_PATH = "/ownership"
PARTY_PATH = PARTITIONER_PATH + "/party"
LOCKS_PATH = PARTITIONER_PATH + "/locks"
VERSION_PATH = "/queues-version"
#: 16 random bytes, made by the first server on a new ZooKeeper: tells its fencing tokens from another's.
ENSEMBLE_PATH = "/ensemble"


#: A party node's name: ``<uuid hex>-<server id>@<host:port>`` (kazoo's ShallowParty's); group 1
#: is the member (the server's identifier).
_PARTY_NODE = re.compile(r"[0-9a-f]{32}-([^/]+@[^@/]+:[0-9]{1,5})")

#: The fewest characters of a ZooKeeper password (as of a metrics token).
MIN_PASSWORD = 16

#: The environment variable that gives ZooKeeper credentials, ``user:password`` (as ``--zk-auth``).
AUTH_ENV = "HQUEUE_ZK_AUTH"


def zookeeper_client(hosts: str, auth: str | None, timeout: float, root_ok: bool = False) -> KazooClient:
    """A kazoo client; with ``auth`` (``user:password``) it authenticates with ZooKeeper's
    digest scheme and creates every node under an ACL that grants that user
    everything and nobody else anything (so only servers and subscribers given the
    credential can read push keys or write registrations and presences).

    Raises:
        InvalidArgument: ``auth`` is not ``user:password``, or ``hosts`` has no chroot and
            ``root_ok`` is not said (see :func:`check_secured`).
    """
    if not auth:
        return KazooClient(hosts=hosts, timeout=timeout)
    user, password = check_secured(hosts, auth, root_ok)
    return KazooClient(
        hosts=hosts,
        timeout=timeout,
        auth_data=[("digest", auth)],
        default_acl=[make_digest_acl(user, password, all=True)],
    )


def check_credentials(auth: str) -> tuple[str, str]:
    """``user:password``'s user and password; InvalidArgument if it is not that, or its
    password is shorter than :data:`MIN_PASSWORD`."""
    user, colon, password = auth.partition(":")
    if not colon or not user or not password:
        raise InvalidArgument(
            f"ZooKeeper credentials are user:password (--zk-auth or ${AUTH_ENV}), got a value without ':'"
        )
    if len(password) < MIN_PASSWORD:
        raise InvalidArgument(
            f"a ZooKeeper password (--zk-auth or ${AUTH_ENV}) has at least {MIN_PASSWORD} characters, got "
            f"{len(password)}: ZooKeeper's ACL names it as an unsalted SHA-1 digest, so give it 128 random bits"
        )
    return user, password


def on_granted(client: KazooClient, granted: Callable[[float], None]) -> None:
    """Call ``granted(seconds)`` with each session's timeout as ZooKeeper granted it. kazoo
    keeps that to itself: its connection handler's connect step returns the read timeout it
    derives from it (two thirds of it, in ms). Without that step (another kazoo), nothing."""
    handler: Any = getattr(client, "_connection", None)
    connect = getattr(handler, "_connect", None)
    if connect is None:
        return

    def connected(*args: Any) -> Any:
        timeouts = connect(*args)
        try:
            granted(timeouts[0] * 1.5 / 1000.0)
        except Exception:  # (never in the way of the connection)
            logger.exception("the session timeout ZooKeeper granted could not be read")
        return timeouts

    handler._connect = connected


def start_client(client: KazooClient, timeout: float) -> None:
    """``client.start()``, without kazoo's warning that the chroot does not exist yet:
    hqueue makes it (a first start of a deployment warned for nothing)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No chroot path exists")
        client.start(timeout=timeout)


def check_secured(hosts: str, auth: str, root_ok: bool = False) -> tuple[str, str]:
    """:func:`check_credentials`, and a chroot in ``hosts``: without one hqueue's nodes sit
    under ZooKeeper's root, which its ACL cannot close (ZooKeeper checks a delete against the
    parent node's ACL, and ``/`` is open to every client). Anyone who reaches ZooKeeper could
    delete them: every queue create or delete then fails, and a new ensemble id planted there
    splits the servers' fence.

    Raises:
        InvalidArgument: bad credentials, or no chroot.
    """
    user, password = check_credentials(auth)
    if collect_hosts(hosts)[1] is None:
        if not root_ok:
            raise InvalidArgument(
                f"ZooKeeper credentials (--zk-auth or ${AUTH_ENV}) need a chroot in the ZooKeeper address "
                f"(e.g. {hosts.rstrip('/')}/hqueue): hqueue's nodes under ZooKeeper's root cannot be closed, since "
                "ZooKeeper checks a delete against the parent's ACL, and '/' is open to every client (a deployment "
                "from before this was required: --zk-root keeps them there; docs/security.md says how to move)"
            )
        logger.warning(
            "ZooKeeper %s has no chroot: hqueue's nodes under its root can be deleted by anyone who reaches it "
            "(--zk-root; docs/security.md says how to move them under a chroot)",
            hosts,
        )
    return user, password


def no_auth(client: KazooClient, hosts: str) -> str:
    """What a server refused by ZooKeeper's ACL says: give credentials, or the right ones."""
    if client.auth_data:
        return (
            f"ZooKeeper at {hosts} refused access (NoAuth) with the credentials given (--zk-auth or "
            f"${AUTH_ENV}): hqueue's nodes there are under an ACL for another password (a password change "
            "half done? see docs/security.md)"
        )
    return (
        f"ZooKeeper at {hosts} refused access (NoAuth): hqueue's nodes there are under an ACL; "
        f"give the credentials with --zk-auth or ${AUTH_ENV}"
    )


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
        time_boundary: How long the party must be unchanged before its
            partitions are shared out anew, seconds.
        refresh_seconds: How often the queue list is re-read from storage.
        auth: ZooKeeper credentials, ``user:password``: every node is created
            under their digest ACL (see :func:`zookeeper_client`).
        root_ok: With ``auth`` and no chroot in ``hosts``: keep the nodes under
            ZooKeeper's root (see :func:`check_secured`), warned of.
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
        root_ok: bool = False,
    ) -> None:
        super().__init__()
        self.address, self.hosts = address, hosts
        self.identifier = f"{server_id or address.replace(':', '_')}@{address}"
        if _PARTY_NODE.fullmatch(f"{'0' * 32}-{self.identifier}") is None:
            raise InvalidArgument(
                f"a server's id has no '/' and its address is host:port, got {server_id!r} at {address!r}"
            )
        self.time_boundary, self.refresh_seconds = time_boundary, refresh_seconds
        self.client = zookeeper_client(hosts, auth, session_timeout, root_ok)
        self.auth = auth
        self.client.add_listener(self._on_state)
        self._lock = threading.RLock()
        self._owned: frozenset[str] = frozenset()
        #: Our locks, with each one's czxid: the partition's fencing token.
        self._locks = PartitionLocks(self.client, LOCKS_PATH)
        #: The ZooKeeper session our party node and locks belong to.
        self._session: int | None = None
        self._connected = False
        self.ensemble = b""
        self._items: frozenset[str] = frozenset()
        self._owners: dict[str, str] = {}
        self._members: list[str] = []
        self._members_since = 0.0
        #: The party's nodes as the watch last saw them, not yet read by the loop (None: read).
        self._party: list[str] | None = None
        #: Which party nodes are sessions' (a planted persistent one is not a member).
        self._sessions = SessionNodes(self.client)
        #: Party nodes not named as a member's, warned of (once).
        self._misnamed: set[str] = set()
        #: Our own party node (re-made if it goes while our session lives).
        self._party_node = ""
        self._wake = threading.Event()
        self._stopping = threading.Event()
        #: The session's timeout as asked, then as ZooKeeper granted it (see :func:`on_granted`).
        self.session_timeout = session_timeout
        self.lease_seconds = session_timeout / 3
        on_granted(self.client, self._granted)
        self._lease_until = 0.0
        self._queues: Callable[[], Iterable[tuple[str, int]]] = lambda: ()
        self._thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------

    def start(self, queues: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._queues = queues
        wait = max(15.0, self.client._session_timeout / 1000)
        try:
            start_client(self.client, wait)
            # (a connection lost meanwhile, as on a loaded machine, is made again by kazoo: the
            # steps are tried again, until ``wait``; one such blip ended the server)
            KazooRetry(max_tries=-1, max_delay=1.0, deadline=wait, ignore_expire=True)(self._prepare)
            self.client.DataWatch(VERSION_PATH, lambda data, stat: self._wake.set())
            self.client.ChildrenWatch(PARTY_PATH, self._on_members)
        except NoAuthError as e:
            raise CoordinationError(no_auth(self.client, self.hosts)) from e
        except (KazooTimeoutError, KazooException) as e:
            raise CoordinationError(f"cannot reach ZooKeeper at {self.hosts}: {type(e).__name__} {e}") from e
        self._thread = threading.Thread(target=self._run, name="hqueue-ownership", daemon=True)
        self._thread.start()

    def _prepare(self) -> None:
        """hqueue's nodes, closed to all but the servers (with ``auth``), and the ensemble's id."""
        self.client.ensure_path(VERSION_PATH)
        self.client.ensure_path(PARTY_PATH)
        self.client.ensure_path(LOCKS_PATH)
        secure(self.client, [VERSION_PATH, ENSEMBLE_PATH, PARTITIONER_PATH, "/subscriptions"])
        self.ensemble = self._ensemble()

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
        """Stop writing, then close the session: its party node and locks go with it."""
        self._stopping.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._set_owned(frozenset())
        self.client.stop()
        self.client.close()

    # -- the fence and the membership watch ---------------------------------------

    def _on_state(self, state: str) -> None:
        """On kazoo's connection thread: only note it (the loop acts), never block."""
        self._connected = state == KazooState.CONNECTED
        if self._stopping.is_set():
            pass
        elif state == KazooState.SUSPENDED:
            logger.warning("ZooKeeper connection suspended: refusing puts until it is back (partitions kept)")
        elif state == KazooState.LOST:
            logger.warning("ZooKeeper session lost: refusing puts; its partitions are given up")
        self._wake.set()

    def _on_members(self, children: list[str]) -> None:
        """On kazoo's watch thread: note the party's nodes; the loop reads them (:meth:`_read_party`)."""
        with self._lock:
            self._party = list(children)
        self._wake.set()

    def _read_party(self) -> None:
        """The members, from the party's nodes the watch saw: only a session's node
        (ephemeral) with a member's name counts. A planted one (persistent, or named
        otherwise) would be dealt partitions it never takes, and clients sent to it."""
        with self._lock:
            children, self._party = self._party, None
        if children is None:
            return
        try:
            members = self._members_of(children)
        except BaseException:
            with self._lock:  # (read again next turn, unless the watch saw newer)
                if self._party is None:
                    self._party = children
            raise
        with self._lock:
            if sorted(members) != self._members:
                self._members, self._members_since = sorted(members), time.monotonic()
            self._owners = deal(self._members, self._items)

    def _members_of(self, children: list[str]) -> set[str]:
        members = set()
        for child in children:
            named = _PARTY_NODE.fullmatch(child)
            if named is None:
                # (a session's is ignored; a persistent one is deleted, as any planted where
                # only sessions make nodes: it was left in place, warned of as ignored)
                if child not in self._misnamed and self._sessions.check(f"{PARTY_PATH}/{child}"):
                    logger.warning("ZooKeeper party node %s/%s is not a server's name: ignored", PARTY_PATH, child)
                    self._misnamed.add(child)
            elif self._sessions.check(f"{PARTY_PATH}/{child}"):
                members.add(named[1])
        self._misnamed &= set(children)
        return members

    def _granted(self, seconds: float) -> None:
        """ZooKeeper granted a session of ``seconds``: the lease is a third of it. It bounds
        what is asked to between 2 and 20 of its ticks, silently: a lease taken from a longer
        timeout asked than granted outlived the session (the store's fence still refused the
        writes of a server paused past it)."""
        if abs(seconds - self.session_timeout) > 0.05 and abs(seconds - self.lease_seconds * 3) > 0.05:
            logger.warning(
                "ZooKeeper granted a session of %.1fs where %.1fs was asked (--session-timeout; ZooKeeper bounds "
                "it to between 2 and 20 of its ticks): a dead server's partitions move after %.1fs",
                seconds, self.session_timeout, seconds,
            )  # fmt: skip
        self.lease_seconds = seconds / 3

    def _session_now(self) -> int | None:
        client_id = self.client.client_id  # None unless connected
        return client_id[0] if client_id else None

    # -- the loop sharing the partitions out --------------------------------------------

    def _run(self) -> None:
        version, next_refresh = None, 0.0
        while not self._stopping.is_set():
            pause = min(0.5, self.lease_seconds / 3)
            try:
                asked = time.monotonic()
                current = self.client.exists(VERSION_PATH)
                if self.client.state == KazooState.CONNECTED:
                    self._lease_until = asked + self.lease_seconds  # from when we asked, not answered
                now = time.monotonic()
                if current is None or current.version != version or now >= next_refresh:
                    version, next_refresh = current.version if current else None, now + self.refresh_seconds
                    self._refresh_items()
                self._read_party()
                pause = min(pause, self._step())
            except (KazooException, KazooTimeoutError):
                logger.info("ZooKeeper unavailable; retrying", exc_info=True)
            except Exception:  # one bad turn never kills ownership
                logger.exception("ownership loop failed; retrying")
            self._wake.wait(max(0.01, pause))
            self._wake.clear()

    def _refresh_items(self) -> None:
        items = frozenset(item(q, p) for q, n in self._queues() for p in range(n))
        with self._lock:
            if items != self._items:
                self._items = items
                self._owners = deal(self._members, items)

    def _step(self) -> float:
        """One turn of sharing out; the seconds before the next turn is due."""
        session = self._session_now()
        if session is None:
            return 0.5  # suspended: what we hold waits for the session to come back, or to end
        if session != self._session:
            self._join(session)
        with self._lock:
            members, since, items = self._members, self._members_since, self._items
        if not self.client.exists(self._party_node) and not self._join_again():
            return 1.0  # locked out: nothing held
        if self.identifier not in members:
            return 0.1  # our party node is not in the watch's view yet
        settling = since + self.time_boundary - time.monotonic()
        if settling > 0:
            return settling
        mine = {it for it, member in deal(members, items).items() if member == self.identifier}
        going = set(self._locks.held) - mine
        if going:
            self._releasing({parse_item(it) for it in going})  # held still: a last write may land
            self._set_owned(self._owned - going)  # refuse first, then let the new owner in
            for it in sorted(going):
                self._one_lock(self._locks.give_back, it)
        for it in sorted(mine - set(self._locks.held)):
            self._one_lock(self._locks.take, it)
        self._set_owned(frozenset(self._locks.held))
        return 0.1 if mine - set(self._locks.held) else 0.5

    def _join_again(self) -> bool:
        """Our party node was deleted while our session lives (by hand, or by the first
        server started with --zk-auth: it deletes nodes made without the credential): make
        it again. False if ZooKeeper's nodes are closed to this server now: then our locks
        may be another's, and it holds nothing (it went on owning what another then took)."""
        try:
            gone, self._party_node = (
                self._party_node,
                self.client.create(f"{PARTY_PATH}/{uuid.uuid4().hex}-{self.identifier}", ephemeral=True),
            )
            logger.warning("%s: our party node %s was deleted: joined again", self.address, gone)
            return True
        except NoAuthError:
            if self._owned or self._locks.held:
                logger.error(
                    "%s: ZooKeeper's nodes are closed to this server (NoAuth: start it with --zk-auth): "
                    "giving up %d partition(s)", self.address, len(self._owned),
                )  # fmt: skip
            self._set_owned(frozenset())
            self._locks.forget()
            return False

    def _one_lock(self, act: Callable[[str], object], it: str) -> None:
        """Take or give back one partition's lock: one that fails for a node (made by hand, or
        refused) is tried again next turn, and stops no other; ZooKeeper away ends the turn."""
        try:
            act(it)
        except (KazooTimeoutError, ConnectionLoss, SessionExpiredError, OperationTimeoutError):
            raise  # ZooKeeper away: the turn ends (the loop logs it once)
        except KazooException as e:
            logger.warning("%s: partition %s: %s; trying again", self.address, it, e)

    def _join(self, session: int) -> None:
        """A new session (the first, or one after ours expired): the old one's locks and
        party node are gone, so its partitions are given up; join the party again."""
        if self._owned or self._locks.held:
            logger.warning("%s: ZooKeeper session expired; giving up %d partition(s)", self.address, len(self._owned))
        self._set_owned(frozenset())
        self._locks.forget()
        self._party_node = self.client.create(f"{PARTY_PATH}/{uuid.uuid4().hex}-{self.identifier}", ephemeral=True)
        self._session = session

    def token(self, queue: str, partition_id: int) -> Token | None:
        """The czxid of our lock node (coordination/locks.py): it only grows from one owner to the next."""
        found = self._locks.held.get(item(queue, partition_id))
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
        return (
            item(queue, partition_id) in self._owned
            and self._connected
            and self._session_now() == self._session
            and time.monotonic() < self._lease_until
        )

    def owner(self, queue: str, partition_id: int) -> str | None:
        """This server if it owns the partition now; None if it is dealt to this server
        but not (or no longer, or not yet) held; else the member it is dealt to."""
        if self.owns(queue, partition_id):
            return self.address
        member = self._owners.get(item(queue, partition_id))
        return member.rsplit("@", 1)[1] if member and member != self.identifier else None

    def queues_changed(self) -> None:
        try:
            self.client.set(VERSION_PATH, b"")
        except KazooException as e:
            raise CoordinationError(f"cannot announce a queue change in ZooKeeper: {e}") from e
