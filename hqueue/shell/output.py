"""How the shell prints: aligned tables, printable values, timing lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(32), 127]}


def printable(value: Any, limit: int = 200) -> str:
    """Bytes as UTF-8 text; invalid bytes and control characters as \\xNN; cut at ``limit``."""
    if isinstance(value, bytes):
        text = value[:limit].decode("utf-8", "backslashreplace").translate(_CONTROL)
        return text + ("…" if len(value) > limit else "")
    if value is None:
        return ""
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], widths: list[int] | None = None) -> str:
    """Columns padded to their widest cell, as the HBase shell prints.

    ``widths``, when given, carries column widths from one part of a long
    table to the next: it is widened in place, never narrowed.
    """
    cells = [[printable(c) for c in row] for row in rows]
    widest = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    if widths is None:
        widths = widest
    else:
        widths[:] = [max(a, b) for a, b in zip(widths or widest, widest, strict=True)]
    lines = [" ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


#: The columns of a consumer group's pending messages (the CLI's and the shell's ``pending``).
PENDING_COLUMNS = ["PARTITION", "ID", "MEMBER", "ATTEMPT", "LEASE LEFT (S)", "RETRY IN (S)"]


def pending_rows(pending: Sequence[Any]) -> list[tuple[Any, ...]]:
    """:meth:`HQueue.pending <hqueue.HQueue.pending>`'s answer as table rows."""

    def seconds(value: float | None) -> str:
        return "" if value is None else f"{value:.1f}"

    return [
        (p.partition_id, str(p.id), p.member or "(waiting)", p.attempt, seconds(p.lease_left), seconds(p.retry_in))
        for p in pending
    ]


def timing(rows: int | None, seconds: float) -> str:
    """``3 row(s) in 0.0040 seconds`` (or just the time)."""
    if rows is None:
        return f"Took {seconds:.4f} seconds"
    return f"{rows} row(s) in {seconds:.4f} seconds"
