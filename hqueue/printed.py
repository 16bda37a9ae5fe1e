"""How bytes are printed as one line of text, and read back: every front end (the CLI,
the shell, the console) prints a topic, a key or a value so, and reads a topic or key
given so, and a topic copied from one names the same bytes in the others."""

from __future__ import annotations

import re

#: Every control character as \xNN (tab, newline and CR have their own names in ``escape``);
#: as the \xNN of their UTF-8 bytes: the C1 controls and the line and paragraph separators
#: (line breaks to ``str.splitlines`` and to many terminals), and the characters that reorder
#: or hide what is shown (bidirectional marks, embeddings, overrides and isolates, U+200B and
#: U+FEFF: a name shown one way, and named another). ZWJ and ZWNJ stay, as scripts and emoji need them.
_HIDDEN = [0x061C, 0x200B, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF]
CONTROL = {
    **{c: f"\\x{c:02x}" for c in [*range(32), 127]},
    **{c: "".join(f"\\x{b:02x}" for b in chr(c).encode()) for c in [*range(0x80, 0xA0), 0x2028, 0x2029, *_HIDDEN]},
}
_NAMED = {ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
#: :data:`CONTROL` without tab, newline and CR: text shown with its lines.
_LINES = {c: text for c, text in CONTROL.items() if c not in _NAMED}
_ESCAPED_CHARS = {**CONTROL, **_NAMED}


def escape(data: bytes) -> str:
    """Bytes as one line of text, reversibly: UTF-8, with ``\\\\``, ``\\t``, ``\\n``, ``\\r``
    and ``\\xNN`` for every other control byte and every byte that is not UTF-8.

    The same on a terminal and in a pipe: nothing is dropped, nothing goes out raw.
    """
    return _decoded(data).translate(_ESCAPED_CHARS)


def as_text(data: bytes) -> str:
    """Bytes as text, its lines kept: UTF-8, a backslash doubled, ``\\xNN`` for every byte
    that is not UTF-8 and every control character but tab, newline and CR (:func:`escape`
    without those three escaped: a value a page shows whole; a NUL went into the page raw)."""
    return _decoded(data).translate(_LINES)


def _decoded(data: bytes) -> str:
    """UTF-8, a backslash doubled, ``\\xNN`` for every byte that is not UTF-8."""
    return data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


#: What :func:`escape` writes, read back: ``\\``, ``\t``, ``\n``, ``\r``, ``\xNN``.
_ESCAPED = re.compile(rb"\\(?:x([0-9A-Fa-f]{2})|([\\tnr]))")
_NAMED_BYTES = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r"}


def unescape(data: bytes) -> bytes:
    """What :func:`escape` printed, as the bytes it printed: a topic or key copied from
    ``scan``'s output, the console's or the shell's, names the same bytes in every front
    end. Any other backslash stays as it is."""
    return _ESCAPED.sub(lambda m: bytes.fromhex(m[1].decode()) if m[1] else _NAMED_BYTES[m[2]], data)
