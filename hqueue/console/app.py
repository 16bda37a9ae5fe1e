"""The console's Flask application: log-in, sessions, CSRF, errors; the pages and
actions are in pages.py and actions.py.

Every request is bounded: waitress (console/serve.py) caps the body and the
time a client may take; here, every page is paged (forms.PAGE), every
form field has a length limit, and a bad value is a 400 naming it, an
unknown name a 404, a refusal a 403: never a traceback.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, abort, g, jsonify, redirect, render_template, request, session, url_for
from werkzeug.exceptions import HTTPException

from ..auth import is_loopback
from ..errors import (
    GroupNotFound,
    HQueueError,
    InvalidArgument,
    NotAuthorized,
    QueueDisabled,
    QueueNotFound,
    SubscriberNotFound,
)
from ..message import MessageID
from . import actions, pages
from .access import DEVICE_COOKIE, DEVICE_SECONDS, Login, same_token
from .forms import MAX_FIELD, field, topic_shown

logger = logging.getLogger(__name__)

#: Paths open without a session.
OPEN_PATHS = ("/login", "/static/")


def create_app(console: Any) -> Flask:
    """The console's application over ``console`` (serve.py's Console: its admin handle, sampler,
    audit log and access; pages find it as ``g.console``)."""
    app = Flask(__name__, static_folder="static", template_folder="templates")
    app.config.update(
        SECRET_KEY=secrets.token_bytes(32),  # per process: a restart logs everyone out
        SESSION_COOKIE_NAME="hqueue_console",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=console.tls,
        MAX_CONTENT_LENGTH=console.max_body,
        MAX_FORM_MEMORY_SIZE=console.max_body,
        MAX_FORM_PARTS=64,
        SEND_FILE_MAX_AGE_DEFAULT=3600,
        TEMPLATES_AUTO_RELOAD=False,
    )
    app.extensions["hqueue_console"] = console
    app.add_template_filter(stamp)
    app.add_template_filter(topic_shown, "topic")
    app.add_template_filter(pages.shown, "value")
    _guards(app, console)
    _sessions(app, console.access)
    _errors(app)
    pages.register(app)
    actions.register(app)
    return app


def _guards(app: Flask, console: Any) -> None:
    """What every request passes: a session (but to log in), a POST's CSRF token; and the
    headers every answer carries."""
    access = console.access

    @app.before_request
    def require_login() -> Any:
        if not _host_allowed(console, request.host):
            abort(421, "a console on loopback answers to a loopback Host only (localhost, 127.0.0.1, [::1])")
        g.console, g.login = console, access.find(session.get("sid"))
        if request.path.startswith(OPEN_PATHS):
            return None
        if g.login is None:
            if request.path.startswith("/api/") or request.method != "GET":
                abort(401, "log in first")
            return redirect(url_for("log_in", next=request.path))
        if request.method == "POST" and not same_token(request.form.get("csrf"), g.login.csrf):
            abort(403, "the form's CSRF token is missing or wrong: reload the page and try again")
        return None

    @app.after_request
    def secure_headers(response: Response) -> Response:
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.context_processor
    def common() -> dict[str, Any]:
        login: Login | None = g.get("login")
        return {"login": login, "csrf": login.csrf if login else session.get("pre", ""), "store": console.store}


def _known_device(access: Any, device: object, token: str) -> bool:
    """Whether a browser whose address is held back may log in all the same: its device cookie
    was given to the token it logs in with now. (Others' wrong tokens from its address, a
    shared loopback, an office's NAT, held the right admin token out: a helper's pass.) Any
    other token it sends is refused as the address is, right or wrong, so this tells a
    guesser nothing: it knows its own token already."""
    name = access.device(device)
    if name is None:
        return False
    try:
        return bool(access.authenticate(token).name == name)
    except NotAuthorized:
        return False


def _host_allowed(console: Any, host: str) -> bool:
    """Whether a request's Host may reach this console: any, when it listens beyond loopback
    or behind a trusted proxy; a loopback name or address when it listens on loopback. (A
    page of another site whose name an attacker points at 127.0.0.1, DNS rebinding, reached
    a loopback console as its own origin.)"""
    if console.trusted_proxy or not is_loopback(console.host):
        return True
    try:
        name = urlsplit(f"//{host}").hostname or ""  # (lower-cased; [::1]:port is ::1)
    except ValueError:  # ([::1 unclosed, a port that is no number)
        return False
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def _sessions(app: Flask, access: Any) -> None:
    """Logging in (with the log-in form's own CSRF token, throttled per host) and out."""

    @app.route("/login", methods=["GET", "POST"])
    def log_in() -> Any:
        if request.method == "GET":
            session["pre"] = session.get("pre") or secrets.token_urlsafe(32)
            return render_template("login.html", next=_local(request.args.get("next")), error=None)
        if not same_token(request.form.get("csrf"), session.get("pre", "")):
            abort(403, "the form's CSRF token is missing or wrong: reload the page and try again")
        host, token, device = request.remote_addr or "", field("token"), request.cookies.get(DEVICE_COOKIE)
        wait = access.throttle.wait(host)
        if wait > 0 and not _known_device(access, device, token):
            abort(429, f"too many failed log-ins from {host}: try again in {wait:.0f} s")
        try:
            sid, login = access.log_in(token)
        except NotAuthorized:
            access.throttle.failed(host)
            logger.warning("console: a failed log-in from %s", host)
            return render_template("login.html", next=_local(request.form.get("next")), error="Unknown token."), 403
        session.clear()  # (a right token does not clear the host's wrong ones: a holder of any
        # token logging in between guesses had every try free, about 300 times the rate)
        session["sid"] = sid
        logger.info("console: %s logged in from %s", login.who, request.remote_addr)
        answer = redirect(_local(request.form.get("next")) or url_for("overview"))
        answer.set_cookie(DEVICE_COOKIE, access.new_device(login.who, device), max_age=DEVICE_SECONDS,
                          httponly=True, samesite="Strict", secure=request.is_secure)  # fmt: skip
        return answer

    @app.post("/logout")
    def log_out() -> Any:
        access.log_out(session.get("sid"))
        session.clear()
        return redirect(url_for("log_in"))


def stamp(ms: int) -> str:
    """Epoch ms as a UTC time to the millisecond."""
    try:
        return MessageID(ms).datetime.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]  # (exact: ms / 1000 was not)
    except (OverflowError, OSError, ValueError, TypeError):
        return str(ms)


def _errors(app: Flask) -> None:
    def answer(status: int, reason: str) -> Any:
        if request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json":
            return jsonify(error=reason), status
        return render_template("error.html", status=status, reason=reason), status

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Any:
        return answer(e.code or 500, e.description or e.name)

    @app.errorhandler(HQueueError)
    def hqueue_error(e: HQueueError) -> Any:
        status = 400
        if isinstance(e, (QueueNotFound, GroupNotFound, SubscriberNotFound)):
            status = 404
        elif isinstance(e, NotAuthorized):
            status = 403
        elif isinstance(e, QueueDisabled):
            status = 409
        elif not isinstance(e, InvalidArgument):
            status = 503
        return answer(status, str(e).replace("'partition_id'", "'partition'", 1))  # (the form's name for it)

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> Any:
        logger.error("console: %s %s failed", request.method, request.path, exc_info=e)
        return answer(500, "the console failed to answer: see the server's log")


def _local(target: str | None) -> str | None:
    """``target`` if it is a path on this site (no open redirect). Control characters and
    spaces are refused whole: browsers drop tabs and newlines from a URL (and Werkzeug drops
    them from a Location), so ``/<TAB>/evil.example`` would lead to ``//evil.example``."""
    if not target or len(target) > MAX_FIELD or any(c <= " " or c == "\x7f" for c in target):
        return None
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return None
