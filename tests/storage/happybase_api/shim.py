"""What happybase's vendored test module (``upstream.py``) imports, without ``six`` or nose.

Upstream, ``test_api.py`` imports ``six`` (for ``six.iteritems``, ``six.binary_type``
and ``six.moves.range``) and calls nose's ``assert_raises`` without importing it.
On Python 3 each has a plain equivalent, given here so that hqueue needs neither.
"""

from __future__ import annotations

import builtins
from types import SimpleNamespace

import pytest

#: nose's ``assert_raises`` used as a context manager: ``pytest.raises`` does the same.
assert_raises = pytest.raises

#: ``six.moves.range`` is Python 3's ``range``.
range = builtins.range

#: The two names of ``six`` the suite uses, as Python 3 spells them.
six = SimpleNamespace(iteritems=dict.items, binary_type=bytes)

__all__ = ["assert_raises", "range", "six"]
