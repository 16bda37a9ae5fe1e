"""Registrations in ZooKeeper (SPEC C7).

Layout, under the servers' chroot::

    /subscriptions/<queue>/subscribers/<name>           persistent: topics, partitions, checkpoints (JSON)
    /subscriptions/<queue>/subscribers/<name>/presence  ephemeral (a server's session): the subscriber's
                                                        address, topics, push key, last heartbeat (JSON)

A subscriber never speaks to ZooKeeper: it heartbeats a server every
second (the Thrift port, its token: the same calls as without ZooKeeper),
and the server that gets the heartbeats writes its presence, checked (the
push policy), under its own session; it counts as gone
``presence_timeout`` seconds after the last heartbeat any server wrote, or
at once when that server's session ends (the next heartbeat, at another
server, writes it again). With ``--zk-auth`` every node is created under
the servers' digest ACL (coordination/zookeeper.py): only the servers read
a push key or write a presence.

Subscribers of older versions announced themselves with their own session
(``address``, ``topics`` and ``push`` nodes, the servers' credential): those
are still read, and :class:`ZooKeeperPresence` still writes them for a
subscriber of this version whose server is older (it names ZooKeeper in
``getCoordination``).

Servers watch the tree with kazoo ChildrenWatches and reconcile their
workers on every change. Checkpoints are merged with a versioned
compare-and-set, retried on conflict (kazoo's ``recipe/counter.py`` way),
since every server writes the checkpoints of the partitions it owns.

"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch
from kazoo.retry import ForceRetryError

from ..auth import PushCredentials
from ..coordination.zookeeper import no_auth, start_client, zookeeper_client
from ..errors import CoordinationError, SubscriberActive, SubscriberExists, SubscriberNotFound
from .registry import PresenceChanges, Registration, SubscriberRegistry, decode_topics, encode_topics, read_json
from .store_registry import Presence

logger = logging.getLogger(__name__)

ROOT = "/subscriptions"


def _queue_and_name(path: str) -> tuple[str, str]:
    """A registration's queue and name, from its path (:func:`registration_path`)."""
    parts = path.split("/")
    return (parts[2], parts[4]) if len(parts) > 4 else ("", "")


def registration_path(queue: str, name: str) -> str:
    return f"{ROOT}/{queue}/subscribers/{name}"


def presence_path(queue: str, name: str) -> str:
    return registration_path(queue, name) + "/presence"


#: Seconds a registration's children, as its watch saw them, are trusted to say it is away (not
#: read when reconciling); then it is read once, and trusted again.
CHILDREN_TRUSTED = 30.0

#: Seconds a presence node may go unchanged (no heartbeat rewrote it), timed by each server's
#: own monotonic clock, before its subscriber counts as gone.
PRESENCE_TIMEOUT = 10.0


class ZooKeeperRegistry(SubscriberRegistry):
    """Registrations and presence in ZooKeeper, for the servers.

    Args:
        client: A started kazoo client (the server shares its coordinator's).
        hosts: Its connect string (with chroot).
        presence_timeout: Seconds without a heartbeat before a subscriber counts as gone.
    """

    def __init__(self, client: KazooClient, hosts: str, presence_timeout: float = PRESENCE_TIMEOUT) -> None:
        super().__init__()
        self.client, self.hosts, self.presence_timeout = client, hosts, presence_timeout
        #: Presences load() found lapsed, with their nodes' versions: attached() deletes them
        #: (one rewritten since has another version, and stays).
        self._lapsed: dict[tuple[str, str], int] = {}
        #: Per presence, its node's last change (mzxid) this server saw, and when (monotonic).
        self._changes: dict[tuple[str, str], tuple[int, float]] = {}
        #: Per presence, when this server last wrote it (monotonic).
        self._written: dict[tuple[str, str], float] = {}
        #: Per presence, when this server last made, ended, moved it or changed its topics.
        self._changes_made = PresenceChanges()
        #: Watched paths, and their watches (None while one is being set).
        self._watched: dict[str, ChildrenWatch | None] = {}
        #: Per registration, its children as its watch last saw them, and when (monotonic): one
        #: with no presence (nor an older subscriber's address) is not read when reconciling,
        #: unless that was over :data:`CHILDREN_TRUSTED` seconds ago (a watch can end unseen).
        self._children: dict[tuple[str, str], tuple[frozenset[str], float]] = {}
        self._lock = threading.Lock()
        client.ensure_path(ROOT)
        self._watch(ROOT, self._on_queues)

    # -- watches ----------------------------------------------------------------------

    def _watch(self, path: str, on_children: Callable[[str, list[str]], None]) -> None:
        """Watch ``path``'s children, unless a watch of it runs (kazoo's ends, unseen, when it
        meets the node deleted: one deleted and made again between two reads gets a new one)."""
        with self._lock:
            if path in self._watched:
                running = self._watched[path]
                if running is None or not running._stopped:
                    return
                self._end(running)
                self._children.pop(_queue_and_name(path), None)
            self._watched[path] = None

        def changed(children: list[str]) -> None:
            on_children(path, children)
            self.changed()

        try:
            watch = self.client.ChildrenWatch(path, changed)  # (a node not there: a watch stopped)
        except BaseException:
            with self._lock:
                self._watched.pop(path, None)
            raise
        with self._lock:
            if path in self._watched and not watch._stopped:
                self._watched[path] = watch
            else:  # (deleted meanwhile: the next look at its parent watches it again, if made again)
                self._watched.pop(path, None)
                self._end(watch)

    def _end(self, watch: ChildrenWatch | None) -> None:
        """Forget a watch that stopped (kazoo keeps its session listener until told)."""
        if watch is not None:
            self.client.remove_listener(watch._session_watcher)

    def _forget_watches(self, parent: str, children: list[str]) -> None:
        # A watch ends when its node is deleted; let a re-created node be watched again.
        with self._lock:
            gone = {
                p
                for p in self._watched
                if p.startswith(parent + "/") and p[len(parent) + 1 :].split("/")[0] not in children
            }
            for path in gone:
                self._end(self._watched.pop(path, None))
                self._children.pop(_queue_and_name(path), None)

    def _on_queues(self, path: str, queues: list[str]) -> None:
        self._forget_watches(path, queues)
        for queue in queues:
            self._watch(f"{ROOT}/{queue}/subscribers", self._on_names)

    def _on_names(self, path: str, names: list[str]) -> None:
        self._forget_watches(path, names)
        for name in names:
            self._watch(f"{path}/{name}", self._on_presence)  # its presence comes and goes

    def _on_presence(self, path: str, children: list[str]) -> None:
        with self._lock:
            self._children[_queue_and_name(path)] = frozenset(children), time.monotonic()

    # -- registrations -----------------------------------------------------------------

    def _stored(self, queue: str, name: str) -> tuple[Registration, int]:
        try:
            data, stat = self.client.get(registration_path(queue, name))
        except NoNodeError:
            raise SubscriberNotFound(name, queue) from None
        return Registration.from_json(queue, name, data), stat.version

    def create(self, registration: Registration) -> None:
        try:
            self.client.create(
                registration_path(registration.queue, registration.name), registration.to_json(), makepath=True
            )
        except NodeExistsError:
            raise SubscriberExists(f"subscriber {registration.name!r} exists on {registration.queue!r}") from None
        except KazooException as e:
            raise CoordinationError(f"cannot register {registration.name!r}: {e}") from e

    def load(self, queue: str, name: str) -> Registration:
        registration, _ = self._stored(queue, name)
        try:
            presence, stat = self._read_presence(queue, name)
            if stat is not None:
                if presence is None or not self._live(queue, name, stat):
                    self._lapsed[(queue, name)] = stat.version  # attached() deletes it
                    return registration  # its heartbeats stopped, or a malformed one: never pushed to
                # (its address is pushed to once approved: the heartbeat's server approved it)
                return replace(registration, address=presence.address, live_topics=presence.topics, push=presence.push)
            return self._announced_by_itself(registration)
        except NoAuthError:  # a node only someone else may read (written by hand): none
            logger.warning("the presence of subscriber %s on %s is not readable by the servers: ignored", name, queue)
            return registration

    def _read_presence(self, queue: str, name: str) -> tuple[Presence | None, ZnodeStat | None]:
        """The presence a server wrote, and its node's stat (None, None: no node; None and a
        stat: a malformed one, never pushed to)."""
        try:
            raw, stat = self.client.get(presence_path(queue, name))
        except NoNodeError:
            self._changes.pop((queue, name), None)
            self._written.pop((queue, name), None)
            return None, None
        try:
            data = read_json(raw)
            push = PushCredentials.from_json(data["push"])
            if push is None or not isinstance(data["address"], str):
                raise ValueError(data)
            if not stat.ephemeralOwner:  # (servers write presences ephemeral: a planted one)
                raise ValueError("a persistent presence")
            # (seen: the node's last write, by ZooKeeper's clock; liveness is _live's)
            return Presence(data["address"], decode_topics(data["topics"]), push, stat.mtime / 1000), stat
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning("malformed presence of subscriber %s on %s", name, queue)
            return None, stat

    def _live(self, queue: str, name: str, stat: ZnodeStat) -> bool:
        """Whether the presence node changed (a heartbeat rewrote it) within ``presence_timeout``,
        by this server's own monotonic clock: no server's wall clock is compared with another's."""
        key, now = (queue, name), time.monotonic()
        mark = self._changes.get(key)
        if mark is None or mark[0] != stat.mzxid:
            self._changes[key] = (stat.mzxid, now)
            return True
        return now - mark[1] < self.presence_timeout

    def _announced_by_itself(self, registration: Registration) -> Registration:
        """The presence an older subscriber wrote with its own session (ZooKeeperPresence)."""
        path = registration_path(registration.queue, registration.name)
        try:
            address, stat = self.client.get(path + "/address")
            topics = decode_topics(read_json(self.client.get(path + "/topics")[0]))
            push = PushCredentials.from_json(read_json(self.client.get(path + "/push")[0]))
            if push is None:
                raise ValueError("no push key")
            if not stat.ephemeralOwner:  # (its session's, as the subscriber made it: a planted one)
                raise ValueError("a persistent address node")
        except NoNodeError:
            return registration
        except (ValueError, TypeError, AttributeError, KeyError):  # malformed: none, never pushed to
            logger.warning("malformed presence of subscriber %s on %s", registration.name, registration.queue)
            return registration
        return replace(registration, address=address.decode(), live_topics=topics, push=push)

    def heartbeat(
        self, queue: str, name: str, address: str, topics: frozenset[bytes] | None, push: PushCredentials
    ) -> None:
        """Write the presence (the caller checked ``address``): created under this server's
        session, then rewritten every ``presence_timeout / 3`` (by whichever server the
        heartbeats reach: one that keeps changing does not make it flap).

        A live presence with another address or key is another instance's: SubscriberActive.
        """
        try:
            approved = self._stored(queue, name)[0].approved
            path, key, now = presence_path(queue, name), (queue, name), time.monotonic()
            data = json.dumps(
                {"address": address, "topics": encode_topics(topics), "push": push.to_json(), "at": time.time()}
            ).encode()
            held, stat = self._read_presence(queue, name)
            if stat is not None:
                live = self._live(queue, name, stat)
                same = held is not None and held.push == push  # (its key is the instance: it may move)
                if held is not None and not same and live:
                    raise SubscriberActive(
                        f"subscriber {name!r} on {queue!r} is attached at {held.address}; a second instance is "
                        f"refused (if that one died, its presence lapses within {self.presence_timeout:g}s)"
                    )
                if same and live:
                    assert held is not None
                    changed = held.topics != topics or held.address != address
                    if changed:  # at most one a second (each makes every server reconcile)
                        self._changes_made.check(key, now)
                        self._changes_made.made(key, now)
                    if address not in approved:  # (an older server wrote its name; or it moved)
                        self.approve(queue, name, address)
                    if changed or now - self._written.get(key, 0.0) >= self.presence_timeout / 3:
                        self.client.set(path, data, version=stat.version)
                        self._written[key] = now
                        if changed:
                            self.changed()
                    return
                self._changes_made.check(key, now)
                self.client.delete(path, version=stat.version)  # lapsed, or malformed
            self._changes_made.check(key, now)
            if address not in approved:  # (once it may go in: a refused heartbeat writes nothing)
                # Recorded where only servers write (with --zk-auth): a presence written into
                # ZooKeeper by hand, with an address no server checked, gets no pushes.
                self.approve(queue, name, address)
            self.client.create(path, data, ephemeral=True)
            self._written[key] = now
            with self._lock:  # (this server's reconciling sees it at once, not when its watch does)
                seen = self._children.get(key)
                if seen is not None:
                    self._children[key] = seen[0] | {"presence"}, now
            self._changes_made.made(key, now)
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise SubscriberActive(
                f"the presence of subscriber {name!r} on {queue!r} changed meanwhile (another instance, or another "
                "server): try again"
            ) from None
        except NoAuthError:
            raise CoordinationError(f"the presence of {name!r} on {queue!r} is not the servers' to write") from None
        except KazooException as e:
            raise CoordinationError(f"cannot write the presence of {name!r} on {queue!r}: {e}") from e

    def leave(self, queue: str, name: str, push: PushCredentials | None = None) -> None:
        self._stored(queue, name)
        try:
            held, stat = self._read_presence(queue, name)
            if stat is None or (push is not None and held is not None and held.push != push):
                return  # none, or another instance's now
            self._changes_made.made((queue, name), time.monotonic())
            self.client.delete(presence_path(queue, name), version=stat.version)
        except (NoNodeError, BadVersionError):
            pass
        except KazooException as e:
            raise CoordinationError(f"cannot end the presence of {name!r} on {queue!r}: {e}") from e

    def _forget_lapsed(self, queue: str, name: str, version: int) -> None:
        """Delete a presence whose heartbeats stopped, or a malformed one, as load() read it
        (watchers see it go)."""
        try:
            self.client.delete(presence_path(queue, name), version=version)
        except (NoNodeError, BadVersionError):
            pass
        except KazooException:
            logger.warning("could not delete the lapsed presence of %s on %s", name, queue, exc_info=True)

    def update(self, queue: str, name: str, change: Callable[[Registration], Registration]) -> Registration:
        def attempt() -> Registration:
            registration, version = self._stored(queue, name)
            changed = change(registration)
            try:
                self.client.set(registration_path(queue, name), changed.to_json(), version=version)
            except BadVersionError:
                raise ForceRetryError() from None  # another server wrote meanwhile: read again
            return changed

        try:
            return self.client.retry(attempt)
        except KazooException as e:
            raise CoordinationError(f"cannot update subscriber {name!r} on {queue!r}: {e}") from e

    def remove(self, queue: str, name: str) -> None:
        path = registration_path(queue, name)
        try:  # (kazoo's recursive delete of a missing node returns quietly: an unknown name "was deleted")
            if self.client.exists(path) is None:
                raise SubscriberNotFound(name, queue)
            self.client.delete(path, recursive=True)
        except NoNodeError:
            raise SubscriberNotFound(name, queue) from None

    def names(self, queue: str) -> list[str]:
        try:
            return sorted(self.client.get_children(f"{ROOT}/{queue}/subscribers"))
        except NoNodeError:
            return []
        except NoAuthError:  # made unreadable by hand: no subscriber of it is served
            logger.warning("the subscribers of %s are not readable by the servers", queue)
            return []

    def attached(self) -> list[Registration]:
        found, now = [], time.monotonic()
        for queue in self.client.get_children(ROOT):
            for name in self.names(queue):
                seen = self._children.get((queue, name))
                if seen is not None and not seen[0] & {"presence", "address"}:
                    if now - seen[1] < CHILDREN_TRUSTED:
                        continue  # (away: nothing to read)
                    with self._lock:  # (read it, then trust it again: unless its watch saw more since)
                        if self._children.get((queue, name)) is seen:
                            self._children[(queue, name)] = seen[0], now
                try:
                    registration = self.load(queue, name)
                except SubscriberNotFound:
                    continue  # deleted meanwhile
                except (NoAuthError, ValueError, TypeError, KeyError, AttributeError):
                    # one registration made unreadable or malformed by hand: the others go on
                    logger.warning("subscriber %s on %s is unreadable or malformed: skipped", name, queue)
                    continue
                if registration.attached:
                    found.append(registration)
        self._changes_made.prune(time.monotonic())
        lapsed, self._lapsed = self._lapsed, {}
        for (queue, name), version in lapsed.items():
            self._forget_lapsed(queue, name, version)
        return found


class ZooKeeperPresence:
    """The subscriber's own ephemeral ``address``, ``topics`` and ``push`` nodes: how it
    announces itself to a server older than this version, which names ZooKeeper in
    ``getCoordination`` (newer ones take heartbeats and write the presence themselves)."""

    def __init__(
        self,
        hosts: str,
        queue: str,
        name: str,
        address: str,
        topics: frozenset[bytes] | None,
        push: PushCredentials,
        auth: str | None = None,
    ) -> None:
        self.path = registration_path(queue, name)
        self.address, self.topics, self.push, self.hosts = address, topics, push, hosts
        self.client = zookeeper_client(hosts, auth, timeout=10.0)
        self._stopping = False
        self.client.add_listener(self._on_state)

    def start(self) -> None:
        try:
            start_client(self.client, 15)
        except Exception as e:
            raise CoordinationError(f"cannot reach ZooKeeper at {self.hosts}: {e}") from e
        try:
            self._announce()
        except NoAuthError as e:
            self.stop()
            raise CoordinationError(no_auth(self.client, self.hosts)) from e

    def _announce(self) -> None:
        """Create the presence's ephemeral nodes under this session, address last.

        A node held by another session (a live instance, or a dead one whose session has
        not expired yet) refuses this one with SubscriberActive: taking its node over would
        lose it when that session ends. A node gone while read is looked at again.
        """
        if not self.client.exists(self.path):
            raise CoordinationError(f"{self.path} does not exist: register the subscriber first (add_subscriber)")
        self._refuse_if_held("address")
        for child, data in (  # address last: servers read a presence once its address exists
            ("topics", json.dumps(encode_topics(self.topics)).encode()),
            ("push", json.dumps(self.push.to_json()).encode()),
            ("address", self.address.encode()),
        ):
            node = f"{self.path}/{child}"
            while True:
                try:
                    self.client.create(node, data, ephemeral=True)
                    break
                except NodeExistsError:
                    if self._refuse_if_held(child):
                        self.client.set(node, data)  # ours already (an announce tried again)
                        break

    def _refuse_if_held(self, child: str) -> bool:
        """Raise SubscriberActive if another session holds ``child``; True if this one does,
        False if there is no such node."""
        node = f"{self.path}/{child}"
        stat = self.client.exists(node)
        if stat is None:
            return False
        if stat.ephemeralOwner == self.client.client_id[0]:
            return True
        try:
            holder = self.client.get(f"{self.path}/address")[0].decode("utf-8", "replace")
        except NoNodeError:
            holder = "an address no longer announced"  # that session is ending
        raise SubscriberActive(
            f"subscriber {self.path} is attached at {holder} (a live ZooKeeper session); a second instance "
            "is refused (if that one died, its session expires within the session timeout)"
        )

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST and not self._stopping:
            # The ephemeral nodes died with the session: announce again once reconnected.
            threading.Thread(target=self._reannounce, daemon=True).start()

    def _reannounce(self) -> None:
        try:
            self.client.retry(self._announce)
        except Exception:
            logger.exception("could not announce %s again after a session loss", self.path)

    def stop(self) -> None:
        self._stopping = True
        try:
            self.client.stop()  # the ephemeral nodes go with the session
        finally:
            self.client.close()
