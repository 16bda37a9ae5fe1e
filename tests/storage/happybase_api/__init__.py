"""happybase's own API test suite, vendored, to judge tests/hbase_standin.py by.

``tests/hbase_standin.py`` is a TEST STAND-IN for HBase's Thrift1 gateway, not
HBase. hqueue's HBase backend is only ever tested against it, so the stand-in
is itself checked by someone else's tests: happybase's ``tests/test_api.py``,
which upstream runs against a real HBase Thrift server.
``tests/storage/test_happybase_api.py`` starts a stand-in and runs this suite
against it; the cases it leaves out are listed there, each with its reason.

Where it comes from
    HappyBase 1.3.0 (https://github.com/python-happybase/happybase), the PyPI
    sdist ``happybase-1.3.0.tar.gz`` (sha256
    ``43b6275d2865fc1364680a03f085491cd85d8b84db3c5aa94d25186685dfd87e``),
    file ``tests/test_api.py`` (sha256
    ``b0e63b24bf24ca682967f293cb70c29292979ff54acbb31e39d66f9f5d24b068``),
    25 tests. The 1.2.0 sdist ships no tests. It is pinned: it is the version
    of happybase installed with hqueue's test extra, and a new happybase
    release means vendoring its file again on purpose.

Licence
    MIT, Copyright (c) 2012 Wouter Bolsterlee; the notice is at the top of
    ``upstream.py``.

Every change made to the file (``upstream.py``)
    1. The MIT notice and a pointer to this docstring are added at the top.
    2. ``import six`` and ``from six.moves import range`` are replaced by
       ``from .shim import assert_raises, range, six`` (marked ``hqueue:``).
       ``shim.py`` gives ``assert_raises`` (upstream used nose's without
       importing it) as ``pytest.raises``, ``range`` as the builtin, and
       ``six.iteritems``/``six.binary_type`` as ``dict.items``/``bytes``.
    Nothing else: the host and port come in through the module's own
    ``connection_kwargs`` dict, which the runner fills in before calling the
    module's ``setup_module`` (upstream reads ``HAPPYBASE_HOST`` and
    ``HAPPYBASE_PORT`` from the environment into it at import time).
    The file is named ``upstream.py``, not ``test_*.py``, so pytest collects
    it only through the runner; ruff leaves it as it came (pyproject.toml).
"""
