"""Who may do what on an hqueue server: tokens, roles and queue patterns.

A server started with ``--auth-file FILE`` serves only connections that
authenticate with a token from the file; each token grants roles on the
queues that match its patterns (shell-style, as in :mod:`fnmatch`)::

    # hqueue auth file (TOML)
    [tokens.ops]
    secret = "long random text"        # or secret_sha256 = "<hex digest>"
    admin = ["*"]

    [tokens.crawler]
    secret_sha256 = "9f86d08…"
    producer = ["crawl.*"]
    consumer = ["crawl.*"]
    groups = ["crawler-*"]             # consumer groups and subscribers it manages

    [tokens.prometheus]
    secret = "another long random text"
    metrics = ["*"]

Roles:

* ``consumer``: scan, see the queue, open consumer groups and take part in
  them (receive, ack, nack, dead-letter, leave), list and describe groups
  and subscribers;
* ``producer``: put, see the queue;
* ``admin``: everything, including create, truncate, disable, enable, drop;
* ``metrics``: read ``/metrics`` (``--metrics-port``) with the token as a bearer
  token (``Authorization: Bearer <secret>``). The endpoint shows every queue's
  series, so the role takes ``["*"]`` only; it grants nothing on the Thrift port.
  An ``admin = ["*"]`` token may read ``/metrics`` too.

Names (``groups``): the calls that move or delete a consumer group's or a
subscriber's position act on someone's progress, so a queue role is not
enough for them. They need ``admin`` on the queue, or ``consumer`` on it and
a ``groups`` pattern (shell-style, as for queues) matching the group's or
subscriber's name; one list covers both kinds of name. These calls are:

* ``setGroupPosition`` (replay or skip) and ``deleteGroup``;
* ``addSubscriber``, ``setCheckpoint`` and ``deleteSubscriber``, and running
  a subscriber through the server (``subscriberHeartbeat``,
  ``subscriberLeave``): a :class:`~hqueue.Subscriber` needs its name granted.

A token without a ``groups`` key manages no name: with ``consumer`` it still
receives and acks in any group of its queues, but moving or deleting a
group, and adding or running a subscriber, need ``admin`` (auth files
written before ``groups`` existed read as before, with that narrower right).
A refusal is :class:`~hqueue.errors.NotAuthorized` (``TNotAuthorized`` on
the wire) naming the token, the call, the group or subscriber and the role
needed.

Without an auth file, every connection may do everything (a server on a
trusted network, as ZooKeeper and HBase are by default). ``/metrics`` then
takes ``--metrics-token`` if one is given, else every request (it listens on
127.0.0.1 unless ``--metrics-host`` says otherwise). With an auth file it
always needs a credential: a token holding ``metrics``, or ``--metrics-token``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import stat
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from .errors import InvalidArgument, NotAuthorized


def split_credentials(url: str) -> tuple[str, str | None]:
    """(the URL without its token, the token or None): ``hqueue://T@h:1?tls=1`` ->
    (``hqueue://h:1?tls=1``, ``T``). Other URLs carry no credentials."""
    if not url.startswith("hqueue://"):
        return url, None
    rest, mark, query = url[len("hqueue://") :].partition("?")
    token, at, hosts = rest.rpartition("@")
    return "hqueue://" + hosts + mark + query, urllib.parse.unquote(token) if at else None


#: Roles on queues (Thrift calls).
ROLES = ("consumer", "producer", "admin")
#: The role that reads /metrics.
METRICS = "metrics"


#: The web console's audit log (console/audit.py): who did which admin action. Writing it
#: (put, schedule or cancel timers: the producer role) needs admin on it, so no token that
#: may merely put to every queue (``producer = ["*"]``) can forge an entry the console shows.
AUDIT_QUEUE = "hqueue-console-audit"
#: Queues whose producer role needs admin.
ADMIN_WRITTEN = frozenset({AUDIT_QUEUE})

#: A call on a consumer group's or subscriber's position: admin, or consumer and the name granted.
MANAGE = "manage"
#: Answers of :meth:`Principal.may` kept per token.
_MAY_CACHE = 4096


class Principal:
    """What one token may do.

    Args:
        name: The token's name in the auth file.
        grants: Queue patterns per role.
        names: Patterns of the consumer groups and subscribers it manages.
    """

    def __init__(self, name: str, grants: Mapping[str, tuple[str, ...]], names: Iterable[str] = ()) -> None:
        self.name = name
        self.grants = dict(grants)
        self.names = tuple(names)
        self._may: dict[tuple[str, str], bool] = {}

    def may(self, role: str, queue: str) -> bool:
        """Whether the token holds ``role`` (or admin) on ``queue``.

        Answers are kept (a call checks one on every call: the patterns are
        matched once per role and queue), at most ``_MAY_CACHE`` of them.
        """
        if role == "producer" and queue in ADMIN_WRITTEN:
            role = "admin"
        key = (role, queue)
        answer = self._may.get(key)
        if answer is None:
            answer = any(
                fnmatch.fnmatchcase(queue, pattern)
                for held in ((role, "admin") if role != "admin" else ("admin",))
                for pattern in self.grants.get(held, ())
            )
            if len(self._may) >= _MAY_CACHE:  # names a client makes up do not grow it without bound
                self._may.clear()
            self._may[key] = answer
        return answer

    def may_call(self) -> bool:
        """Whether the token holds a role on some queue: anything to do on the Thrift port."""
        return any(self.grants.get(role) for role in ROLES)

    def may_read_metrics(self) -> bool:
        """A metrics token, or an admin of every queue: ``admin = ["*"]`` itself (matching the
        name ``*`` is no such grant: ``["?"]`` or ``["[!b]*"]`` saw every queue's series)."""
        return bool(self.grants.get(METRICS)) or "*" in self.grants.get("admin", ())

    def may_see(self, queue: str) -> bool:
        return any(self.may(role, queue) for role in ROLES)

    def require(self, role: str, queue: str, action: str) -> None:
        if not self.may(role, queue):
            needed = "admin" if role == "producer" and queue in ADMIN_WRITTEN else role  # (as may() asks)
            raise NotAuthorized(f"token {self.name!r} may not {action} queue {queue!r} (needs role {needed!r})")

    def may_manage(self, queue: str, name: str) -> bool:
        """Whether the token may move or delete the position of group or subscriber ``name``."""
        if self.may("admin", queue):
            return True
        return self.may("consumer", queue) and any(fnmatch.fnmatchcase(name, p) for p in self.names)

    def require_manage(self, queue: str, kind: str, name: str, action: str) -> None:
        """NotAuthorized unless :meth:`may_manage` (``kind``: "group" or "subscriber")."""
        if not self.may_manage(queue, name):
            raise NotAuthorized(
                f"token {self.name!r} may not {action} {kind} {name!r} of queue {queue!r} (needs role 'admin' "
                f"on the queue, or 'consumer' with a groups pattern matching {name!r})"
            )

    def __repr__(self) -> str:
        return f"Principal({self.name!r})"


#: Every connection of a server without an auth file.
OPEN = Principal("anonymous", {"admin": ("*",)})
#: A connection over a store's Unix socket, with or without an auth file: whoever the
#: socket file's permissions let in may reach the store's files as well (server/shared.py).
LOCAL = Principal("local process", {"admin": ("*",)})


def _check_directories(path: str | os.PathLike[str]) -> None:
    """InvalidArgument if a directory above the auth file (on the path as named, or once its
    links are followed) lets every user put another file in its place: every user may write
    to it, it has no sticky bit (which /tmp has: there only an entry's owner may rename or
    delete it), and its file system is not read-only. As OpenSSH's StrictModes, every
    directory up to / counts (one above may have the file's directory renamed away)."""
    named, real = os.path.abspath(path), os.path.realpath(path)
    for directory in dict.fromkeys((*_parents(named), *_parents(real))):
        mode = os.stat(directory).st_mode
        if mode & 0o002 and not mode & stat.S_ISVTX and not os.statvfs(directory).f_flag & os.ST_RDONLY:
            raise InvalidArgument(
                f"auth file {os.fspath(path)!r}: every user of this machine may replace it (the directory "
                f"{directory!r} is writable by all, without the sticky bit): chmod o-w {directory!r}, or keep "
                "the file in a directory of the server's user"
            )


def _parents(path: str) -> list[str]:
    """The directories above ``path`` (absolute), nearest first, up to /."""
    parents, parent = [], os.path.dirname(path)
    while True:
        parents.append(parent)
        above = os.path.dirname(parent)
        if above == parent:
            return parents
        parent = above


class AuthPolicy:
    """The tokens of an auth file."""

    def __init__(self, tokens: Mapping[str, tuple[bytes, Principal]]) -> None:
        # token name -> (sha256 of the secret, principal)
        self._tokens = dict(tokens)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AuthPolicy:
        """Read an auth file.

        Raises:
            InvalidArgument: the file is not valid TOML, a token is malformed, or every
                user may write the file.
        """
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_mode & 0o002:
                    raise InvalidArgument(
                        f"auth file {os.fspath(path)!r}: every user of this machine may write it (and grant "
                        "themselves any role): chmod o-w it (600: the server's user only)"
                    )
                _check_directories(path)
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument(f"auth file {os.fspath(path)!r}: {e}") from e
        tokens = data.get("tokens")
        if not isinstance(tokens, dict) or not tokens:
            raise InvalidArgument(f"auth file {os.fspath(path)!r}: no [tokens.NAME] tables")
        policy = cls({name: _token(name, entry) for name, entry in tokens.items()})
        plain = sorted(name for name, entry in tokens.items() if isinstance(entry, dict) and "secret" in entry)
        if plain and os.stat(path).st_mode & 0o077:
            logging.getLogger(__name__).warning(
                "auth file %s holds the secrets of %s in clear and other users may read it: chmod 600 it, "
                "or give secret_sha256 instead",
                os.fspath(path), ", ".join(plain),
            )  # fmt: skip
        return policy

    def authenticate(self, token: str) -> Principal:
        """The principal for ``token``; NotAuthorized for an unknown one."""
        if not isinstance(token, str) or not token:
            raise NotAuthorized("an empty token")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found = None
        for expected, principal in self._tokens.values():  # compare with every entry: no timing hint
            if hmac.compare_digest(digest, expected):
                found = principal
        if found is None:
            raise NotAuthorized("unknown token")
        return found


def _token(name: str, entry: object) -> tuple[bytes, Principal]:
    if not isinstance(entry, dict):
        raise InvalidArgument(f"auth file: [tokens.{name}] must be a table")
    unknown = set(entry) - {"secret", "secret_sha256", "groups", *ROLES, METRICS}
    if unknown:
        raise InvalidArgument(
            f"auth file: [tokens.{name}] has unknown keys {sorted(unknown)}; roles are {(*ROLES, METRICS)} (and groups)"
        )
    if "secret" in entry:
        secret = entry["secret"]
        if not isinstance(secret, str) or len(secret) < 16:
            raise InvalidArgument(f"auth file: [tokens.{name}] secret must be a string of 16 characters or more")
        digest = hashlib.sha256(secret.encode("utf-8")).digest()
    elif "secret_sha256" in entry:
        try:
            digest = bytes.fromhex(entry["secret_sha256"])
        except (TypeError, ValueError):
            digest = b""
        if len(digest) != 32:
            raise InvalidArgument(f"auth file: [tokens.{name}] secret_sha256 must be 64 hex digits")
    else:
        raise InvalidArgument(f"auth file: [tokens.{name}] needs secret or secret_sha256")
    grants = {}
    for role in ROLES:
        patterns = entry.get(role, [])
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
            raise InvalidArgument(f"auth file: [tokens.{name}] {role} must be a list of queue patterns")
        grants[role] = tuple(patterns)
    if entry.get(METRICS, ["*"]) != ["*"]:
        raise InvalidArgument(
            f'auth file: [tokens.{name}] metrics must be ["*"]: /metrics shows every queue, it is not cut by queue'
        )
    grants[METRICS] = ("*",) if METRICS in entry else ()
    if not any(grants.values()):
        raise InvalidArgument(f"auth file: [tokens.{name}] grants no role")
    names = entry.get("groups", [])
    if not isinstance(names, list) or not all(isinstance(p, str) and p for p in names):
        raise InvalidArgument(f"auth file: [tokens.{name}] groups must be a list of group and subscriber name patterns")
    return digest, Principal(name, grants, names)


class MetricsAccess:
    """Who may read ``/metrics``: a bearer token, ``token`` (``--metrics-token``) or
    one of ``policy``'s tokens holding the metrics role; with neither, anyone.

    Raises:
        InvalidArgument: ``token`` is shorter than 16 characters.
    """

    def __init__(self, token: str | None = None, policy: AuthPolicy | None = None) -> None:
        if token is not None and len(token) < 16:
            raise InvalidArgument("a metrics token must be 16 characters or more")
        self._digest = hashlib.sha256(token.encode("utf-8")).digest() if token is not None else None
        self._policy = policy

    @property
    def open(self) -> bool:
        """Whether every request may read."""
        return self._digest is None and self._policy is None

    def allows(self, authorization: str | None) -> int:
        """What a request with this ``Authorization`` header (None: none) is answered: 200 (it may
        read), 401 (no token, or a wrong one) or 403 (a right token without the metrics role: not a
        guess, and not counted as one)."""
        if self.open:
            return 200
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 4096:
            return 401
        if self._digest is not None and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            return 200
        if self._policy is None:
            return 401
        try:
            return 200 if self._policy.authenticate(token).may_read_metrics() else 403
        except NotAuthorized:
            return 401


class PushPolicy:
    """Where a server may push a subscriber's messages.

    A subscriber announces the ``host:port`` it listens on. Unchecked, that
    would let any client make the server send a whole queue to any host, so
    the address must resolve to the host the announcing connection comes
    from, or lie in one of the ``allow`` networks (``--subscriber-allow``,
    CIDR such as ``10.0.0.0/8``).

    What is pushed to is always an IP that was checked, never a name looked
    up again after its check (DNS rebinding): an address on the announcing
    host is kept as that host's IP (:meth:`check` returns it); one in the
    ``allow`` networks is kept as announced, and each push connection looks
    it up once, checks every answer, and connects to the first
    (:meth:`check_push`).
    """

    def __init__(self, allow: Iterable[str] = ()) -> None:
        try:
            self.networks = [ipaddress.ip_network(a, strict=False) for a in allow]
        except ValueError as e:
            raise InvalidArgument(f"--subscriber-allow: {e}") from e

    def check(self, address: str, peer_host: str | None) -> str:
        """The address to keep for an announced ``address``: the announcing host's IP and
        the port when the address resolves to it or is a wildcard (``0.0.0.0``, ``::``:
        a subscriber listening on every interface), else ``address`` itself when every IP it
        resolves to lies in the ``allow`` networks. Raises NotAuthorized otherwise
        (InvalidArgument for a malformed one)."""
        host, port = _host_port(address)
        ips = _resolved(address, host, port)
        if peer_host is not None:
            peer = _ip(peer_host)
            if peer in ips or (ips and all(unspecified(ip) for ip in ips)):  # every interface: the announcer
                return joined(peer, port)
        if self._allowed(ips):
            return address
        raise NotAuthorized(
            f"subscriber address {address} is not on the registering client's host ({peer_host}) "
            "nor in the server's --subscriber-allow networks"
        )

    def check_push(self, address: str, approved: Iterable[str]) -> tuple[str, int]:
        """At push time: the IP and port to connect to for ``address``. It must be one a
        server checked when the subscriber announced it (``approved``: through a
        heartbeat, or ``approveSubscriberAddress`` before a ZooKeeper presence), which
        this version keeps as an IP, or lie in the ``allow`` networks (looked up once,
        here). A host name approved by an older server is not looked up again: such a
        subscriber is pushed to once it announces itself through this version. A
        presence written straight into ZooKeeper with another address gets nothing."""
        host, port = _host_port(address)
        try:
            literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None and address in approved:
            return str(literal), port
        if self.networks:
            ips = _resolved(address, host, port)  # one lookup: its answer is what is connected to
            if self._allowed(ips):
                return str(ips[0]), port
        elif literal is None and address in approved:
            raise NotAuthorized(
                f"subscriber address {address} was approved as a host name (by an older hqueue server): "
                "it is pushed to once the subscriber announces itself through this server"
            )
        raise NotAuthorized(
            f"subscriber address {address} was never announced through a server "
            "nor is in the server's --subscriber-allow networks"
        )

    def _allowed(self, ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
        """Every IP in the allow networks, and none a wildcard (which would be the server's own host)."""
        return bool(ips) and all(not unspecified(ip) and any(ip in net for net in self.networks) for ip in ips)


def _host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) split and checked: the host without brackets, the port."""
    host, _, port = address.rpartition(":")
    if not host or not port.isascii() or not port.isdigit():
        raise InvalidArgument(f"a subscriber address is host:port, got {address!r}")
    if not 1 <= int(port) <= 65535:
        raise InvalidArgument(f"a subscriber address's port is 1..65535, got {address!r}")
    return host.strip("[]"), int(port)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP; an IPv4-mapped IPv6 one (a dual-stack socket's IPv4 peer) as its IPv4 address."""
    ip = ipaddress.ip_address(text)
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def _resolved(address: str, host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        ips = list(dict.fromkeys(_ip(str(info[4][0])) for info in infos))
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"subscriber address {address!r} does not resolve: {e}") from e
    if any(ip.version == 6 and ip.is_link_local for ip in ips):  # (its scope is not in an address kept)
        raise InvalidArgument(f"subscriber address {address!r} is IPv6 link-local: a server cannot push there")
    return ips


def unspecified(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """``0.0.0.0``, ``::``, or ``::ffff:0.0.0.0`` (IPv4's, mapped into IPv6: a dual-stack
    socket bound to it listens on every interface too)."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def is_wildcard(host: str) -> bool:
    """Whether a listening socket's ``host`` means every interface (``0.0.0.0``, ``::``,
    ``''``, ``0``, ``::0``, ``::ffff:0.0.0.0``…): no address anybody can be reached at."""
    host = host.strip("[]")
    if not host:
        return True
    try:
        return unspecified(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_aton(host) == bytes(4)  # the old forms: '0', '0.0'
    except OSError:
        return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def joined(host: str | ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:9700``)."""
    host = str(host)
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True)
class PushCredentials:
    """What a subscriber announces besides its address: the key servers prove pushes
    with, and the fingerprint of its TLS certificate (None: it listens in clear)."""

    key: bytes
    certificate: str | None = None

    @classmethod
    def new(cls, certificate: str | None = None) -> PushCredentials:
        return cls(secrets.token_bytes(32), certificate)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.hex(), "certificate": self.certificate}

    @classmethod
    def checked(cls, key: object, certificate: object) -> PushCredentials | None:
        """These credentials, or None when malformed (an announcement without a
        usable key is never pushed to): a 32-byte key, and no certificate or its
        SHA-256 fingerprint in lower-case hex."""
        if isinstance(key, bytes) and len(key) == 32 and (certificate is None or _is_fingerprint(certificate)):
            return cls(key, certificate)
        return None

    @classmethod
    def from_json(cls, data: Any) -> PushCredentials | None:
        """As :meth:`to_json` wrote them; None for anything malformed."""
        try:
            return cls.checked(bytes.fromhex(data["key"]), data.get("certificate"))
        except (TypeError, ValueError, KeyError, AttributeError):
            return None


def _is_fingerprint(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
