"""The installed package works wherever pip puts it (the IDL ships inside it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_install_with_target_finds_the_thrift_idl(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, ROOT],
        check=True,
        capture_output=True,
    )
    assert (target / "hqueue" / "rpc" / "thrift" / "hqueue.thrift").is_file()
    # the console's pages and every asset they load ship inside (nothing comes from the internet)
    console = target / "hqueue" / "console"
    for name in ("static/uPlot.iife.min.js", "static/uPlot.min.css", "static/uPlot.LICENSE", "static/console.js",
                 "static/console.css", "templates/base.html", "templates/group.html"):  # fmt: skip
        assert (console / name).is_file(), name
    shipped = {p.name for p in (ROOT / "hqueue" / "console" / "templates").glob("*.html")}
    assert {p.name for p in (console / "templates").glob("*.html")} == shipped
    code = "import hqueue.rpc.wire as w, hqueue; print(hqueue.__file__, w.T.HQueueService.__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(target))


def test_import_hqueue_loads_neither_thrift_nor_kazoo():
    """The embedded API pays for what it uses: the client, the server and ZooKeeper load on demand."""
    code = "import sys, hqueue; print(sorted(m for m in ('thriftpy2', 'kazoo', 'hqueue.server') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_cli_and_a_server_without_a_console_load_no_flask():
    """Flask and waitress cost about 0.1 s to import: only a console pays it."""
    code = (
        "import sys, hqueue.cli, hqueue.server; "
        "print(sorted(m for m in ('flask', 'waitress', 'hqueue.console') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
