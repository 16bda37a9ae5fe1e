"""What every bench shares: the machine's name, timing, the table and JSON."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime


def machine() -> str:
    """CPU model, cores and memory: the figures mean nothing without them."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"


def timed(fn, *args) -> float:
    """Seconds ``fn(*args)`` takes."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def report(title: str, rows: list[dict], columns: list[str], json_path: str | None) -> None:
    """Print an aligned table; write ``{"machine", "date", "rows"}`` as JSON."""
    header = {"machine": machine(), "date": datetime.now(UTC).isoformat(timespec="seconds"), "title": title}
    print(f"{title}\n{header['machine']} — {header['date']}")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=False)))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(w) for c, w in zip(columns, widths, strict=False)))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=2)
        print(f"wrote {json_path}")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (0.5: the median), the nearest rank."""
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))]


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB, from /proc (the same measure for every server)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    """The machine's load averages (1, 5, 15 min): the figures mean less on a busy machine."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    """``min / median / max`` of several runs."""
    ordered = sorted(values)
    return " / ".join(_fmt(v) for v in (ordered[0], ordered[len(ordered) // 2], ordered[-1]))


def median_pair(runs: int, ours, theirs, loads: list[str], prefix: str) -> list[dict]:
    """``runs`` side-by-side runs, ``ours(workdir)`` (hqueue's) then ``theirs(workdir)``
    (Redis's), each in a temporary directory of its own, removed after it; the machine's
    load after each pair goes to ``loads``. The pair of the median ratio of their
    ``msgs_per_s``, hqueue's row carrying it (``vs_redis``) and the ratios' ``spread``."""
    pairs = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
            mine = ours(workdir)
        with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
            peer = theirs(workdir)
        mine["vs_redis"] = mine["msgs_per_s"] / peer["msgs_per_s"]
        pairs.append((mine, peer))
        loads.append(load())
    mine, peer = sorted(pairs, key=lambda pair: pair[0]["vs_redis"])[len(pairs) // 2]
    mine["ratios"] = spread([pair[0]["vs_redis"] for pair in pairs])
    return [mine, peer]


def redis_client_module():
    """redis-py, refusing to bench without hiredis (the parser production users run), or
    without Debian's redis-server: said before anything runs, not after hqueue's half."""
    if not shutil.which("redis-server"):
        sys.exit("redis-server is not installed: apt-get install redis-server")
    try:
        import redis
        from redis.utils import HIREDIS_AVAILABLE
    except ImportError:
        sys.exit("the redis package is not installed: pip install '.[bench]'")
    if not HIREDIS_AVAILABLE:
        sys.exit("redis-py without hiredis would bench Redis at a handicap: pip install '.[bench]'")
    return redis
