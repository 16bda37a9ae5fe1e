"""The console's request fields: read, bounded and checked (a 400 naming the field otherwise)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from flask import abort, g, request

from ..errors import HQueueError
from ..message import LATEST_MS, MessageID
from ..printed import escape, unescape
from .access import Login

#: Rows a page shows.
PAGE = 50
#: The longest value of any form or query field (names are 200 at most, times and handles short).
MAX_FIELD = 512
#: An integer field: ASCII digits, one sign at most, 12 characters at most.
_INTEGER = re.compile(r"-?[0-9]{1,11}", re.ASCII)


def field(name: str, default: str | None = None, *, source: Any = None) -> str:
    """A form (POST) or query (GET) field, at most :data:`MAX_FIELD` characters; 400 if
    it is missing without a default."""
    values = source if source is not None else (request.form if request.method == "POST" else request.args)
    value = values.get(name, default)
    if value is None:
        abort(400, f"'{name}' is required")
    if len(value) > MAX_FIELD:
        abort(400, f"'{name}' is longer than {MAX_FIELD} characters")
    return value


def number(name: str, default: int, low: int, high: int) -> int:
    """An integer field in ``low..high``; 400 naming it otherwise."""
    text = field(name, str(default)).strip()
    if not _INTEGER.fullmatch(text):  # (ASCII digits: '²' is one to isdigit, and int() refused it: a 500)
        abort(400, f"'{name}' must be an integer, got {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        abort(400, f"'{name}' must be in {low}..{high}, got {value}")
    return value


def require(allowed: Callable[[Login], bool], why: str) -> Login:
    """The session's login if ``allowed``; 403 with ``why`` otherwise."""
    login: Login = g.login
    if not allowed(login):
        abort(403, f"token {login.who!r} may not {why}")
    return login


def moment(name: str, default: str | None = None) -> MessageID | None:
    """A time field: an ISO time (UTC unless it says otherwise), an ID (``ms:seq``) or
    epoch ms; None when empty and optional."""
    text = field(name, default if default is not None else None).strip()
    if not text:
        return None
    try:
        found = MessageID.parse(text)
    except (ValueError, OverflowError, HQueueError):
        abort(400, f"'{name}' must be a time (2026-11-22 10:00, UTC), an ID (ms:seq) or epoch ms, got {text[:40]!r}")
    if found.timestamp > LATEST_MS:
        abort(400, f"'{name}' is after the year 9999 (epoch ms up to {LATEST_MS}), got {text[:40]!r}")
    return found


def topic_field(text: str) -> bytes:
    r"""A topic as a form gives it: as the CLI and the pages print topics (``\\``, ``\t``,
    ``\n``, ``\r``, ``\xNN``: :func:`~hqueue.printed.unescape`), so a topic copied
    from any front end names the same bytes."""
    return unescape(text.encode())


def topic_shown(topic: bytes) -> str:
    r"""A topic as pages show it, as the CLI prints it (and :func:`topic_field` reads it back)."""
    return escape(bytes(topic))
