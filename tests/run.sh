#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Python 3.11:
# installs the Debian packages the tests need, a venv with the test extra,
# lints, then runs pytest. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=$(grep -v '^#' tests/debian-packages.txt | xargs || true)
missing=""
for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "installing Debian packages:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check hqueue tests bench
.venv/bin/mypy hqueue
# Several workers, on any number of cores: most tests wait (on a subprocess, a ZooKeeper
# session, a lease) rather than compute. Each worker has its own ZooKeeper and HBase
# stand-in; tests marked xdist_group run on one worker together (--dist loadgroup).
# HQUEUE_TEST_WORKERS=0 runs them all in this process.
.venv/bin/python -m pytest -n "${HQUEUE_TEST_WORKERS:-4}" --dist loadgroup "$@"
