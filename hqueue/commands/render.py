"""How both front ends print: escaped values, aligned tables, the rows of a listing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..message import MessageID
from ..printed import CONTROL, escape, unescape

__all__ = ["escape", "json_ready", "printable", "stamp", "table", "unescape"]


def printable(value: Any, limit: int = 200) -> str:
    """A table cell: bytes escaped as the CLI prints them (:func:`escape`), cut at ``limit``;
    other values as text, control characters as \\xNN."""
    if isinstance(value, bytes):
        return escape(value[:limit]) + ("…" if len(value) > limit else "")
    if value is None:
        return ""
    return str(value).translate(CONTROL)


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


def stamp(message_id: MessageID) -> str:
    """An ID's time, ISO 8601 in UTC, to the millisecond."""
    try:
        return message_id.datetime.isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):  # past what datetime holds (year 9999)
        return f"epoch ms {message_id.timestamp}"


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def json_ready(value: Any) -> Any:
    """A command's data for ``json.dumps``: IDs as ``millis:seq``, bytes escaped, sets sorted."""
    if isinstance(value, MessageID):
        return str(value)
    if isinstance(value, bytes):
        return escape(value)
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int)) else str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(json_ready(v) for v in value)
    return value
