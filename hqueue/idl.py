"""The Thrift IDL files in ``thrift/``, loaded at run time with thriftpy2.

Nothing is generated: thriftpy2 builds the modules from the ``.thrift`` text.
In a source checkout the files are read from ``thrift/`` beside the package;
an installed hqueue finds them under ``<prefix>/share/hqueue/thrift``.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from types import ModuleType

import thriftpy2


def idl_path(name: str) -> Path:
    """The path of ``thrift/<name>``.

    Raises:
        FileNotFoundError: the file is in neither place.
    """
    candidates = [
        Path(__file__).resolve().parent.parent / "thrift" / name,
        Path(sys.prefix) / "share" / "hqueue" / "thrift" / name,
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"Thrift IDL {name!r} not found in {', '.join(map(os.fspath, candidates))}")


@functools.cache
def load(name: str) -> ModuleType:
    """The thriftpy2 module for ``thrift/<name>`` (loaded once per process)."""
    module_name = name.replace(".thrift", "") + "_thrift"
    return thriftpy2.load(os.fspath(idl_path(name)), module_name=module_name)
