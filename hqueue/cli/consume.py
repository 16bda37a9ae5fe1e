"""``hqueue consume``: read a queue as a member of a consumer group, from the command line.

Each message is printed, then acked; or, with ``--exec CMD``, handed to a
command (the value on its stdin, the rest in ``$HQUEUE_*``) and acked when
the command exits 0, nacked when it does not: it comes back after a backoff
(or ``--nack-delay``), and goes to ``QUEUE.dlq`` after the group's retries.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click

from ..commands.render import escape
from ..consumer import Consumer, Delivery
from ..errors import ServerUnavailable
from .data import MAX_SECONDS, RETRY_FIRST, _print_message, terminate_as_interrupt, unavailable
from .main import Seconds, main, open_queue, topic_bytes


@main.command()
@click.argument("name", metavar="QUEUE")
@click.argument("group")
@click.option(
    "--topic",
    "-t",
    "topics",
    multiple=True,
    callback=topic_bytes,
    help="Only this topic; repeatable. A new group takes these topics; an existing one must be given its own.",
)
@click.option("--format", "output_format", type=click.Choice(["text", "json", "hex", "base64"]), default="text")
@click.option("--max", "max_messages", type=click.IntRange(1), help="Stop after this many messages.")
@click.option("--for", "duration", type=Seconds(0, MAX_SECONDS), help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--lease", type=Seconds(0.001, 7 * 86400), default=30.0, show_default=True, help="Seconds per lease.")
@click.option(
    "--no-ack", is_flag=True, help="Print without acking: the messages go back to the group when consume leaves it."
)
@click.option(
    "--start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a new group starts (an existing one goes on from where it is).",
)
@click.option(
    "--exec",
    "command",
    metavar="CMD",
    help="Run CMD (a shell command) per message, the value on its stdin and $HQUEUE_QUEUE, _GROUP, _PARTITION, "
    "_ID, _TOPIC, _ATTEMPT set: exit 0 acks it, any other status nacks it.",
)
@click.option(
    "--nack-delay",
    type=Seconds(0, 7 * 86400),
    help="With --exec: seconds before a nacked message comes back (default: 1 s, doubling per failure).",
)
@click.option(
    "--prefetch",
    is_flag=True,
    help="Through a server: ask for the next batch while this one is printed or run (its leases run from then).",
)
@click.pass_context
def consume(
    ctx, name, group, topics, output_format, max_messages, duration, lease, no_ack, start, command, nack_delay, prefetch
):
    """Consume queue QUEUE as a member of consumer GROUP: print each message, then ack it.

    Members of one group share the messages; each group gets all of them.
    Text lines are: partition, ID, attempt, topic, value.

    With --exec CMD each message goes to CMD instead of stdout, one at a
    time: exit status 0 acks it, any other nacks it (it comes back, and
    after the group's retries goes to QUEUE.dlq). A line on stderr says
    each nack.
    """
    if command is not None and no_ack:
        raise click.UsageError("--exec acks or nacks each message: leave out --no-ack")
    if command is None and nack_delay is not None:
        raise click.UsageError("--nack-delay is for what --exec nacks: give --exec, or leave it out")
    queue = open_queue(ctx, name)
    deadline = None if duration is None else time.monotonic() + duration
    seen, interrupted, pause = 0, False, RETRY_FIRST
    opened = queue.consumer(group, topics or None, start=start, lease=lease, prefetch=prefetch)
    with terminate_as_interrupt(), opened as consumer:
        try:
            while (deadline is None or time.monotonic() < deadline) and (max_messages is None or seen < max_messages):
                wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
                # With --exec one at a time: a lease runs from its receipt, not from when CMD starts.
                want = 1 if command else 100 if max_messages is None else min(100, max_messages - seen)
                try:
                    deliveries = consumer.receive(want, wait=wait)
                except ServerUnavailable as e:  # (a long stop of the store's server: it goes on after)
                    pause = unavailable(e, "consume", "no messages received", pause, deadline)
                    continue
                try:
                    if command:
                        for delivery in deliveries:
                            with _renewing(consumer, delivery, consumer.granted_lease):
                                _run(consumer, delivery, command, nack_delay)
                    else:
                        for delivery in deliveries:
                            _print_message(delivery.message, output_format, delivery.attempt)
                        sys.stdout.flush()
                        if deliveries and not no_ack:
                            consumer.ack(deliveries)
                except ServerUnavailable as e:
                    why = "an ack or nack may not have counted: its message comes back when its lease ends"
                    pause = unavailable(e, "consume", why, pause, deadline)
                else:
                    pause = RETRY_FIRST
                seen += len(deliveries)
        except KeyboardInterrupt:
            interrupted = True  # leaving the group hands what it holds back (the message in hand too)
    if interrupted:
        ctx.exit(130)


#: Seconds an interrupted command's processes have to end on SIGTERM before SIGKILL.
STOP_GRACE = 5.0


def _command_status(command: str, value: bytes, env: dict) -> int:
    """Run CMD with the message on its stdin; its exit status. CMD stays in this process's
    group, the terminal's job (a prompt on /dev/tty works; Ctrl-C and a hang-up reach it).
    Interrupted meanwhile (Ctrl-C, SIGTERM, SIGHUP), CMD and everything it started are
    stopped before the message goes back to the group: SIGTERM, then SIGKILL after
    STOP_GRACE (only the shell was killed, and what it started worked on a message another
    member had by then)."""
    process = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)  # noqa: S602
    try:
        process.communicate(value)
    except BaseException:
        _stop_tree(process)
        raise
    return process.returncode


def _stop_tree(process: subprocess.Popen) -> None:
    """End ``process`` and its descendants (SIGTERM, then SIGKILL), and reap it."""
    tree = [process.pid, *_descendants(process.pid)]  # (before any dies: its children would go to init)
    _signal(tree, signal.SIGTERM)
    try:
        deadline = time.monotonic() + STOP_GRACE
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE)
        while any(_alive(pid) for pid in tree[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:  # (a second Ctrl-C meanwhile: killed at once; only those still there: a pid is reused)
        left = [pid for pid in tree[1:] if _alive(pid)]
        _signal([process.pid, *left, *(p for pid in left for p in _descendants(pid))], signal.SIGKILL)
        process.wait()


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (from /proc: none where there is none)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            stat = _stat(int(entry)) if entry.isdigit() else []
            if len(stat) > 1:  # (none: gone meanwhile)
                children.setdefault(int(stat[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return bool(stat) and stat[0] != b"Z"  # (a zombie is done)


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command's name (its state, its parent, …);
    [] where there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


@contextmanager
def _renewing(consumer: Consumer, delivery: Delivery, lease: float) -> Iterator[None]:
    """Renew ``delivery``'s lease (the one the store granted) every third of it while CMD
    runs: a command longer than its lease ran twice (the lease asked, past the server's
    --max-lease, was cut to it without a word, and the message went to another member meanwhile)."""
    stop, every = threading.Event(), lease / 3

    def renew() -> None:
        while not stop.wait(every):
            try:
                if not consumer.extend(delivery, lease=lease):
                    return  # (its lease ran out already: another member may have it)
            except ServerUnavailable as e:  # (asked again at the next third; it may run out meanwhile)
                click.echo(
                    f"hqueue consume: renewing the lease of {delivery.partition_id}/{delivery.id}: {e}", err=True
                )

    renewer = threading.Thread(target=renew, name="hqueue-consume-renew", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()


def _run(consumer: Consumer, delivery: Delivery, command: str, nack_delay: float | None) -> None:
    """CMD on one message: ack on exit 0, nack otherwise."""
    given = {
        "HQUEUE_QUEUE": consumer.queue.name, "HQUEUE_GROUP": consumer.group,
        "HQUEUE_PARTITION": str(delivery.partition_id), "HQUEUE_ID": str(delivery.id),
        "HQUEUE_ATTEMPT": str(delivery.attempt),
    }  # fmt: skip
    topic = bytes(delivery.topic)
    if b"\0" in topic:  # no environment variable holds a NUL: the topic as the CLI prints it
        topic = escape(topic).encode()
    env: dict = {**os.environ, **given, "HQUEUE_TOPIC": topic.decode("utf-8", "replace")}
    if os.name == "posix":  # the topic's bytes as they are, even when they are not UTF-8
        env = {**os.environb, **{k.encode(): v.encode() for k, v in given.items()}, b"HQUEUE_TOPIC": topic}
    sys.stdout.flush()
    status = _command_status(command, delivery.value, env)
    if status == 0:
        consumer.ack(delivery)
        return
    consumer.nack(delivery, delay=nack_delay)
    why = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    click.echo(f"hqueue consume: nacked {delivery.partition_id}/{delivery.id} (attempt {delivery.attempt}): "
               f"{why}", err=True)  # fmt: skip
