"""Command lines in the HBase shell's syntax.

::

    create 'q1', 32, 86400, {'hbase.hqueue.partitionsPerRegion' => '4'}
    scan 'q1', {LIMIT => 10, TOPICS => ['t1'], STARTTIME => '2026-11-22 10:00'}

A line is a command name and comma-separated arguments. Arguments are
strings ('single' or "double" quoted, with \\n \\t \\xNN \\' \\" \\\\ escapes;
\\xNN is the raw byte NN, kept as a surrogate escape so that encoding with
``surrogateescape`` gives it back),
integers, lists ``[a, b]``, dictionaries ``{key => value}`` (keys may be
bare words, as HBase's ``LIMIT``), and bare words (``true``, ``false``,
``nil``, constants). ``#`` starts a comment.

A syntax error says what was expected and at which column (1-based).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..printed import CONTROL

__all__ = ["Call", "ShellSyntaxError", "parse_line"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NUMBER = re.compile(r"-?([0-9]+)(\.[0-9]+)?")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "nil": None}
#: Lists and dictionaries nest at most this deep; a number has at most this many digits.
MAX_DEPTH, MAX_DIGITS = 16, 40


class ShellSyntaxError(ValueError):
    """A line the shell cannot read; ``column`` is 1-based."""

    def __init__(self, message: str, line: str, column: int) -> None:
        super().__init__(f"{message} at column {column}")
        self.message, self.line, self.column = message, line, column

    def pointer(self) -> str:
        """The line (its control characters escaped: they reached the terminal), and a caret
        under the column."""
        before = self.line[: self.column - 1].translate(CONTROL)
        return f"{self.line.translate(CONTROL)}\n{' ' * len(before)}^"


class Word(str):
    """A bare word: a constant such as ``LIMIT``, distinct from a quoted string."""


@dataclass(frozen=True)
class Call:
    """A parsed line: ``name arg, arg, …``."""

    name: str
    args: list[Any]


class _Reader:
    def __init__(self, line: str) -> None:
        self.line, self.pos, self.depth = line, 0, 0

    def fail(self, message: str, at: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(message, self.line, (self.pos if at is None else at) + 1)

    def skip(self) -> None:
        while self.pos < len(self.line) and self.line[self.pos] in " \t":
            self.pos += 1
        if self.pos < len(self.line) and self.line[self.pos] == "#":
            self.pos = len(self.line)

    def peek(self) -> str:
        self.skip()
        return self.line[self.pos] if self.pos < len(self.line) else ""

    def expect(self, text: str) -> None:
        self.skip()
        if not self.line.startswith(text, self.pos):
            found = self.line[self.pos] if self.pos < len(self.line) else "the end of the line"
            raise self.fail(
                f"expected {text!r}, found {found!r}"
                if self.pos < len(self.line)
                else f"expected {text!r}, found {found}"
            )
        self.pos += len(text)

    def value(self) -> Any:
        char = self.peek()
        if char in ("'", '"'):
            return self.string(char)
        if char in ("[", "{"):
            if self.depth >= MAX_DEPTH:
                raise self.fail(f"lists and dictionaries nest at most {MAX_DEPTH} deep")
            self.depth += 1
            try:
                return self.sequence() if char == "[" else self.mapping()
            finally:
                self.depth -= 1
        match = _NUMBER.match(self.line, self.pos)
        if match:
            digits = len(match.group().lstrip("-")) - (match[2] is not None)
            if digits > MAX_DIGITS:
                raise self.fail(f"a number of {digits} digits (at most {MAX_DIGITS})")
            self.pos = match.end()
            return int(match.group()) if match[2] is None else float(match.group())
        match = _WORD.match(self.line, self.pos)
        if match:
            self.pos = match.end()
            word = match.group()
            return _CONSTANTS[word] if word in _CONSTANTS else Word(word)
        if not char:
            raise self.fail("expected a value, found the end of the line")
        raise self.fail(f"unexpected {char!r}")

    def string(self, quote: str) -> str:
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.line):
            char = self.line[self.pos]
            if char == quote:
                self.pos += 1
                return "".join(out)
            if char == "\\" and self.pos + 1 < len(self.line):
                code = self.line[self.pos + 1]
                if code == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", self.line[self.pos + 2 : self.pos + 4]):
                    byte = int(self.line[self.pos + 2 : self.pos + 4], 16)
                    out.append(chr(byte) if byte < 0x80 else chr(0xDC00 + byte))
                    self.pos += 4
                    continue
                out.append(_ESCAPES.get(code, "\\" + code))
                self.pos += 2
                continue
            out.append(char)
            self.pos += 1
        raise self.fail("unterminated string", at=start)

    def sequence(self) -> list[Any]:
        self.expect("[")
        items: list[Any] = []
        if self.peek() == "]":
            self.pos += 1
            return items
        while True:
            items.append(self.value())
            if self.peek() == ",":
                self.pos += 1
                if self.peek() != "]":  # (a trailing comma, as Ruby takes)
                    continue
            self.expect("]")
            return items

    def mapping(self) -> dict[Any, Any]:
        self.expect("{")
        items: dict[Any, Any] = {}
        if self.peek() == "}":
            self.pos += 1
            return items
        while True:
            self.skip()
            at = self.pos
            key = self.value()
            if isinstance(key, (list, dict)):
                raise self.fail("a dictionary key must be a string or a word", at=at)
            if key in items:
                raise self.fail(f"{key} is given twice", at=at)
            self.expect("=>")
            items[key] = self.value()
            if self.peek() == ",":
                self.pos += 1
                if self.peek() != "}":  # (a trailing comma, as Ruby takes)
                    continue
            self.expect("}")
            return items


def parse_line(line: str) -> Call | None:
    """Parse one line; None for a blank line or a comment.

    Raises:
        ShellSyntaxError: with the column of the problem.
    """
    line = line.removeprefix("\ufeff")  # (a script saved with a byte-order mark)
    reader = _Reader(line)
    if not reader.peek():
        return None
    match = _WORD.match(line, reader.pos)
    if not match:
        raise reader.fail("expected a command name")
    reader.pos = match.end()
    args: list[Any] = []
    if reader.peek():
        while True:
            args.append(reader.value())
            if not reader.peek():
                break
            reader.expect(",")
    return Call(match.group(), args)
