"""The shell's own output: the timing line under each command (tables: ``hqueue.commands.render``)."""

from __future__ import annotations


def timing(rows: int | None, seconds: float) -> str:
    """``3 row(s) in 0.0040 seconds`` (or just the time)."""
    if rows is None:
        return f"Took {seconds:.4f} seconds"
    return f"{rows} row(s) in {seconds:.4f} seconds"
