"""Who is logged in to the console, and what they may do.

A user logs in with a token: one of the auth file's (``--auth-file``, read by
:class:`~hqueue.auth.AuthPolicy`, the same authorizer the Thrift port uses,
so the same roles hold), or, with no auth file, the one-time token printed
at start-up, whose holder is admin. The console is never open.

The session is kept here, server side (at most :data:`MAX_SESSIONS`, the
least recently used dropped first, and :data:`MAX_SESSIONS_PER_TOKEN` per
token, its oldest dropped first; each ending after :data:`SESSION_IDLE`
seconds unused); the browser holds a random session id in Flask's signed
cookie (HttpOnly, SameSite=Strict, Secure under TLS), with the CSRF token
every POST must carry back in its form.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..auth import AuthPolicy, Principal
from ..backoff import doubled
from ..errors import NotAuthorized

#: Sessions kept at once, and seconds one may stay unused.
MAX_SESSIONS = 1000
#: Sessions one token may hold: its next log-in ends its oldest (one token logging in again
#: and again ended every other user's session).
MAX_SESSIONS_PER_TOKEN = 20
SESSION_IDLE = 8 * 3600
#: The longest token a login form may carry (a real one is far shorter).
MAX_TOKEN = 4096
#: Failed log-ins a host may make at once; then each waits a doubling delay (up to
#: MAX_WAIT seconds) before the next try counts; hosts remembered at most.
FREE_FAILURES = 5
FIRST_WAIT, MAX_WAIT = 1.0, 60.0
MAX_HOSTS = 10_000
#: A browser that logged in keeps a device cookie (OWASP's "device cookies"): its log-ins
#: as that token are not held back by the wrong ones of others from its address. Seconds one
#: is good for, and how many are kept.
DEVICE_COOKIE = "hqueue_device"
DEVICE_SECONDS = 30 * 86400
MAX_DEVICES = 10_000
MAX_DEVICES_PER_TOKEN = 20
#: The roles one of which, on some queue, a token needs to log in.
QUEUE_ROLES = ("admin", "producer", "consumer")


class LoginThrottle:
    """Failed log-ins per client host, as the Thrift port slows wrong tokens (server/logins.py):
    a few fail at once, then the host must wait before trying again (a 429 says how long;
    no thread sleeps on it, so guessing cannot tie the console's few threads up)."""

    def __init__(self) -> None:
        self._hosts: OrderedDict[str, tuple[float, int]] = OrderedDict()  # host -> (last failure, failures)
        self._lock = threading.Lock()

    def wait(self, host: str) -> float:
        """Seconds ``host`` must still wait before a log-in is tried (0: now)."""
        with self._lock:
            last, failures = self._hosts.get(host, (0.0, 0))
        if failures < FREE_FAILURES:
            return 0.0
        delay = doubled(FIRST_WAIT, failures - FREE_FAILURES, MAX_WAIT)
        return max(0.0, last + delay - time.monotonic())

    def failed(self, host: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, failures = self._hosts.pop(host, (now, 0))
            self._hosts[host] = (now, failures + 1 if now - last < 2 * MAX_WAIT else 1)
            while len(self._hosts) > MAX_HOSTS:
                self._hosts.popitem(last=False)


@dataclass
class Login:
    """One logged-in session."""

    principal: Principal
    csrf: str
    last_used: float

    @property
    def who(self) -> str:
        return self.principal.name

    def may_admin(self, queue: str) -> bool:
        return self.principal.may("admin", queue)

    def may_cancel_timers(self, queue: str) -> bool:
        """Admin or producer (the producer role holds on queues admin holds too)."""
        return self.principal.may("producer", queue)

    def may_see(self, queue: str) -> bool:
        return self.principal.may_see(queue)

    def may_read(self, queue: str) -> bool:
        """Whether it may read the queue's messages, groups and subscribers: ``consumer``
        (or admin), as the Thrift port's scan, listGroups, describeGroup and groupPending need.
        A producer sees a queue (its name, partitions, timers' counts) but not what is in it."""
        return self.principal.may("consumer", queue)


class Access:
    """Logs users in with tokens and keeps their sessions.

    Args:
        policy: The auth file's tokens; None: a one-time token (:attr:`one_time_token`).
    """

    def __init__(self, policy: AuthPolicy | None) -> None:
        self.policy = policy
        #: The token that logs in when there is no auth file (printed at start-up).
        self.one_time_token = None if policy is not None else secrets.token_urlsafe(24)
        self._sessions: OrderedDict[str, Login] = OrderedDict()
        self._lock = threading.Lock()
        self.throttle = LoginThrottle()
        self._devices: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (token name, given)

    def authenticate(self, token: str) -> Principal:
        """The principal of ``token``; NotAuthorized for a wrong one."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
            raise NotAuthorized("no token, or one too long")
        if self.policy is not None:
            return self.policy.authenticate(token)
        assert self.one_time_token is not None
        if not hmac.compare_digest(token.encode(), self.one_time_token.encode()):
            raise NotAuthorized("unknown token")
        return Principal("console", {"admin": ("*",), "metrics": ("*",)})

    def log_in(self, token: str) -> tuple[str, Login]:
        """A new session for ``token``: (its id, the login). NotAuthorized for a wrong one, and
        for a token with no role on any queue (a ``metrics`` token, for the scraper: it logged
        in, and saw the store-wide rates)."""
        principal = self.authenticate(token)
        if not any(principal.grants.get(role) for role in QUEUE_ROLES):
            raise NotAuthorized(f"token {principal.name!r} has no role on any queue (admin, producer or consumer)")
        sid, login = secrets.token_urlsafe(32), Login(principal, secrets.token_urlsafe(32), time.monotonic())
        with self._lock:
            _make_room(self._sessions, lambda held: held.principal.name == principal.name,
                       MAX_SESSIONS_PER_TOKEN, MAX_SESSIONS)  # fmt: skip
            self._sessions[sid] = login
        return sid, login

    def find(self, sid: object) -> Login | None:
        """The session ``sid`` names, if it is live (and mark it used)."""
        if not isinstance(sid, str):
            return None
        now = time.monotonic()
        with self._lock:
            login = self._sessions.get(sid)
            if login is None:
                return None
            if now - login.last_used > SESSION_IDLE:
                del self._sessions[sid]
                return None
            login.last_used = now
            self._sessions.move_to_end(sid)
            return login

    def device(self, device_id: object) -> str | None:
        """The token name a device cookie was given to (None: none, unknown or too old)."""
        if not isinstance(device_id, str):
            return None
        with self._lock:
            kept = self._devices.get(device_id)
            if kept is None or time.monotonic() - kept[1] > DEVICE_SECONDS:
                return None
            return kept[0]

    def new_device(self, name: str, device_id: object = None) -> str:
        """A device cookie for a browser that logged in as token ``name`` (its own renewed,
        if it held one of that token)."""
        if not isinstance(device_id, str) or self.device(device_id) != name:
            device_id = secrets.token_urlsafe(32)
        with self._lock:
            self._devices.pop(device_id, None)
            _make_room(self._devices, lambda held: held[0] == name, MAX_DEVICES_PER_TOKEN, MAX_DEVICES)
            self._devices[device_id] = (name, time.monotonic())
        return device_id

    def log_out(self, sid: object) -> None:
        with self._lock:
            if isinstance(sid, str):
                self._sessions.pop(sid, None)


def _make_room(table: OrderedDict[str, Any], mine: Callable[[Any], bool], per_token: int, most: int) -> None:
    """Before one more entry of a token in ``table`` (oldest first): its own oldest go past
    ``per_token`` (one token logging in again and again pushed every other one's out), then
    anyone's oldest past ``most``."""
    owned = [key for key, value in table.items() if mine(value)]
    for key in owned[: max(0, len(owned) - per_token + 1)]:
        del table[key]
    while len(table) >= most:
        table.popitem(last=False)


def same_token(given: object, expected: str) -> bool:
    """Whether a form's CSRF token is the session's (in constant time). A session that holds
    none (a cross-site POST comes without the form's cookie) matches nothing, not an empty field."""
    return bool(expected) and isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())
