"""The ``hqueue`` command line (click).

``main.py`` holds the group and what every command shares; ``shared.py``
makes the commands the shell has too, from ``hqueue/commands/``; ``data.py``
has put, scan, count, tail and consume; ``process.py`` server, shell and demo.
"""

from . import data, process, shared  # noqa: F401  (they add their commands to main)
from .main import main

__all__ = ["main"]
