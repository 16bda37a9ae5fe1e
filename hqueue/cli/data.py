"""The data commands, in the CLI's own shape: put (arguments or stdin), scan, count, tail (consume: consume.py)."""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from ..batch import partition_batches
from ..checks import check_partition
from ..commands import MAX_DELAY_SECONDS, escape, unescape
from ..commands.queues import LOCAL_TIMERS_NOTE
from ..config import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES
from ..errors import ServerUnavailable
from ..message import Message, MessageID, successor
from ..scanner import Scan
from .main import Progress, Seconds, due_time, main, message_id, open_queue, topic_bytes
from .stream import Lines, Tally, send_lines

#: The longest wait any option takes (ten years), so that inf and 1e308 are range errors.
MAX_SECONDS = MAX_DELAY_SECONDS  # (--delay, --for)


@main.command()
@click.argument("name", metavar="QUEUE")
@click.argument("topic")
@click.argument("values", nargs=-1)
@click.option("--partition", "-p", type=click.IntRange(0, 32766), help="Partition (default: random per batch).")
@click.option("--priority", type=click.IntRange(0, 32766), help="Priority tier, on a queue with tiers (0: lowest).")
@click.option("--key", "-k", help="Route by key (CRC32 mod partitions).")
@click.option(
    "--batch",
    type=click.IntRange(1, MAX_BATCH_MESSAGES),
    default=1000,
    show_default=True,
    help="Lines per put from stdin (each put is atomic; fewer when they pass 16 MiB).",
)
@click.option(
    "--input",
    "input_format",
    type=click.Choice(["lines", "raw", "base64", "hex"]),
    default="lines",
    show_default=True,
    help="stdin: a message per line (bytes as they are), all of it as one message, or a message per encoded line.",
)
@click.option(
    "--linger",
    type=Seconds(0, 3600),
    default=0.1,
    show_default=True,
    help="stdin: send a batch this many seconds after its first line, full or not (0: at once).",
)
@click.option(
    "--delay",
    type=Seconds(0, MAX_SECONDS),
    help="Timer messages: deliver this many seconds from now. On a local:// store a timer fires only while a "
    "process has the store open: serve it with `hqueue server` and put through hqueue:// (docs/timers.md).",
)
@click.option(
    "--at",
    "deliver_at",
    callback=due_time,
    help="Timer messages: deliver at this ISO time (UTC unless it has an offset: 2026-11-23T10:00+01:00) or "
    "epoch ms (on a local:// store: see --delay).",
)
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
    linger: float,
    priority: int | None,
    delay: float | None,
    deliver_at: MessageID | None,
) -> None:
    """Put VALUES (or, with none, stdin: see --input) on TOPIC of queue QUEUE.

    From stdin, lines go in batches of --batch, and a batch that is not full
    goes --linger seconds after its first line (`tail -f log | hqueue put q
    t` is never held back). Ctrl-C sends what was read, and prints how many
    lines were read, stored and not stored (exit status 130).

    With --delay or --at they are timer messages: each line printed is a
    timer handle for `hqueue cancel`, not a message ID (from stdin too). On a local:// store
    a timer fires only while some process has the store open (this command
    exits at once): run `hqueue server --storage local://PATH` and put
    through hqueue://HOST:PORT to have timers fire on time.
    """
    stdin_only = [f"--{o}" for o in ("input", "linger") if _given(ctx, "input_format" if o == "input" else o)]
    if values and stdin_only:  # (ignored before: --input base64 stored the text as it was)
        one = len(stdin_only) == 1
        raise click.UsageError(
            f"{' and '.join(stdin_only)} {'is' if one else 'are'} for stdin: leave {'it' if one else 'them'} out "
            "when VALUES are given"
        )
    queue = open_queue(ctx, name)
    if (delay is not None or deliver_at is not None) and queue.engine.url.startswith("local://"):
        click.echo(f"note: {LOCAL_TIMERS_NOTE}", err=True)
    topic_bytes = unescape(os.fsencode(topic))  # as given, even when it is not UTF-8; read as --topic is
    key_bytes = None if key is None else unescape(os.fsencode(key))  # (read as topics are: topic_bytes)
    due = None if deliver_at is None else deliver_at.timestamp

    def send(chunk: list[bytes]) -> list:
        messages = [Message(topic_bytes, v) for v in chunk]
        return queue.put(messages, partition, key=key_bytes, deliver_at=due, delay=delay, priority=priority)

    timers = delay is not None or deliver_at is not None

    def sent(chunk: list[bytes]) -> int:
        """Put from stdin: a timer's handle printed, as for VALUES (it was not: the timers
        could not be cancelled); a message's ID not (a log piped in is not echoed)."""
        answers = send(chunk)
        if timers:
            click.echo("\n".join(map(str, answers)))
        return len(answers)

    if values:
        for chunk in _chunks((os.fsencode(v) for v in values), batch, len(topic_bytes)):
            for message_id in send(chunk):
                click.echo(str(message_id))
    elif input_format == "raw":
        value = sys.stdin.buffer.read(MAX_BATCH_BYTES + 1)  # never more than a put may carry
        if len(value) > MAX_BATCH_BYTES:
            raise click.ClickException(f"stdin is longer than {MAX_BATCH_BYTES:,} bytes, more than a put may carry")
        sent([value])
        click.echo("put 1 message(s)", err=True)
    else:
        _put_stdin(ctx, sent, input_format, batch, linger, len(topic_bytes))


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line (or its environment), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (
        click.core.ParameterSource.DEFAULT,
        click.core.ParameterSource.DEFAULT_MAP,
    )


def _put_stdin(ctx, put: Callable[[list[bytes]], int], input_format: str, batch: int, linger: float, topic_bytes: int):
    tally = Tally()
    try:
        send_lines(
            Lines(sys.stdin.buffer), put, tally, batch=batch, linger=linger, topic_bytes=topic_bytes,
            decode=None if input_format == "lines" else _decoder(input_format),
        )  # fmt: skip
    except KeyboardInterrupt:
        click.echo(tally.report("interrupted"), err=True)
        ctx.exit(130)
    except Exception:
        click.echo(tally.report("stopped"), err=True)
        raise
    click.echo(f"put {tally.stored} message(s)", err=True)


def _decoder(input_format: str) -> Callable[[bytes, int], bytes]:
    decode: Callable[[str], bytes] = (
        functools.partial(base64.b64decode, validate=True)  # (without, bad characters were dropped)
        if input_format == "base64"
        else bytes.fromhex
    )

    def decoded(line: bytes, number: int) -> bytes:
        try:
            return decode(line.strip().decode("ascii"))
        except (ValueError, UnicodeDecodeError) as e:
            raise click.ClickException(f"stdin line {number} is not {input_format}: {e}") from None

    return decoded


def _chunks(items, size: int, topic_bytes: int = 0) -> Iterator[list[bytes]]:
    """Lists of ``size`` values, cut short before a put of them (each with its
    ``topic_bytes`` topic) would pass a put's byte cap."""
    chunk: list[bytes] = []
    total = 0
    for item in items:
        if chunk and total + len(item) + topic_bytes > MAX_BATCH_BYTES:
            yield chunk
            chunk, total = [], 0
        chunk.append(item)
        total += len(item) + topic_bytes
        if len(chunk) == size:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _range_options(command):
    """QUEUE and the options that choose messages, shared by scan and count."""
    for option in reversed(
        [
            click.argument("name", metavar="QUEUE"),
            click.option("--start", callback=message_id, help="First ID or ISO time (inclusive)."),
            click.option("--stop", callback=message_id, help="ID or ISO time to stop before."),
            click.option(
                "--topic", "-t", "topics", multiple=True, callback=topic_bytes, help="Only this topic; repeatable."
            ),
            click.option("--partition", "-p", type=click.IntRange(0, 32766), help="Only this partition."),
        ]
    ):
        command = option(command)
    return command


@main.command()
@_range_options
@click.option("--limit", "-n", type=click.IntRange(0, 2**63 - 1), help="At most this many messages.")
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
    ctx, name: str, start, stop, topics: tuple[bytes, ...], partition: int | None, limit: int | None, output_format: str
) -> None:
    """Print messages of queue QUEUE: partition, ID, topic, value."""
    queue = open_queue(ctx, name, read_only=True)
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


#: Messages a tail's poll reads a partition at a time.
TAIL_BATCH = 10_000


@main.command()
@click.argument("name", metavar="QUEUE")
@click.option("--start", callback=message_id, help="First ID or ISO time (default: now).")
@click.option("--topic", "-t", "topics", multiple=True, callback=topic_bytes, help="Only this topic; repeatable.")
@click.option("--partition", "-p", type=click.IntRange(0, 32766), help="Only this partition (default: every one).")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "hex", "base64"]), default="text")
@click.option("--interval", type=Seconds(0.01, 3600), default=0.2, show_default=True, help="Seconds between reads.")
@click.option("--for", "duration", type=Seconds(0, MAX_SECONDS), help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--follow", "-f", is_flag=True, help="Follow (what tail always does; for tail -f habits).")
@click.pass_context
def tail(
    ctx,
    name: str,
    start,
    topics: tuple[bytes, ...],
    partition: int | None,
    output_format: str,
    interval: float,
    duration,
    follow,
) -> None:
    """Follow queue QUEUE: print messages as they are written (Ctrl-C to stop).

    Each partition is followed from its own last ID, so a message written to
    one partition after a later-stamped one in another is never skipped.
    The queue deleted and made again meanwhile, it stops (QueueNotFound).
    """
    queue = open_queue(ctx, name, read_only=True)
    info = queue.engine.queue_info(name, fresh=True)  # each poll reads this queue, not one made again since
    followed = range(info.partitions) if partition is None else [check_partition(info, partition)]
    position = {pid: start or MessageID(int(time.time() * 1000)) for pid in followed}
    deadline = None if duration is None else time.monotonic() + duration
    pause = RETRY_FIRST
    try:
        with terminate_as_interrupt():  # (SIGTERM, SIGHUP: as Ctrl-C)
            while deadline is None or time.monotonic() < deadline:
                failed = None
                for pid, since in position.items():
                    try:
                        scan = Scan(since, None, topics or None)
                        for batch in partition_batches(queue.engine, name, pid, scan, TAIL_BATCH, info.created):
                            for message in batch:
                                _print_message(message, output_format)
                            position[pid] = successor(batch.last_id)
                    except ServerUnavailable as e:  # the serving process went: go on where we were, after a pause
                        failed = e
                        break
                sys.stdout.flush()
                if failed is not None:  # (a line each 0.2 s while a server restarted: backing off, as consume)
                    pause = unavailable(failed, "tail", "nothing read", pause, deadline)
                    continue
                pause = RETRY_FIRST
                time.sleep(interval)
    except KeyboardInterrupt:
        ctx.exit(130)  # as a shell reports a command stopped by Ctrl-C


#: Seconds tail and consume wait before they ask again a store that did not answer (doubling to RETRY_MOST).
RETRY_FIRST, RETRY_MOST = 0.5, 5.0


def unavailable(error: ServerUnavailable, command: str, what: str, pause: float, deadline: float | None) -> float:
    """Say that the store did not answer (its server stopped, restarting, a shared store's
    holder paused), wait ``pause`` (not past ``deadline``), and give the next pause: tail and
    consume go on when the store answers again, as a subscriber does; consume ended on the
    first call that outlived its deadline, as the store came back."""
    click.echo(f"hqueue {command}: {what}: {error}; asking again in {pause:g}s", err=True)
    left = pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))
    time.sleep(left)
    return min(pause * 2, RETRY_MOST)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a service manager's stop) and SIGHUP (its terminal closed) end tail and
    consume as Ctrl-C does: a member leaves its group and hands back what it holds, where
    being killed would count those failed (and leave CMD running on a message another
    member gets); a process serving its store to others hands it on cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {  # (one ignored, as nohup does SIGHUP, stays ignored)
        signum: signal.signal(signum, interrupt)
        for signum in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_VALUE_FORMATS: dict[str, Callable[[bytes], str]] = {
    "text": escape,
    "json": escape,
    "hex": bytes.hex,
    "base64": lambda value: base64.b64encode(value).decode("ascii"),
}


def _as_json(message: Message) -> dict:
    """The message as JSON: topic and value as text, or base64 (``…_base64``) when not UTF-8."""
    out: dict = {"partition": message.partition_id, "id": str(message.id)}
    for field, data in (("topic", bytes(message.topic)), ("value", message.value)):
        try:
            out[field] = data.decode("utf-8")
        except UnicodeDecodeError:
            out[f"{field}_base64"] = base64.b64encode(data).decode("ascii")
    return out


@main.command()
@_range_options
@click.pass_context
def count(ctx, name: str, start, stop, topics: tuple[bytes, ...], partition: int | None) -> None:
    """Count the messages of queue QUEUE (it reads them all; progress on a terminal)."""
    queue = open_queue(ctx, name, read_only=True)
    progress = Progress("messages")
    for _ in queue.scan(start, stop, topics or None, partition_id=partition):
        progress.add()
    progress.done()
    click.echo(progress.count)
