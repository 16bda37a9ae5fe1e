"""The hqueue shell (SPEC C8): HBase-shell syntax over HQueueAdmin and HQueue."""

from .parser import Call, ShellSyntaxError, parse_line
from .repl import Shell

__all__ = ["Call", "Shell", "ShellSyntaxError", "parse_line"]
