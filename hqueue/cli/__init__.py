"""The ``hqueue`` command line (click).

``main.py`` holds the group and what every command shares; ``shared.py``
makes the commands the shell has too, from ``hqueue/commands/``; ``data.py``
has put (``stream.py``: from stdin), scan, count and tail; ``consume.py`` consume;
``process.py`` server, shell and demo; ``console.py`` the web console.
"""

from . import console, consume, data, process, shared  # noqa: F401  (they add their commands to main)
from .main import main

__all__ = ["main"]
