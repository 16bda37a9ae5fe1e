"""Why a connection to an hqueue server failed, said the way a user can act on it.

thriftpy2 turns every failure to connect into ``TTransportException(type=1,
message="Could not connect to ('h', 9700)")`` and keeps the real cause only
as the exception's ``__context__``: a refused connection, an unknown host, a
certificate that did not verify and a server that does not speak TLS all
read the same. :func:`explain` digs the cause out.

A plaintext client against a TLS server sees only a reset connection (the
server drops what is not a TLS handshake): :func:`explain` then tries a TLS
handshake, without checking the certificate, to say whether the server
speaks TLS.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from thriftpy2.transport import TTransportException

#: How long the TLS probe of a reset connection may take, at most.
PROBE_SECONDS = 2.0


def explain(
    host: str,
    port: int,
    error: BaseException,
    tls: bool | None,
    server: str = "an hqueue server",
    *,
    speaks: bool | None = None,
    probe_seconds: float = PROBE_SECONDS,
) -> str:
    """What went wrong reaching ``host:port``, with what to do; never a raw TTransportException.

    ``tls``: whether the client spoke TLS; None for a server that is no hqueue
    server (HBase's Thrift server): no advice on hqueue URLs then.
    ``speaks``: whether the server speaks TLS, where the caller asked already
    (:func:`would_probe`; the asyncio client asks off its loop); else it is
    asked here when it matters, for at most ``probe_seconds`` (0: not asked).
    """
    cause = unwrapped(error)
    host = host.strip("[]")  # an IPv6 address as a URL writes it
    if tls is None:
        return _plain(host, cause, server)
    if isinstance(cause, ssl.SSLCertVerificationError):
        why = cause.verify_message or cause.reason or str(cause)
        give = f"hqueue://{host}:{port}?ca=/path/to/cert.pem"
        if "self-signed" in why or "self signed" in why:
            return f"the server's TLS certificate was not accepted: {why} (give that certificate: {give})"
        return f"the server's TLS certificate was not accepted: {why} (its CA is not trusted here? give it: {give})"
    if isinstance(cause, ssl.SSLError) and tls:
        return (
            f"the TLS handshake failed ({cause.reason or cause}): does the server speak TLS? (if not, leave out tls=1)"
        )
    if would_probe(error, tls):
        if speaks is None:
            speaks = probe_seconds > 0 and speaks_tls(host, port, probe_seconds)
        if speaks:
            return "the server speaks TLS: connect with hqueue://…?tls=1 (and ca=FILE for a self-signed certificate)"
    return _plain(host, cause, server)


def _plain(host: str, cause: BaseException, server: str) -> str:
    if isinstance(cause, ConnectionRefusedError):
        return f"connection refused (is {server} running there?)"
    if isinstance(cause, socket.gaierror):
        return f"unknown host {host!r} ({cause.strerror})"
    if isinstance(cause, (socket.timeout, TimeoutError)):
        return "no answer (timed out)"
    if isinstance(cause, TTransportException):
        return _transport_text(cause)
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[:1].lower() + cause.strerror[1:]
    return str(cause) or type(cause).__name__


def unwrapped(error: BaseException) -> BaseException:
    """The error under thriftpy2's wrapping, if it kept one."""
    while isinstance(error, TTransportException) and isinstance(error.__context__, OSError):
        error = error.__context__
    return error


def _reset(error: BaseException) -> bool:
    """The server closed the connection without an answer."""
    if isinstance(error, (ConnectionResetError, BrokenPipeError)):
        return True
    return isinstance(error, TTransportException) and error.type == TTransportException.END_OF_FILE


def _transport_text(error: TTransportException) -> str:
    if error.type == TTransportException.END_OF_FILE:
        return "the server closed the connection"
    return error.message or "the connection failed"


def would_probe(error: BaseException, tls: bool | None) -> bool:
    """Whether :func:`explain` asks the server if it speaks TLS: a plain hqueue connection it
    closed without an answer (what a TLS server does with one)."""
    return tls is False and _reset(unwrapped(error))


def spoke_plain(pool: Any) -> bool:
    """Whether the server of ``pool`` (a client's connections to it, blocking or asyncio)
    answered it in plain text since its last connection closed unanswered; then that
    failure is not probed for TLS (a probe per connection a server at its limit closed
    cost it one more). Only the first failure after an answer goes unasked: a server
    restarted with TLS is still found at the next."""
    if pool is None or not pool.answered:
        return False
    pool.answered = False
    return True


def speaks_tls(host: str, port: int, seconds: float = PROBE_SECONDS) -> bool:
    """Whether a TLS handshake with ``host:port`` succeeds within ``seconds`` (the
    certificate unchecked: this only asks what the server speaks; nothing is sent over it)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    host = host.strip("[]")
    try:
        with socket.create_connection((host, port), timeout=seconds) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ValueError):
        return False
