"""The floor under a single durable put: what one fsync'd write costs on this disk.

Usage:
    python bench/fsync_floor.py [--writes 2000] [--dir DIR] [--json out.json]

Four ways of making 120 bytes durable, one at a time, ``--writes`` each, in a
temporary directory under ``--dir`` (the disk the stores would use):

* ``append + fdatasync``: what Redis's AOF does with ``appendfsync always``
  (the file grows, so each sync also writes the file's size);
* ``overwrite + fdatasync``: the same into a preallocated file (no size to write);
* ``RocksDB sync write``: ``Rdict.put`` with ``sync=True``, hqueue's SYNC_WAL
  write on the embedded store, after 5 rounds of as many writes, each ended by
  a memtable flush (so that with recycling, the WAL is a recycled file);
* ``RocksDB sync write, WAL recycled``: the same with ``recycle_log_file_num=4``,
  which hqueue does **not** set (docs/benchmarks.md says why).

p50 and p99 in µs. Redis's single-put p50 at ``always`` is the first row plus
its per-call work; hqueue's is the third plus its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import rocksdict

sys.path.insert(0, os.path.dirname(__file__))

from common import report  # noqa: E402

RECORD = b"x" * 120


def latencies(write: Callable[[int], object], count: int) -> dict[str, float]:
    taken = []
    for i in range(count):
        start = time.perf_counter()
        write(i)
        taken.append(time.perf_counter() - start)
    taken.sort()
    return {"p50_us": round(taken[count // 2] * 1e6), "p99_us": round(taken[int(count * 0.99)] * 1e6)}


def appended(path: str, count: int) -> dict[str, float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return latencies(lambda i: (os.write(fd, RECORD), os.fdatasync(fd)), count)
    finally:
        os.close(fd)


def overwritten(path: str, count: int) -> dict[str, float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, len(RECORD) * count)
        os.fsync(fd)
        return latencies(lambda i: (os.pwrite(fd, RECORD, i * len(RECORD)), os.fdatasync(fd)), count)
    finally:
        os.close(fd)


def rocksdb(path: str, count: int, recycle: int) -> dict[str, float]:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    if recycle:
        options.set_recycle_log_file_num(recycle)
    db = rocksdict.Rdict(path, options)
    sync = rocksdict.WriteOptions()
    sync.sync = True
    try:
        # Each flush starts a new WAL; with recycling, one of the old ones, which a write
        # overwrites with no change of size only while it stays within the old file's length:
        # so the rounds write as much as the measure will.
        for round_ in range(5):
            for i in range(count):
                db.put(b"warm%d-%d" % (round_, i), RECORD, sync)
            db.flush(True)
        return latencies(lambda i: db.put(b"k%d" % i, RECORD, sync), count)
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--dir", default=None, help="where the files go (default: the system's temp dir)")
    parser.add_argument("--json")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="hqueue-fsync-", dir=args.dir)
    try:
        results = {
            "append + fdatasync (Redis AOF, always)": appended(f"{work}/aof", args.writes),
            "overwrite + fdatasync (preallocated)": overwritten(f"{work}/pre", args.writes),
            "RocksDB sync write (hqueue SYNC_WAL)": rocksdb(f"{work}/db", args.writes, 0),
            "RocksDB sync write, WAL recycled (not used)": rocksdb(f"{work}/recycled", args.writes, 4),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"write": name, **figures} for name, figures in results.items()]
    report("one durable write of 120 bytes at a time", rows, ["write", "p50_us", "p99_us"], args.json)


if __name__ == "__main__":
    main()
