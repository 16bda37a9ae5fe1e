"""TEST STAND-IN — NOT HBASE. A subset of HBase's filter language for tests/hbase_standin.py.

``TScan.filterString`` is parsed as HBase's ``ParseFilter`` reads it:
filters joined by ``AND``/``OR``, grouped by parentheses, ``SKIP`` before one;
arguments are quoted bytes (``''`` is a quote), integers, ``true``/``false``,
compare operators (``<``, ``<=``, ``=``, ``!=``, ``>=``, ``>``) and comparators
(``binary:``, ``binaryprefix:``, ``substring:``, ``regexstring:``). The filters:
``KeyOnlyFilter``, ``FirstKeyOnlyFilter``, ``PrefixFilter``, ``ColumnPrefixFilter``,
``MultipleColumnPrefixFilter``, ``RowFilter``, ``FamilyFilter``, ``QualifierFilter``,
``ValueFilter`` and ``SingleColumnValueFilter`` (``filterIfMissing`` false
unless given: a row without the column passes, as in HBase).

A filter the stand-in lacks (``PageFilter``, ``WHILE``, ...) or a string that
does not parse raises ``ValueError``: the call answers with a Thrift
``INTERNAL_ERROR``, as HBase's Thrift1 server answers an
``IllegalArgumentException`` from ``ParseFilter``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

#: ``(row, [(column, versions), ...]) -> the cells kept``; no cells kept drops the row.
Filter = Callable[[bytes, list], list]

_TOKEN = re.compile(rb"\s*(?:('(?:[^']|'')*')|(<=|>=|!=|<|>|=)|([(),])|(-?\d+)|([A-Za-z_][A-Za-z0-9_]*))")
_OPS = {
    b"<": operator.lt,
    b"<=": operator.le,
    b"=": operator.eq,
    b"!=": operator.ne,
    b">=": operator.ge,
    b">": operator.gt,
}


class _Op(bytes):
    """A compare operator among the arguments."""


def _tokens(text: bytes) -> list:
    tokens, at = [], 0
    while text[at:].strip():
        match = _TOKEN.match(text, at)
        if match is None:
            raise ValueError(f"filter string: cannot parse at {text[at:]!r}")
        quoted, op, punct, number, word = match.groups()
        if quoted is not None:
            tokens.append(("arg", quoted[1:-1].replace(b"''", b"'")))
        elif op is not None:
            tokens.append(("arg", _Op(op)))
        elif number is not None:
            tokens.append(("arg", int(number)))
        elif punct is not None:
            tokens.append((punct.decode(), punct))
        else:
            tokens.append(("word", word))
        at = match.end()
    return tokens


def _comparator(op: bytes, spec: bytes) -> Callable[[bytes], bool]:
    kind, _, value = spec.partition(b":")
    compare = _OPS[op]
    if kind == b"binary":
        return lambda b: compare(b, value)
    if kind == b"binaryprefix":
        return lambda b: compare(b[: len(value)], value)
    if kind in (b"substring", b"regexstring") and op in (b"=", b"!="):
        found = (lambda b: value.lower() in b.lower()) if kind == b"substring" else re.compile(value).search
        return lambda b: compare(bool(found(b)), True)
    raise ValueError(f"filter string: comparator {spec!r} with {op!r} not supported")


def _cells_where(test: Callable[[bytes, bytes, bytes], bool]) -> Filter:
    return lambda row, cells: [(c, v) for c, v in cells if test(row, c, v[0][1])]


def _single_column_value(family, qualifier, op, spec, if_missing=False, latest_only=True) -> Filter:
    column, matches = family + b":" + qualifier, _comparator(op, spec)

    def keep(row, cells):
        versions = dict(cells).get(column)
        if versions is None:
            return [] if if_missing else cells
        return cells if matches(versions[0][1]) else []

    return keep


def _simple(name: bytes, args: list) -> Filter:
    if name == b"KeyOnlyFilter":
        return lambda row, cells: [(c, [(t, b"") for t, _ in v]) for c, v in cells]
    if name == b"FirstKeyOnlyFilter":
        return lambda row, cells: cells[:1]
    if name == b"PrefixFilter":
        return lambda row, cells: cells if row.startswith(args[0]) else []
    if name in (b"ColumnPrefixFilter", b"MultipleColumnPrefixFilter"):
        return _cells_where(lambda row, c, v: c.partition(b":")[2].startswith(tuple(args)))
    compare_on = {
        b"RowFilter": lambda row, c, v: row,
        b"FamilyFilter": lambda row, c, v: c.partition(b":")[0],
        b"QualifierFilter": lambda row, c, v: c.partition(b":")[2],
        b"ValueFilter": lambda row, c, v: v,
    }
    if name in compare_on:
        part, matches = compare_on[name], _comparator(*args)
        return _cells_where(lambda row, c, v: matches(part(row, c, v)))
    if name == b"SingleColumnValueFilter":
        return _single_column_value(*args)
    raise ValueError(f"filter string: {name.decode(errors='replace')} is not implemented by the HBase stand-in")


class _Parser:
    def __init__(self, text: bytes) -> None:
        self.tokens, self.at = _tokens(text), 0

    def _peek(self, kind: str, word: bytes | None = None) -> bool:
        if self.at >= len(self.tokens):
            return False
        k, v = self.tokens[self.at]
        return k == kind and (word is None or v.upper() == word)

    def _take(self, kind: str):
        if not self._peek(kind):
            raise ValueError(f"filter string: expected {kind} at token {self.at}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def parse(self) -> Filter:
        found = self._or()
        if self.at != len(self.tokens):
            raise ValueError(f"filter string: unexpected token {self.tokens[self.at][1]!r}")
        return found

    def _or(self) -> Filter:
        parts = [self._and()]
        while self._peek("word", b"OR"):
            self.at += 1
            parts.append(self._and())
        if len(parts) == 1:
            return parts[0]

        def any_of(row, cells):
            kept = {c for part in parts for c, _ in part(row, cells)}
            return [(c, v) for c, v in cells if c in kept]

        return any_of

    def _and(self) -> Filter:
        parts = [self._unary()]
        while self._peek("word", b"AND"):
            self.at += 1
            parts.append(self._unary())

        def all_of(row, cells):
            for part in parts:
                cells = part(row, cells)
            return cells

        return parts[0] if len(parts) == 1 else all_of

    def _unary(self) -> Filter:
        if self._peek("word", b"SKIP"):
            self.at += 1
            inner = self._unary()
            return lambda row, cells: cells if len(inner(row, cells)) == len(cells) else []
        if self._peek("word", b"WHILE"):
            raise ValueError("filter string: WHILE is not implemented by the HBase stand-in")
        if self._peek("("):
            self.at += 1
            inner = self._or()
            self._take(")")
            return inner
        name, args = self._take("word"), []
        self._take("(")
        while not self._peek(")"):
            if args:
                self._take(",")
            args.append(self._take("word").lower() == b"true" if self._peek("word") else self._take("arg"))
        self._take(")")
        return _simple(name, args)


def parse_filter(text: bytes | str | None) -> Filter | None:
    """The filter ``text`` names (None: no filter)."""
    if not text:
        return None
    return _Parser(text.encode() if isinstance(text, str) else text).parse()
