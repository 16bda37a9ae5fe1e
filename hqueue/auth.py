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

    [tokens.prometheus]
    secret = "another long random text"
    metrics = ["*"]

Roles:

* ``consumer``: scan, add and run subscribers, see the queue;
* ``producer``: put, see the queue;
* ``admin``: everything, including create, truncate, disable, enable, drop;
* ``metrics``: read ``/metrics`` (``--metrics-port``) with the token as a bearer
  token (``Authorization: Bearer <secret>``). The endpoint shows every queue's
  series, so the role takes ``["*"]`` only; it grants nothing on the Thrift port.
  An ``admin = ["*"]`` token may read ``/metrics`` too.

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
import os
import socket
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping

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


class Principal:
    """What one token may do."""

    def __init__(self, name: str, grants: Mapping[str, tuple[str, ...]]) -> None:
        self.name = name
        self.grants = dict(grants)

    def may(self, role: str, queue: str) -> bool:
        """Whether the token holds ``role`` (or admin) on ``queue``."""
        for held in (role, "admin") if role != "admin" else ("admin",):
            if any(fnmatch.fnmatchcase(queue, pattern) for pattern in self.grants.get(held, ())):
                return True
        return False

    def may_read_metrics(self) -> bool:
        return bool(self.grants.get(METRICS)) or self.may("admin", "*")

    def may_see(self, queue: str) -> bool:
        return any(self.may(role, queue) for role in ROLES)

    def require(self, role: str, queue: str, action: str) -> None:
        if not self.may(role, queue):
            raise NotAuthorized(f"token {self.name!r} may not {action} queue {queue!r} (needs role {role!r})")

    def __repr__(self) -> str:
        return f"Principal({self.name!r})"


#: Every connection of a server without an auth file.
OPEN = Principal("anonymous", {"admin": ("*",)})


class AuthPolicy:
    """The tokens of an auth file."""

    def __init__(self, tokens: Mapping[str, tuple[bytes, Principal]]) -> None:
        # token name -> (sha256 of the secret, principal)
        self._tokens = dict(tokens)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AuthPolicy:
        """Read an auth file.

        Raises:
            InvalidArgument: the file is not valid TOML, or a token is malformed.
        """
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument(f"auth file {os.fspath(path)!r}: {e}") from e
        tokens = data.get("tokens")
        if not isinstance(tokens, dict) or not tokens:
            raise InvalidArgument(f"auth file {os.fspath(path)!r}: no [tokens.NAME] tables")
        return cls({name: _token(name, entry) for name, entry in tokens.items()})

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
    unknown = set(entry) - {"secret", "secret_sha256", *ROLES, METRICS}
    if unknown:
        raise InvalidArgument(
            f"auth file: [tokens.{name}] has unknown keys {sorted(unknown)}; roles are {(*ROLES, METRICS)}"
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
    return digest, Principal(name, grants)


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

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header (None: none) may read."""
        if self.open:
            return True
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 4096:
            return False
        if self._digest is not None and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            return True
        if self._policy is None:
            return False
        try:
            return self._policy.authenticate(token).may_read_metrics()
        except NotAuthorized:
            return False


class PushPolicy:
    """Where a server may push a subscriber's messages.

    A subscriber announces the ``host:port`` it listens on. Unchecked, that
    would let any client make the server send a whole queue to any host, so
    the address must resolve to the host the announcing connection comes
    from, or lie in one of the ``allow`` networks (``--subscriber-allow``,
    CIDR such as ``10.0.0.0/8``).
    """

    def __init__(self, allow: Iterable[str] = ()) -> None:
        try:
            self.networks = [ipaddress.ip_network(a, strict=False) for a in allow]
        except ValueError as e:
            raise InvalidArgument(f"--subscriber-allow: {e}") from e

    def check(self, address: str, peer_host: str | None) -> None:
        """Raise NotAuthorized unless the server may push to ``address``."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"a subscriber address is host:port, got {address!r}")
        try:
            ips = {ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host.strip("[]"), int(port))}
        except (OSError, ValueError) as e:
            raise InvalidArgument(f"subscriber address {address!r} does not resolve: {e}") from e
        if peer_host is not None and ipaddress.ip_address(peer_host) in ips:
            return
        if ips and all(any(ip in net for net in self.networks) for ip in ips):
            return
        raise NotAuthorized(
            f"subscriber address {address} is not on the registering client's host ({peer_host}) "
            "nor in the server's --subscriber-allow networks"
        )

    def check_push(self, address: str) -> None:
        """At push time, where the announcing client is not known (subscribers
        announce themselves in ZooKeeper): with ``allow`` networks, the address
        must be in them; without, ZooKeeper's own access control is the guard."""
        if self.networks:
            self.check(address, None)
