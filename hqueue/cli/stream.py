"""``hqueue put`` from stdin as it streams (``tail -f log | hqueue put q t``).

Lines are sent in batches: a batch goes when it is full (``--batch`` lines,
or a put's byte cap), when input ends, or ``--linger`` seconds after its
first line was read, so a slow stream is never held back. On Ctrl-C what was
read is sent, and the count of lines read, stored and not stored is printed:
nothing is dropped silently. A Ctrl-C while a put is under way waits for
that put; a second one cuts it short, and its lines are counted apart, as
stored or not.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from ..config import MAX_BATCH_BYTES
from ..errors import MessageTooLarge, OutcomeUnknown

#: Bytes read from stdin at a time.
CHUNK = 1 << 16
#: The longest line read: no longer one can be put (a put carries at most
#: MAX_BATCH_BYTES of values; a hex line is twice its value).
MAX_LINE = 2 * MAX_BATCH_BYTES + 2


class LineTooLong(MessageTooLarge):
    """A line of stdin longer than any message a put may carry: reading stops there."""


class Lines:
    """The lines of a stream as they come: :meth:`read` waits at most ``timeout``
    when the stream is a pipe, a terminal or a file (anything ``select`` takes)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        try:
            self.fd: int | None = stream.fileno() if os.name == "posix" else None
        except (OSError, AttributeError, ValueError):  # a stream in memory (tests), or closed
            self.fd = None
        self.partial = bytearray()
        self.eof = False

    def read(self, timeout: float | None, interrupts: Interrupts | None = None) -> list[bytes]:
        """The lines that came within ``timeout`` seconds (None: wait for some), without
        their newline; [] when none did. At the end, a last line without a newline comes too.

        Ctrl-C (``interrupts``) breaks the wait only: never a read, so no byte read is lost.
        """
        if self.fd is not None:
            if interrupts is not None:
                interrupts.waiting = True
            try:
                ready, _, _ = select.select([self.fd], [], [], timeout)
            finally:
                if interrupts is not None:
                    interrupts.waiting = False
            if not ready:
                return []
            data = os.read(self.fd, CHUNK)
        else:
            data = self.stream.read1(CHUNK) if hasattr(self.stream, "read1") else self.stream.read(CHUNK)
        if not data:
            self.eof = True
            last, self.partial = bytes(self.partial), bytearray()
            return [last] if last else []
        if b"\n" not in data:  # a long line in pieces: no split of what came before
            self.partial += data
            if len(self.partial) > MAX_LINE:
                raise LineTooLong(
                    f"a line of stdin is longer than {MAX_LINE:,} bytes, more than a put may carry: "
                    "reading stopped there (one message of all stdin: --input raw)"
                )
            return []
        *lines, rest = (bytes(self.partial) + data).split(b"\n")
        self.partial = bytearray(rest)
        return lines


@dataclass
class Tally:
    """What became of the lines read."""

    read: int = 0
    stored: int = 0
    #: Lines of a put a second Ctrl-C (or a lost answer) cut short: stored or not.
    unknown: int = 0
    #: Bytes of a last line without its newline when Ctrl-C came (not sent: it may be cut).
    unfinished: int = 0

    @property
    def not_stored(self) -> int:
        return self.read - self.stored - self.unknown

    def report(self, why: str) -> str:
        text = f"hqueue put: {why}: read {self.read:,} line(s), stored {self.stored:,}, not stored {self.not_stored:,}"
        if self.unknown:
            text += f"; {self.unknown:,} in a put cut short, stored or not (look with hqueue scan)"
        if self.unfinished:
            text += f"; an unfinished last line of {self.unfinished:,} byte(s) not sent"
        return text


class Interrupts:
    """SIGINT (or SIGTERM) while :func:`send_lines` runs: raised at once while it waits for input;
    otherwise counted, and acted on once the read or put under way is done (a second
    one during a put cuts it short)."""

    def __init__(self) -> None:
        self.count = 0
        self.in_put = False
        self.waiting = False

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.waiting or (self.in_put and self.count > 1):
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach the main thread only: nothing to hold back
            return
        previous = signal.signal(signal.SIGINT, self.handle)
        previous_term = signal.signal(signal.SIGTERM, self.handle)  # (a service manager's stop: as Ctrl-C)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, previous_term)


def send_lines(
    lines: Lines,
    put: Callable[[list[bytes]], int],
    tally: Tally,
    *,
    batch: int,
    linger: float,
    topic_bytes: int = 0,
    decode: Callable[[bytes, int], bytes] | None = None,
) -> None:
    """Read ``lines`` to the end and ``put`` them in batches (see the module's doc),
    counting in ``tally``. ``decode(line, number)`` turns a line into a value.

    Raises:
        KeyboardInterrupt: after what was read is sent (Ctrl-C).
        HQueueError: a put failed; ``tally`` says what was stored before.
    """
    interrupts = Interrupts()
    pending: list[bytes] = []
    size = 0
    first_at = 0.0

    def flush() -> None:
        nonlocal pending, size
        if not pending:
            return
        values, pending, size = pending, [], 0
        interrupts.in_put = True
        try:
            stored = put(values)
        except (KeyboardInterrupt, OutcomeUnknown):
            tally.unknown += len(values)
            raise
        finally:
            interrupts.in_put = False
        tally.stored += stored
        if interrupts.count:  # Ctrl-C came during the put: it is done, now stop
            raise KeyboardInterrupt

    with interrupts.installed():
        try:
            while not lines.eof:
                wait = None if not pending else max(0.0, first_at + linger - time.monotonic())
                for line in lines.read(wait, interrupts):
                    tally.read += 1
                    value = decode(line, tally.read) if decode else line
                    if pending and size + len(value) + topic_bytes > MAX_BATCH_BYTES:
                        flush()
                    if not pending:
                        first_at = time.monotonic()
                    pending.append(value)
                    size += len(value) + topic_bytes
                    if len(pending) >= batch:
                        flush()
                if interrupts.count:
                    raise KeyboardInterrupt
                if pending and time.monotonic() >= first_at + linger:
                    flush()
            flush()
        except KeyboardInterrupt:
            tally.unfinished = len(lines.partial)
            flush()  # what was read goes; a second Ctrl-C cuts this put short too
            raise
        except LineTooLong:
            flush()  # the whole lines before it go
            raise
