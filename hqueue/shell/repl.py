"""The interactive shell, and its script and ``-e`` modes.

Interactive: prompt_toolkit with persistent history (``~/.hqueue_history``,
or ``$HQUEUE_HISTORY``), Tab completion of command names and of queue and
subscriber names inside quotes, Ctrl-C to drop the line, Ctrl-D to leave.

Every command prints its output, then a timing line, as the HBase shell
does. A user error is one ``ERROR: …`` line (with a caret under the column
for a syntax error) and the shell carries on; in script and ``-e`` modes the
first error stops the run with exit status 1.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO

from ..admin import HQueueAdmin
from ..auth import split_credentials
from ..commands import NotAllDone
from ..connection import MAKE_A_STORE, missing_store, resolve_url, store_exists
from ..errors import HQueueError, QueueEnabled
from ..queue import HQueue
from .commands import ALIASES, COMMANDS, Streamed
from .output import timing
from .parser import ShellSyntaxError, parse_line

logger = logging.getLogger(__name__)


class Shell:
    """Runs shell lines against one store or set of servers.

    Args:
        url: ``local:///path``, ``hbase://…`` or ``hqueue://…``; default: the
            embedded store (``$HQUEUE_DATA`` or ``./hqueue-data``).
    """

    def __init__(self, url: str | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.url = url
        self._admin: HQueueAdmin | None = None  # opened by the first command that needs the store
        self._may_make_store = False  # (while a command that may make one, create, runs)
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._queues: dict[str, HQueue] = {}
        self.done = False
        self.count = 0
        self.timers_noted = False  # (the note on timers of a local:// store, said once)

    @property
    def admin(self) -> HQueueAdmin:
        if self._admin is None:
            if not self._may_make_store and not store_exists(self.url):
                raise HQueueError(missing_store(self.url))  # only create makes a store: nothing else leaves one
            self._admin = HQueueAdmin(self.url)
        return self._admin

    def queue(self, name: str) -> HQueue:
        """An open handle on ``name`` (kept for the session)."""
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = self.admin.queue(name)
        return queue

    def execute(self, line: str) -> bool:
        """Run one line; False if it failed (the error is printed)."""
        try:
            call = parse_line(line)
        except ShellSyntaxError as e:
            print(f"ERROR: syntax error: {e}\n{e.pointer()}", file=self.err)
            return False
        if call is None:
            return True
        command = COMMANDS.get(ALIASES.get(call.name, call.name))
        if command is None:
            print(f"ERROR: unknown command {call.name!r}; type help for the list", file=self.err)
            return False
        self.count += 1
        started = time.perf_counter()
        try:
            self._may_make_store = command.name in MAKE_A_STORE and not command.read_only
            text, rows = command(self, call.args)
            if isinstance(text, Streamed):  # printed as it comes: a big scan shows its first rows at once
                for chunk in text:
                    print(chunk, file=self.out, flush=True)
                rows = text.rows
            elif text:
                print(text, file=self.out)
        except KeyboardInterrupt:
            print("interrupted", file=self.err)
            return False
        except (HQueueError, ValueError, TypeError) as e:
            self._forget_closed_queues(e)
            if isinstance(e, NotAllDone) and e.output.text:  # what it did, then what it did not
                print(e.output.text, file=self.out)
            print(f"ERROR: {_with_shell_hint(e)}", file=self.err)
            return False
        except BrokenPipeError:  # the reader went away (`hqueue shell -e "scan 'q'" | head`): stop quietly
            raise
        except Exception as e:  # a bug, not a user error: one line here, the trace in the log
            logger.debug("%s failed", line, exc_info=True)
            print(f"ERROR: internal error: {type(e).__name__}: {e}", file=self.err)
            return False
        if call.name not in ("exit", "quit", "help"):
            print(timing(rows, time.perf_counter() - started), file=self.out)
        return True

    def _forget_closed_queues(self, error: Exception) -> None:
        # A dropped or recreated queue must be opened afresh next time.
        name = getattr(error, "name", None)
        if name in self._queues:
            self._queues.pop(name).close()

    def run_lines(self, lines: Iterable[str], source: str) -> int:
        """Run lines in order; stop at the first error. Returns the exit status."""
        for number, line in enumerate(lines, 1):
            if not self.execute(line.removesuffix("\n").removesuffix("\r")):  # (CRLF on stdin as in a file)
                print(f"stopped at {source}, line {number}", file=self.err)
                return 1
            if self.done:
                break
        return 0

    def interact(self) -> int:
        """The interactive loop, until exit or Ctrl-D."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.shortcuts import CompleteStyle

        history = os.environ.get("HQUEUE_HISTORY", os.path.expanduser("~/.hqueue_history"))
        session: PromptSession = PromptSession(
            history=FileHistory(history),
            completer=ShellCompleter(self),
            complete_style=CompleteStyle.READLINE_LIKE,  # Tab: the common prefix, then the choices (as irb)
        )
        where = split_credentials(resolve_url(self.url, None))[0]  # never the token
        print(f"hqueue shell: {where}\nType help for the commands, exit or Ctrl-D to leave.", file=self.out)
        while not self.done:
            try:
                line = session.prompt(f"hqueue(main):{self.count + 1:03d}:0> ")
            except KeyboardInterrupt:
                continue  # Ctrl-C drops the line
            except EOFError:
                break
            self.execute(line)
        return 0

    def names(self) -> list[str]:
        """Queue and subscriber names, for completion."""
        queues = [info.name for info in self.admin.list_queues()]
        subscribers: list[str] = []
        if self.admin.engine.subscriptions is not None:
            for queue in queues:
                subscribers += self.admin.list_subscribers(queue)
        return sorted(set(queues + subscribers))

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        if self._admin is not None:
            self._admin.close()


try:
    from prompt_toolkit.completion import Completer, Completion
except ImportError:  # pragma: no cover - prompt_toolkit is a dependency
    Completer, Completion = object, None  # type: ignore[misc, assignment]


class ShellCompleter(Completer):  # type: ignore[misc]
    """Command names first; then, inside a quote, queue and subscriber names."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self._names: list[str] = []
        self._loaded = 0.0

    def _cached_names(self) -> list[str]:
        if time.monotonic() - self._loaded > 5:
            try:
                self._names, self._loaded = self.shell.names(), time.monotonic()
            except HQueueError:
                pass
        return self._names

    def get_completions(self, document, complete_event) -> Iterator:
        text = document.text_before_cursor
        if " " not in text.lstrip():
            word = text.lstrip()
            for name in sorted([*COMMANDS, *ALIASES]):
                if name.startswith(word):
                    yield Completion(name, start_position=-len(word))
            return
        quote = max(text.rfind("'"), text.rfind('"'))
        if quote < 0 or text[quote + 1 :].count(text[quote]) or (text[:quote].count(text[quote]) % 2):
            return  # not inside an open quote
        word = text[quote + 1 :]
        for name in self._cached_names():
            if name.startswith(word):
                yield Completion(name + text[quote], start_position=-len(word))


def _with_shell_hint(e: Exception) -> str:
    """The error's text, with the shell command to run where the CLI names its own."""
    if isinstance(e, QueueEnabled):
        return f"queue {e.name!r} is enabled: disable it first (disable_queue '{e.name}'), or pass {{FORCE => true}}"
    return str(e).replace("'partition_id'", "PARTITION", 1)  # (the API's name for it: the shell's is PARTITION)
