"""The commands the CLI and the shell share, declared once (see ``declare.py``).

``COMMANDS`` holds them all; ``hqueue/cli/`` and ``hqueue/shell/`` build
their own commands from it, so the two cannot drift: the same names, the
same argument order (the queue first), the same defaults.
"""

from . import consumers, queues  # noqa: F401  (they declare the commands)
from .declare import (
    COMMANDS,
    MAX_DELAY_SECONDS,
    REQUIRED,
    Command,
    NotAllDone,
    Output,
    Param,
    Session,
    as_delay,
    as_due,
    as_time,
    find,
)
from .render import escape, json_ready, printable, stamp, table, unescape

__all__ = [
    "COMMANDS",
    "MAX_DELAY_SECONDS",
    "REQUIRED",
    "Command",
    "NotAllDone",
    "Output",
    "Param",
    "Session",
    "as_delay",
    "as_due",
    "as_time",
    "escape",
    "find",
    "json_ready",
    "printable",
    "stamp",
    "table",
    "unescape",
]
