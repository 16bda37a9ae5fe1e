"""The commands that run a process: server, shell, demo."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import click

from ..config import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES
from ..connection import store_exists, store_path
from ..groups.limits import (
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_LEASE,
    DEFAULT_MAX_MEMBER_IN_FLIGHT,
    MEMBER_TIMEOUT,
    MIN_MEMBER_TIMEOUT,
    GroupLimits,
)
from ..message import Message
from ..rpc.spin import DEFAULT_SERVER_POLL_US, MAX_POLL_US
from ..storage import default_url
from ..subscriptions.manager import DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_MESSAGES
from .main import Progress, Seconds, check_url, main, open_admin, open_queue


def _share(name: str, default: float, help: str) -> Callable[[Callable], Callable]:
    """An option for a part of a server's limit one client may hold: a fraction in (0, 1]."""
    return click.option(name, type=click.FloatRange(0, 1, min_open=True), default=default, show_default=True, help=help)


@main.command()
@click.option("--storage", help="Store URL (default: --url, or local://./hqueue-data).")
@click.option("--zk", help="ZooKeeper host:port[,host:port][/chroot]; without it this server owns every partition.")
@click.option(
    "--zk-auth",
    envvar="HQUEUE_ZK_AUTH",
    metavar="USER:PASSWORD",
    help="ZooKeeper digest credentials (a password of 16+ characters): hqueue's znodes are made readable and "
    "writable by them only (subscribers need none: they heartbeat a server, which writes their presence). "
    "Prefer $HQUEUE_ZK_AUTH: every local user sees a command line.",
)
@click.option(
    "--zk-root",
    is_flag=True,
    help="With --zk-auth and no chroot in --zk: keep hqueue's znodes under ZooKeeper's root, as a deployment "
    "from before a chroot was required did (anyone who reaches ZooKeeper may delete them there). Logged as a warning.",
)
@click.option(
    "--zk-open",
    is_flag=True,
    help="With --auth-file, run with a ZooKeeper every host that reaches it may write (no --zk-auth): "
    "only when ZooKeeper's own network keeps everyone else out. Logged as a warning.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=9700, show_default=True, help="0 picks a free port.")
@click.option(
    "--advertise",
    help="host:port clients and other servers should use (default: --host:--port; needed with --zk when "
    "--host is 0.0.0.0 or ::).",
)
@click.option("--id", "server_id", help="This server's name in ZooKeeper (default: the advertised address).")
@click.option(
    "--session-timeout",
    type=Seconds(1, 3600),
    default=10.0,
    show_default=True,
    help="ZooKeeper session timeout (s).",
)
@click.option(
    "--idle-timeout",
    type=Seconds(0.1, 86400),
    default=60.0,
    show_default=True,
    help="Close remote scanners idle this long (s).",
)
@click.option(
    "--auth-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="HQUEUE_AUTH_FILE",
    help="TOML file of tokens and roles; without it every client may do everything.",
)
@click.option(
    "--subscriber-allow",
    multiple=True,
    metavar="CIDR",
    help="Networks subscribers' push addresses may be in (repeatable); default: the registering client's host only.",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve TLS with this certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key.")
@click.option("--max-connections", type=click.IntRange(1, 65536), default=1024, show_default=True)
@_share(
    "--connection-share",
    0.25,
    "The part of --max-connections one token's connections (with --auth-file) may take and still be kept "
    "when all are taken; its others are closed to make room, as unauthenticated ones are. 1: no share.",
)
@click.option(
    "--connection-idle-timeout",
    type=Seconds(0, 86400),
    default=300.0,
    show_default=True,
    help="Close idle connections (s).",
)
@click.option(
    "--max-frame-bytes",
    type=click.IntRange(1024, 2**31 - 1),
    default=20 * 1024 * 1024,
    show_default=True,
    help="The largest call; a larger one is refused from its head, unread (LimitExceeded).",
)
@click.option(
    "--max-put-messages",
    type=click.IntRange(1, MAX_BATCH_MESSAGES),
    default=MAX_BATCH_MESSAGES,
    show_default=True,
    help="Messages one put call may carry (a batch is atomic, never split: a bigger put is refused, "
    "LimitExceeded; 10,000 at most, any store's limit).",
)
@click.option(
    "--max-put-bytes",
    type=click.IntRange(1, MAX_BATCH_BYTES),
    default=MAX_BATCH_BYTES,
    show_default=True,
    help="Bytes of topics and values one put call may carry; a larger message cannot be put here "
    "(16 MiB at most, any store's limit).",
)
@click.option(
    "--max-inflight-bytes",
    type=click.IntRange(1024, 2**40),
    default=64 * 1024 * 1024,
    show_default=True,
    help="Bytes of calls under way, all connections together; a call waits for room, then ServerBusy.",
)
@click.option(
    "--inflight-wait",
    type=Seconds(0, 3600),
    default=10.0,
    show_default=True,
    help="How long a call may wait for room in --max-inflight-bytes (s).",
)
@_share(
    "--inflight-share",
    0.25,
    "The part of --max-inflight-bytes that one token's calls on their way in and replies not yet read may "
    "hold (with --auth-file; without, each connection's); past it, its big calls wait and its scans and receives "
    "get ServerBusy. 1: no share.",
)
@click.option("--max-partitions", type=click.IntRange(1, 32767), default=1024, show_default=True)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), help="Serve Prometheus metrics at http://HOST:PORT/metrics."
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address metrics listen on (not --host: keep them off the network unless they need a token).",
)
@click.option(
    "--metrics-token",
    envvar="HQUEUE_METRICS_TOKEN",
    help="Bearer token metrics need (16+ characters; or $HQUEUE_METRICS_TOKEN). With --auth-file, tokens "
    'holding the metrics role (metrics = ["*"]) may read them too, and some credential is always needed.',
)
@click.option(
    "--push-threads",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Threads pushing to subscribers, for all of them together.",
)
@click.option(
    "--max-subscribers",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Most subscribers this server pushes to; the rest wait.",
)
@click.option(
    "--checkpoint-messages",
    type=click.IntRange(1, 1_000_000),
    default=DEFAULT_CHECKPOINT_MESSAGES,
    show_default=True,
    help="Save a push checkpoint after at most this many messages delivered since the last save (per "
    "subscriber and partition): after a crash, at most this many are pushed again. Batches are cut to fit.",
)
@click.option(
    "--checkpoint-interval",
    type=Seconds(0.001, 3600),
    default=DEFAULT_CHECKPOINT_INTERVAL,
    show_default=True,
    help="...or after this many seconds, whichever comes first (a target: under load the count is what holds).",
)
@click.option(
    "--max-lease",
    type=Seconds(0.001, 7 * 86400),
    default=DEFAULT_MAX_LEASE,
    show_default=True,
    help="The longest consumer-group lease (and nack delay) a member gets, whatever it asks (s).",
)
@click.option(
    "--max-member-in-flight",
    type=click.IntRange(1, 10_000_000),
    default=DEFAULT_MAX_MEMBER_IN_FLIGHT,
    show_default=True,
    help="Messages one consumer-group member may hold unacked per group on this server.",
)
@click.option(
    "--max-groups",
    type=click.IntRange(1, 10_000_000),
    default=DEFAULT_MAX_GROUPS,
    show_default=True,
    help="Consumer groups one queue may have (a consumer token may make them; each costs memory and series).",
)
@click.option(
    "--member-timeout",
    type=Seconds(MIN_MEMBER_TIMEOUT, 3600),
    default=MEMBER_TIMEOUT,
    show_default=True,
    help="A consumer-group member silent this long (no receive, no heartbeat; clients heartbeat every "
    "second) is gone: its leases end at once, as they do when its last connection closes (s).",
)
@click.option(
    "--console-port",
    type=click.IntRange(0, 65535),
    help="Serve the web console at http://HOST:PORT/ (docs/console.md): log in with a token of --auth-file, "
    "or without one the one-time token printed at start-up. Off by default.",
)
@click.option(
    "--console-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the console listens on (plain HTTP: put a TLS proxy in front of it off this machine).",
)
@click.option(
    "--console-trusted-proxy",
    metavar="ADDRESS",
    help="A TLS proxy in front of the console whose X-Forwarded-Proto and X-Forwarded-For count (as "
    "hqueue console --trusted-proxy): its session cookie is then Secure, and each client is its own address.",
)
@click.option(
    "--local-socket/--no-local-socket",
    default=True,
    show_default=True,
    help="With a local:// store, also serve it to this machine's processes on DIR/hqueue.sock, so that "
    "commands and programs given local://DIR work while the server runs (they become its clients). Who may "
    "connect there is decided by the socket's file permissions (the directory owner's; its group's too when "
    "it may write in DIR), not by --auth-file tokens.",
)
@click.option(
    "--io",
    type=click.Choice(["loop", "threads"]),
    default="loop",
    show_default=True,
    help="How client connections are served: one event loop over all plain TCP and Unix connections, whose "
    "quick calls (puts, reads, receives, acks) run on it when the store is local (TLS connections keep a "
    "thread each); or a thread per connection.",
)
@click.option(
    "--idle-poll-us",
    envvar="HQUEUE_IDLE_POLL_US",
    type=click.IntRange(0, MAX_POLL_US),
    default=DEFAULT_SERVER_POLL_US,
    show_default=True,
    help="With --io loop: microseconds the event loop polls for the next call before it sleeps, while calls "
    "come that soon (a client's next call finds the server awake: lower latency for one-call-at-a-time "
    "clients, for some more CPU). It stops polling once a poll finds nothing, so an idle server sleeps. "
    "0: never poll (a machine whose CPUs are all busy, a laptop on battery).",
)
@click.option(
    "--log-level",
    envvar="HQUEUE_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.pass_context
def server(
    ctx,
    storage,
    zk,
    zk_auth,
    zk_root,
    zk_open,
    host,
    port,
    advertise,
    server_id,
    session_timeout,
    idle_timeout,
    auth_file,
    subscriber_allow,
    tls_cert,
    tls_key,
    max_connections,
    connection_share,
    connection_idle_timeout,
    max_frame_bytes,
    max_put_messages,
    max_put_bytes,
    max_inflight_bytes,
    inflight_wait,
    inflight_share,
    max_partitions,
    metrics_port,
    push_threads,
    max_subscribers,
    checkpoint_messages,
    checkpoint_interval,
    max_lease,
    max_member_in_flight,
    max_groups,
    member_timeout,
    metrics_host,
    metrics_token,
    console_port,
    console_host,
    console_trusted_proxy,
    local_socket,
    io,
    idle_poll_us,
    log_level,
) -> None:
    """Serve queues over Thrift (framed transport, binary protocol)."""
    from ..auth import AuthPolicy, PushPolicy
    from ..rpc.connections import ServerLimits
    from ..server import HQueueServer
    from ..server.app import return_freed_memory

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return_freed_memory()
    if zk_auth and not zk:
        raise click.UsageError("--zk-auth goes with --zk")
    for option, value, variable in (("zk_auth", zk_auth, "HQUEUE_ZK_AUTH"), ("metrics_token", metrics_token,
                                                                            "HQUEUE_METRICS_TOKEN")):  # fmt: skip
        if value and ctx.get_parameter_source(option) == click.core.ParameterSource.COMMANDLINE:
            logging.getLogger(__name__).warning(
                "--%s on the command line: every user of this machine sees it (ps); give it in $%s",
                option.replace("_", "-"),
                variable,
            )
    _check_zk_access(zk, zk_auth, zk_open, auth_file)
    if zk_root and not zk_auth:
        raise click.UsageError("--zk-root goes with --zk-auth")
    coordinator_factory = _zookeeper(zk, zk_auth, server_id, session_timeout, zk_root) if zk else None
    check_url(storage, "--storage")
    url = storage or ctx.obj["url"] or default_url()
    ssl_context = _tls(tls_cert, tls_key)
    if not store_exists(url):  # (a server serves a new store: said, a mistyped path is not a silent empty one)
        logging.getLogger(__name__).warning("no hqueue store at %s: a new one is made there", store_path(url))
    try:
        limits = ServerLimits(
            max_connections=max_connections,
            connection_share=connection_share,
            idle_timeout=connection_idle_timeout or None,
            max_frame_bytes=max_frame_bytes,
            max_inflight_bytes=max_inflight_bytes,
            inflight_wait=inflight_wait,
            inflight_share=inflight_share,
            raise_open_files=True,  # (the command owns its process)
            idle_poll_us=idle_poll_us,
        )
    except ValueError as e:
        raise click.UsageError(str(e).replace("'max_", "--max-").replace("_bytes'", "-bytes")) from e
    try:
        instance = HQueueServer(
            url,
            host,
            port,
            advertise=advertise,
            coordinator_factory=coordinator_factory,
            idle_timeout=idle_timeout,
            auth=AuthPolicy.load(auth_file) if auth_file else None,
            push_policy=PushPolicy(subscriber_allow),
            limits=limits,
            ssl_context=ssl_context,
            max_partitions=max_partitions,
            max_put_messages=max_put_messages,
            max_put_bytes=max_put_bytes,
            metrics_port=metrics_port,
            push_threads=push_threads,
            max_subscribers=max_subscribers,
            checkpoint_messages=checkpoint_messages,
            checkpoint_interval=checkpoint_interval,
            group_limits=GroupLimits(
                max_lease=max_lease,
                max_member_in_flight=max_member_in_flight,
                member_timeout=member_timeout,
                max_groups=max_groups,
            ),
            metrics_host=metrics_host,
            metrics_token=metrics_token,
            console_port=console_port,
            console_host=console_host,
            console_trusted_proxy=console_trusted_proxy,
            local_socket=local_socket,
            io=io,
        )
    except OSError as e:
        raise click.ClickException(e.strerror or str(e)) from e
    # Tests and scripts read this line to learn the port (with --port 0).
    click.echo(f"hqueue server listening on {instance.address} (storage {instance.engine.url})", err=True)
    if instance.local_socket is not None:
        click.echo(f"and on {instance.local_socket} for local processes (local:// that directory)", err=True)
    sys.stderr.flush()
    instance.serve_forever(on_start=lambda: announce_console(instance.console))


def announce_console(console) -> None:
    """Say where the console is, and its one-time token when there is no auth file (as Jupyter does)."""
    if console is None:
        return
    click.echo(f"hqueue console on {console.url}", err=True)
    if console.login_token:
        click.echo(f"  log in with this one-time token: {console.login_token}", err=True)
    sys.stderr.flush()


def _check_zk_access(zk: str | None, zk_auth: str | None, zk_open: bool, auth_file: str | None) -> None:
    """Tokens with a ZooKeeper anyone may write are no bound: a client could write a
    subscription there and be pushed any queue, or join the servers' party and be sent
    other clients' tokens. So --auth-file with --zk needs --zk-auth, or --zk-open said."""
    if not zk or zk_auth:
        if zk_open:
            raise click.UsageError("--zk-open goes with --zk and without --zk-auth")
        return
    if auth_file and not zk_open:
        raise click.UsageError(
            "--auth-file with --zk needs --zk-auth USER:PASSWORD (or $HQUEUE_ZK_AUTH): a ZooKeeper any host may "
            "write lets a client around the tokens (a subscription written there is pushed any queue; a server "
            "added to the party is sent clients' tokens). If ZooKeeper's network admits only trusted hosts, "
            "say so with --zk-open"
        )
    logging.getLogger(__name__).warning(
        "ZooKeeper %s without --zk-auth: every host that reaches it may change who owns what%s",
        zk,
        " (--zk-open: trusted to ZooKeeper's network)" if auth_file else "",
    )


def _zookeeper(zk: str, auth: str | None, server_id: str | None, session_timeout: float, root_ok: bool = False):
    """What makes the server's ZooKeeper coordinator, once its address is known."""
    from ..coordination.zookeeper import ZooKeeperCoordinator, check_credentials, check_secured

    if auth:  # (before the store is opened; --zk-root is warned of once, by the coordinator)
        check_credentials(auth) if root_ok else check_secured(zk, auth)

    def coordinator_factory(address: str) -> ZooKeeperCoordinator:
        return ZooKeeperCoordinator(
            zk, address, server_id=server_id, session_timeout=session_timeout, auth=auth, root_ok=root_ok
        )

    return coordinator_factory


def _tls(cert: str | None, key: str | None):
    """The server's TLS context (None without --tls-cert and --tls-key)."""
    if not (cert or key):
        return None
    if not (cert and key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except OSError as e:  # (ssl.SSLError among them; a traceback: a key given as the certificate, a file not PEM)
        reason = e if isinstance(e, ssl.SSLError) or not e.strerror else e.strerror
        raise click.BadParameter(
            f"cannot load the certificate {cert!r} with the key {key!r}: {reason}", param_hint="--tls-cert/--tls-key"
        ) from None
    return context


@main.command()
@click.argument("script", type=click.File("r", encoding="utf-8", errors="surrogateescape"), required=False)
@click.option("-e", "commands", multiple=True, metavar="COMMAND", help="Run this command line (repeatable), then exit.")
@click.pass_context
def shell(ctx, script, commands: tuple[str, ...]) -> None:
    """The interactive shell (HBase shell syntax); or run SCRIPT, -e lines, or piped stdin."""
    from ..shell import Shell

    session = Shell(ctx.obj["url"])
    try:
        if commands:
            status = session.run_lines(commands, "-e")
        elif script is not None:
            status = session.run_lines(script, script.name)
        elif not sys.stdin.isatty():  # piped in: run it as a script
            status = session.run_lines(sys.stdin, "<stdin>")
        else:
            status = session.interact()
    finally:
        session.close()
    ctx.exit(status)


@main.command()
@click.option("--messages", "-n", type=click.IntRange(1, 10**9), default=100_000, show_default=True)
@click.pass_context
def demo(ctx, messages: int) -> None:
    """Create a new queue, put messages, scan them back, and report the rates.

    The queue is named demo, or demo-2, demo-3… when that exists: the demo
    never touches an existing queue.
    """
    admin = open_admin(ctx)
    name, n = "demo", 1
    while admin.queue_exists(name):
        n += 1
        name = f"demo-{n}"
    admin.create_queue(name, partitions=8, ttl=86400)
    queue = open_queue(ctx, name)
    started, progress = time.perf_counter(), Progress("messages put")
    for offset in range(0, messages, 1000):
        batch = [Message("crawler", b"http://example.com/%d" % i) for i in range(offset, min(offset + 1000, messages))]
        queue.put(batch)
        progress.add(len(batch))
    progress.done()
    put_seconds = time.perf_counter() - started
    started = time.perf_counter()
    count = sum(1 for _ in queue.scan())
    scan_seconds = time.perf_counter() - started
    click.echo(f"store: {queue.url}, queue: {name} (messages expire after a day)")
    click.echo(f"put  {messages} messages in batches of 1000: {messages / put_seconds:,.0f} msgs/s (fsync per batch)")
    click.echo(f"scan {count} messages over 8 partitions in ID order: {count / scan_seconds:,.0f} msgs/s")
    click.echo(f"try: hqueue scan {name} --limit 5")
