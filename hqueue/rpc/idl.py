"""The Thrift IDL files in ``thrift/``, loaded at run time with thriftpy2.

Nothing is generated: thriftpy2 builds the modules from the ``.thrift`` text.
The files ship inside the package (``hqueue/rpc/thrift`` links to the
repository's ``thrift/``), so every kind of install finds them.
"""

from __future__ import annotations

import functools
import io
from importlib import resources
from types import ModuleType

import thriftpy2


@functools.cache
def load(name: str) -> ModuleType:
    """The thriftpy2 module for ``thrift/<name>`` (loaded once per process)."""
    text = resources.files(__package__).joinpath("thrift", name).read_text("utf-8")
    module_name = name.replace(".thrift", "") + "_thrift"
    return thriftpy2.load_fp(io.StringIO(text), module_name=module_name)
