"""The ``hqueue`` command line (click)."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import click

from . import __version__
from .admin import HQueueAdmin
from .config import Durability
from .connection import resolve_url
from .errors import HQueueError, NotAuthorized, QueueDisabled, QueueEnabled
from .message import Message, MessageID, successor
from .queue import HQueue
from .storage import default_url, normalize_url


class _Group(click.Group):
    """Turns hqueue's own errors into one readable line and exit status 1.

    ``--url`` may also follow the command (``hqueue scan q --url …``): it is
    moved in front before parsing.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = list(args)
        command_at = next((i for i, a in enumerate(args) if a in self.commands), None)
        if command_at is not None:
            i = command_at + 1
            while i < len(args):
                if args[i] == "--url" and i + 1 < len(args):
                    moved = args[i : i + 2]
                    del args[i : i + 2]
                    args[0:0] = moved
                    command_at += 2
                    i += 2
                elif args[i].startswith("--url="):
                    args.insert(0, args.pop(i))
                    command_at += 1
                    i += 1
                elif args[i] == "--":
                    break
                else:
                    i += 1
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (HQueueError, ValueError, TypeError) as e:
            raise click.ClickException(_with_cli_hint(e)) from e


def _with_cli_hint(e: Exception) -> str:
    """The error's text, with the command to run where the library names a Python call."""
    if isinstance(e, QueueDisabled):
        return f"queue {e.name!r} is disabled (enable it: hqueue enable {e.name})"
    if isinstance(e, QueueEnabled):
        return f"queue {e.name!r} is enabled: disable it first (hqueue disable {e.name}), or pass --force"
    if isinstance(e, NotAuthorized):
        return f"{e} (set $HQUEUE_TOKEN, or use --url hqueue://TOKEN@host:port)"
    return str(e)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="hqueue")
@click.option(
    "--url",
    envvar="HQUEUE_URL",
    help="Store: local:///path (default ./hqueue-data or $HQUEUE_DATA), hbase://host:9090, "
    "or hqueue://[TOKEN@]host:9700 servers. May also follow the command.",
)
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """hqueue: a partitioned, persistent message queue."""
    ctx.obj = {"url": url}


def _admin(ctx: click.Context, read_only: bool = False) -> HQueueAdmin:
    if read_only:
        _store_must_exist(ctx.obj["url"])
    return ctx.with_resource(HQueueAdmin(ctx.obj["url"]))


def _queue(ctx: click.Context, name: str, read_only: bool = False) -> HQueue:
    if read_only:
        _store_must_exist(ctx.obj["url"])
    return ctx.with_resource(HQueue(name, ctx.obj["url"]))


def _store_must_exist(url: str | None) -> None:
    """A read-only command never creates an embedded store where none is."""
    resolved = resolve_url(url, None)
    if not resolved.startswith(("hqueue://", "hbase://")):
        path = normalize_url(resolved)[len("local://") :]
        if not os.path.isdir(path):
            raise click.ClickException(f"no hqueue store at {path} (pass --url, or create a queue there first)")


class _Progress:
    """Counts on stderr, every 2 s, when stderr is a terminal."""

    def __init__(self, what: str) -> None:
        self.what, self.count = what, 0
        self.shown = time.monotonic()
        self.live = sys.stderr.isatty()

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.live and time.monotonic() - self.shown >= 2.0:
            self.shown = time.monotonic()
            click.echo(f"\r{self.count:,} {self.what}…", err=True, nl=False)

    def done(self) -> None:
        if self.live and self.count:
            click.echo("\r" + " " * 40 + "\r", err=True, nl=False)


def _message_id(ctx, param, value: str | None) -> MessageID | None:
    if value is None:
        return None
    try:
        return MessageID.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@main.command()
@click.argument("name")
@click.argument("partitions", type=int)
@click.argument("ttl", type=int, default=0)
@click.option("--durability", type=click.Choice(Durability.ALL), default=Durability.SYNC_WAL, show_default=True)
@click.option("--config", "-c", multiple=True, metavar="KEY=VALUE", help="Extra queue setting; repeatable.")
@click.pass_context
def create(ctx, name: str, partitions: int, ttl: int, durability: str, config: tuple[str, ...]) -> None:
    """Create queue NAME with PARTITIONS partitions and a TTL in seconds (0 = forever)."""
    settings = dict(item.split("=", 1) for item in config if "=" in item)
    if len(settings) != len(config):
        raise click.BadParameter("use KEY=VALUE", param_hint="--config")
    info = _admin(ctx).create_queue(name, partitions, ttl, settings, durability=durability)
    click.echo(f"created queue {info.name!r}: {info.partitions} partitions, ttl {info.ttl}s, {info.durability}")


@main.command(name="list")
@click.pass_context
def list_(ctx) -> None:
    """List queues."""
    for info in _admin(ctx, read_only=True).list_queues():
        click.echo(f"{info.name}\t{info.partitions} partitions\tttl {info.ttl}s\t{info.state}\t{info.durability}")


@main.command()
@click.argument("name")
@click.pass_context
def describe(ctx, name: str) -> None:
    """Describe queue NAME as JSON."""
    description = _admin(ctx, read_only=True).describe_queue(name)
    description["last_ids"] = {pid: str(i) if i else None for pid, i in description["last_ids"].items()}
    click.echo(json.dumps(description, indent=2))


@main.command()
@click.argument("name")
@click.argument("topic")
@click.argument("values", nargs=-1)
@click.option("--partition", "-p", type=int, help="Partition (default: random per batch).")
@click.option("--key", "-k", help="Route by key (CRC32 mod partitions).")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True, help="Lines per put from stdin.")
@click.option(
    "--input",
    "input_format",
    type=click.Choice(["lines", "raw", "base64", "hex"]),
    default="lines",
    show_default=True,
    help="stdin: a message per line (bytes as they are), all of it as one message, or a message per encoded line.",
)
@click.option("--delay", type=click.FloatRange(0), help="Timer messages: deliver this many seconds from now.")
@click.option("--at", "deliver_at", callback=_message_id, help="Timer messages: deliver at this ISO time or epoch ms.")
@click.pass_context
def put(
    ctx,
    name: str,
    topic: str,
    values: tuple[str, ...],
    partition: int | None,
    key: str | None,
    batch: int,
    input_format: str,
    delay: float | None,
    deliver_at: MessageID | None,
) -> None:
    """Put VALUES (or, with none, stdin: see --input) on TOPIC of queue NAME.

    With --delay or --at they are timer messages: each line printed is a
    timer handle for `hqueue cancel`, not a message ID.
    """
    queue = _queue(ctx, name)
    total = 0
    source = (v.encode() for v in values) if values else _stdin_values(input_format)
    due = None if deliver_at is None else deliver_at.timestamp
    for chunk in _chunks(source, batch):
        ids = queue.put([Message(topic, v) for v in chunk], partition, key=key, deliver_at=due, delay=delay)
        total += len(ids)
        if values:
            for message_id in ids:
                click.echo(str(message_id))
    if not values:
        click.echo(f"put {total} message(s)", err=True)


def _stdin_values(input_format: str) -> Iterator[bytes]:
    stdin = sys.stdin.buffer
    if input_format == "raw":
        yield stdin.read()
        return
    decode: Callable[[str], bytes] = {"base64": base64.b64decode, "hex": bytes.fromhex}.get(input_format, str.encode)
    for number, line in enumerate(stdin, 1):
        line = line.rstrip(b"\n")
        if input_format == "lines":
            yield line
            continue
        try:
            yield decode(line.strip().decode("ascii"))
        except (ValueError, UnicodeDecodeError) as e:
            raise click.ClickException(f"stdin line {number} is not {input_format}: {e}") from None


def _chunks(items, size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _range_options(command):
    """NAME and the options that choose messages, shared by scan and count."""
    for option in reversed(
        [
            click.argument("name"),
            click.option("--start", callback=_message_id, help="First ID or ISO time (inclusive)."),
            click.option("--stop", callback=_message_id, help="ID or ISO time to stop before."),
            click.option("--topic", "-t", "topics", multiple=True, help="Only this topic; repeatable."),
            click.option("--partition", "-p", type=int, help="Only this partition."),
        ]
    ):
        command = option(command)
    return command


@main.command()
@_range_options
@click.option("--limit", "-n", type=click.IntRange(0), help="At most this many messages.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "hex", "base64"]),
    default="text",
    show_default=True,
    help="text: tab-separated, with \\t \\n \\\\ and \\xNN escapes; json: one object per line; "
    "hex/base64: the value encoded (binary-safe).",
)
@click.pass_context
def scan(
    ctx, name: str, start, stop, topics: tuple[str, ...], partition: int | None, limit: int | None, output_format: str
) -> None:
    """Print messages of queue NAME: partition, ID, topic, value."""
    queue = _queue(ctx, name, read_only=True)
    for message in queue.scan(start, stop, topics or None, partition_id=partition, limit=limit):
        _print_message(message, output_format)


def _print_message(message: Message, output_format: str, attempt: int | None = None) -> None:
    """One line: partition, ID, (a group delivery's attempt,) topic, value; or a JSON object."""
    extra = {} if attempt is None else {"attempt": attempt}
    if output_format == "json":
        click.echo(json.dumps({**_as_json(message), **extra}))
    else:
        value = _VALUE_FORMATS[output_format](message.value)
        fields = [message.partition_id, message.id, *extra.values(), escape(message.topic), value]
        click.echo("\t".join(map(str, fields)))


@main.command()
@click.argument("name")
@click.option("--start", callback=_message_id, help="First ID or ISO time (default: now).")
@click.option("--topic", "-t", "topics", multiple=True, help="Only this topic; repeatable.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "hex", "base64"]), default="text")
@click.option("--interval", type=click.FloatRange(0.01), default=0.2, show_default=True, help="Seconds between reads.")
@click.option("--for", "duration", type=click.FloatRange(0), help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--follow", "-f", is_flag=True, help="Follow (what tail always does; for tail -f habits).")
@click.pass_context
def tail(ctx, name: str, start, topics: tuple[str, ...], output_format: str, interval: float, duration, follow) -> None:
    """Follow queue NAME: print messages as they are written (Ctrl-C to stop).

    Each partition is followed from its own last ID, so a message written to
    one partition after a later-stamped one in another is never skipped.
    """
    queue = _queue(ctx, name, read_only=True)
    position = {pid: start or MessageID(int(time.time() * 1000)) for pid in range(queue.partitions)}
    deadline = None if duration is None else time.monotonic() + duration
    try:
        while deadline is None or time.monotonic() < deadline:
            for pid, since in position.items():
                for batch in queue.scan_batches(since, None, topics or None, partition_id=pid):
                    for message in batch:
                        _print_message(message, output_format)
                    position[pid] = successor(batch.last_id)
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def escape(data: bytes) -> str:
    """Bytes as one line of text: UTF-8, with backslash escapes for the rest."""
    text = data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


_VALUE_FORMATS: dict[str, Callable[[bytes], str]] = {
    "text": escape,
    "json": escape,
    "hex": bytes.hex,
    "base64": lambda value: base64.b64encode(value).decode("ascii"),
}


def _as_json(message: Message) -> dict:
    out = {"partition": message.partition_id, "id": str(message.id), "topic": escape(message.topic)}
    try:
        out["value"] = message.value.decode("utf-8")
    except UnicodeDecodeError:
        out["value_base64"] = base64.b64encode(message.value).decode("ascii")
    return out


@main.command()
@_range_options
@click.pass_context
def count(ctx, name: str, start, stop, topics: tuple[str, ...], partition: int | None) -> None:
    """Count the messages of queue NAME (it reads them all; progress on a terminal)."""
    queue = _queue(ctx, name, read_only=True)
    progress = _Progress("messages")
    for _ in queue.scan(start, stop, topics or None, partition_id=partition):
        progress.add()
    progress.done()
    click.echo(progress.count)


@main.command()
@click.argument("name")
@click.argument("timers", nargs=-1, required=True)
@click.pass_context
def cancel(ctx, name: str, timers: tuple[str, ...]) -> None:
    """Cancel pending timer messages of queue NAME (handles as `hqueue put --delay` printed them)."""
    queue = _queue(ctx, name)
    for handle in timers:
        click.echo(f"{handle}\t{'cancelled' if queue.cancel(handle) else 'not pending (fired or cancelled already)'}")


@main.command()
@click.argument("name")
@click.argument("group")
@click.option("--topic", "-t", "topics", multiple=True, help="Only this topic (when the group is new); repeatable.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "hex", "base64"]), default="text")
@click.option("--max", "max_messages", type=click.IntRange(1), help="Stop after this many messages.")
@click.option("--for", "duration", type=click.FloatRange(0), help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--lease", type=click.FloatRange(0.001), default=30.0, show_default=True, help="Seconds per lease.")
@click.option("--no-ack", is_flag=True, help="Print without acking: the messages come back when their leases end.")
@click.option("--start", type=click.Choice(["earliest", "latest"]), default="earliest", show_default=True)
@click.pass_context
def consume(ctx, name, group, topics, output_format, max_messages, duration, lease, no_ack, start) -> None:
    """Consume queue NAME as a member of consumer GROUP: print each message, then ack it.

    Members of one group share the messages; each group gets all of them.
    Text lines are: partition, ID, attempt, topic, value.
    """
    queue = _queue(ctx, name)
    deadline = None if duration is None else time.monotonic() + duration
    seen = 0
    with queue.consumer(group, topics or None, start=start, lease=lease) as consumer:
        try:
            while (deadline is None or time.monotonic() < deadline) and (max_messages is None or seen < max_messages):
                wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
                want = 100 if max_messages is None else min(100, max_messages - seen)
                deliveries = consumer.receive(want, wait=wait)
                for delivery in deliveries:
                    _print_message(delivery.message, output_format, delivery.attempt)
                sys.stdout.flush()
                if deliveries and not no_ack:
                    consumer.ack(deliveries)
                seen += len(deliveries)
        except KeyboardInterrupt:
            pass


@main.command()
@click.argument("name")
@click.pass_context
def groups(ctx, name: str) -> None:
    """List the consumer groups of queue NAME."""
    for group in _admin(ctx).list_groups(name):
        click.echo(group)


@main.command(name="describe-group")
@click.argument("name")
@click.argument("group")
@click.pass_context
def describe_group(ctx, name: str, group: str) -> None:
    """Consumer GROUP of queue NAME: members, cursors, in flight, retries, lag, dead letters (JSON)."""
    click.echo(json.dumps(group_description(_admin(ctx).describe_group(name, group)), indent=2))


def group_description(d: dict) -> dict:
    """describe_group's answer in JSON terms."""
    partitions = {pid: {**p, "done": str(p["done"]), "scan": str(p["scan"])} for pid, p in d["partitions"].items()}
    topics = sorted(escape(t) for t in d["topics"]) if d["topics"] is not None else None
    return {**d, "topics": topics, "partitions": partitions}


@main.command()
@click.argument("name")
@click.argument("group")
@click.option("--limit", "-n", type=click.IntRange(1, 10_000), default=1000, show_default=True)
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def pending(ctx, name: str, group: str, limit: int, output_format: str) -> None:
    """Messages consumer GROUP of queue NAME has handed out and not finished: who holds each,
    its attempt, and the seconds its lease has left (or before it goes out again)."""
    from .shell.output import PENDING_COLUMNS, pending_rows, table  # the shell's table, without its REPL

    found = _queue(ctx, name, read_only=True).pending(group, limit=limit)
    if output_format == "json":
        click.echo(json.dumps([{**p._asdict(), "id": str(p.id)} for p in found], indent=2))
    else:
        click.echo(table(PENDING_COLUMNS, pending_rows(found)))


@main.command(name="replay-group")
@click.argument("name")
@click.argument("group")
@click.option("--from", "start", callback=_message_id, required=True, help="ID or ISO time to take messages from.")
@click.option("--partition", "-p", type=int, help="Only this partition (default: all).")
@click.pass_context
def replay_group(ctx, name: str, group: str, start, partition: int | None) -> None:
    """Replay consumer GROUP of queue NAME from a time (or skip ahead to it)."""
    _admin(ctx).set_group_position(name, group, partition, start)
    which = "every partition" if partition is None else f"partition {partition}"
    click.echo(f"group {group!r} of {name!r} takes {which} from {start}")


@main.command(name="replay-dlq")
@click.argument("name")
@click.option("--start", callback=_message_id, help="First dead letter to replay: ID or ISO time (inclusive).")
@click.option("--stop", callback=_message_id, help="Dead letter ID or ISO time to stop before.")
@click.pass_context
def replay_dlq(ctx, name: str, start, stop) -> None:
    """Put the dead letters of NAME (the queue NAME.dlq) back on NAME; they stay in NAME.dlq."""
    count = _admin(ctx).replay_dead_letters(name, start, stop)
    click.echo(f"replayed {count} message(s) from {name}.dlq onto {name!r} (truncate {name}.dlq when done)")


@main.command()
@click.argument("name")
@click.pass_context
def truncate(ctx, name: str) -> None:
    """Delete every message of NAME; keep the queue."""
    _admin(ctx).truncate_queue(name)
    click.echo(f"truncated {name!r}")


@main.command()
@click.argument("name")
@click.pass_context
def disable(ctx, name: str) -> None:
    """Disable NAME: puts and scans are refused."""
    _admin(ctx).disable_queue(name)
    click.echo(f"disabled {name!r}")


@main.command()
@click.argument("name")
@click.pass_context
def enable(ctx, name: str) -> None:
    """Enable NAME again."""
    _admin(ctx).enable_queue(name)
    click.echo(f"enabled {name!r}")


@main.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Disable the queue first if it is enabled.")
@click.pass_context
def drop(ctx, name: str, force: bool) -> None:
    """Delete queue NAME and its messages (it must be disabled, or use --force)."""
    _admin(ctx).delete_queue(name, force=force)
    click.echo(f"dropped {name!r}")


@main.command()
@click.option("--storage", help="Store URL (default: --url, or local://./hqueue-data).")
@click.option("--zk", help="ZooKeeper host:port[,host:port][/chroot]; without it this server owns every partition.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=9700, show_default=True, help="0 picks a free port.")
@click.option("--advertise", help="host:port clients should use (default: host:port).")
@click.option("--id", "server_id", help="This server's name in ZooKeeper (default: the advertised address).")
@click.option("--session-timeout", type=float, default=10.0, show_default=True, help="ZooKeeper session timeout (s).")
@click.option(
    "--idle-timeout", type=float, default=60.0, show_default=True, help="Close remote scanners idle this long (s)."
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
@click.option("--max-connections", type=click.IntRange(1), default=1024, show_default=True)
@click.option(
    "--connection-idle-timeout", type=float, default=300.0, show_default=True, help="Close idle connections (s)."
)
@click.option("--max-frame-bytes", type=click.IntRange(1024), default=64 * 1024 * 1024, show_default=True)
@click.option("--max-partitions", type=click.IntRange(1, 32767), default=1024, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve Prometheus metrics on this port.")
@click.option("--log-level", envvar="HQUEUE_LOG_LEVEL", default="INFO", show_default=True)
@click.pass_context
def server(
    ctx,
    storage,
    zk,
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
    connection_idle_timeout,
    max_frame_bytes,
    max_partitions,
    metrics_port,
    log_level,
) -> None:
    """Serve queues over Thrift (framed transport, binary protocol)."""
    import logging

    from .auth import AuthPolicy, PushPolicy
    from .rpc.threaded import ServerLimits
    from .server import HQueueServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    coordinator_factory = None
    if zk:
        from .coordination.zookeeper import ZooKeeperCoordinator

        def coordinator_factory(address: str):
            return ZooKeeperCoordinator(zk, address, server_id=server_id, session_timeout=session_timeout)

    url = storage or ctx.obj["url"] or default_url()
    ssl_context = None
    if tls_cert or tls_key:
        if not (tls_cert and tls_key):
            raise click.UsageError("--tls-cert and --tls-key go together")
        import ssl

        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(tls_cert, tls_key)
    limits = ServerLimits(
        max_connections=max_connections,
        idle_timeout=connection_idle_timeout or None,
        max_frame_bytes=max_frame_bytes,
    )
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
            metrics_port=metrics_port,
        )
    except OSError as e:
        raise click.ClickException(e.strerror or str(e)) from e
    # Tests and scripts read this line to learn the port (with --port 0).
    click.echo(f"hqueue server listening on {instance.address} (storage {instance.engine.url})", err=True)
    sys.stderr.flush()
    instance.serve_forever()


@main.command()
@click.argument("script", type=click.File("r"), required=False)
@click.option("-e", "commands", multiple=True, metavar="COMMAND", help="Run this command line (repeatable), then exit.")
@click.pass_context
def shell(ctx, script, commands: tuple[str, ...]) -> None:
    """The interactive shell (HBase shell syntax); or run SCRIPT, -e lines, or piped stdin."""
    from .shell import Shell

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
@click.option("--messages", "-n", type=click.IntRange(1), default=100_000, show_default=True)
@click.pass_context
def demo(ctx, messages: int) -> None:
    """Create a new queue, put messages, scan them back, and report the rates.

    The queue is named demo, or demo-2, demo-3… when that exists: the demo
    never touches an existing queue.
    """
    admin = _admin(ctx)
    name, n = "demo", 1
    while admin.queue_exists(name):
        n += 1
        name = f"demo-{n}"
    admin.create_queue(name, partitions=8, ttl=86400)
    queue = _queue(ctx, name)
    started, progress = time.perf_counter(), _Progress("messages put")
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


if __name__ == "__main__":  # pragma: no cover
    main()
