"""The documentation: the site builds with warnings as errors, every example on
every page (and in the README) runs in order, and the README's two commands
are the ones the repository promises.

How a page's examples run is in ``tests/helpers/doc_examples.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.doc_examples import parse
from tests.processes import ROOT, missing, python_env

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]

#: The examples that do not run, and why: keep it short. A new one is a
#: decision, made here as well as on its page.
NOT_RUN = {
    ("README.md", "tests/system/test_docs.py runs it in a copy of the repository"),
    ("README.md", "it is the test suite (.ci/run runs it)"),
    ("index.md", "makes a venv and installs the package; tests/system/test_docs.py checks the README's commands"),
    ("development.md", "writes the site into the repository; tests/system/test_docs.py builds it into a temp dir"),
    ("distributed.md", "needs HBase and ZooKeeper at these addresses"),
    ("distributed.md", "needs a Docker engine"),
}

README_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/hqueue demo",
    "bash tests/run.sh",
]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    # Given the docs and mkdocs.yml (mkdocs and mkdocstrings come with the test extra)
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        missing("mkdocs (pip install -e '.[test]')")
    # When the site is built strictly, into a temp dir
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    # Then it builds: no broken link or anchor, no page outside the nav, no docstring griffe cannot read
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for documented in ("HQueueAdmin", "create_queue", "Consumer", "QueueNotFound"):
        assert documented in reference
    # And the pages load nothing from the network
    for html in (tmp_path / "site").rglob("*.html"):
        assert "cdnjs" not in html.read_text(), html


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_example_of_the_page_runs_in_order(page, tmp_path):
    # Given a page and a directory of its own
    summary = tmp_path / "summary.json"
    workdir = tmp_path / "work"
    workdir.mkdir()
    # When its examples run in order, as a reader would run them
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.doc_examples", str(page), str(workdir), str(summary)],
        cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    # Then each one does what the page says
    assert done.returncode == 0, f"{done.stderr[-6000:]}\n--- stdout ---\n{done.stdout[-2000:]}"
    ran = json.loads(summary.read_text())
    code = [b for b in parse(page) if b.kind not in ("text", "not run")]
    assert sum(ran["ran"].values()) == len(code)


def test_the_examples_that_do_not_run_are_few_and_say_why():
    # Given every block marked <!-- not run: REASON -->
    marked = [(b.page, b.not_run) for page in PAGES for b in parse(page) if b.not_run is not None]
    # Then each gives a reason, and the list is the one agreed above
    assert all(reason for _, reason in marked)
    assert set(marked) == NOT_RUN, "a block was marked not run (or unmarked): update NOT_RUN deliberately"
    assert len(marked) == len(NOT_RUN)
    # And every other code block runs: python, console and bash blocks are all run
    counts: dict[str, int] = {}
    for page in PAGES:
        for block in parse(page):
            counts[block.kind] = counts.get(block.kind, 0) + 1
    assert counts["python"] >= 15 and counts["console"] >= 15, counts


def test_the_readme_is_short_and_keeps_its_two_commands():
    # Given the README
    readme = (ROOT / "README.md").read_text()
    blocks = parse(ROOT / "README.md")
    # Then it is short: what hqueue is, the two commands, a tour, links
    assert len(readme.splitlines()) <= 100
    # And its first two blocks are the repository's two commands, verbatim
    commands = [[line for line in b.text.splitlines() if not line.startswith("#")] for b in blocks[:2]]
    assert commands == [[README_COMMANDS[0]], [README_COMMANDS[1]]]
    # And .ci/run runs the second
    assert README_COMMANDS[1] in (ROOT / ".ci" / "run").read_text()
    # And every page it links to exists
    for link in ("docs/index.md", "docs/python-api.md", "docs/SPEC.md", "docs/ARCHITECTURE.md"):
        assert f"]({link})" in readme and (ROOT / link).is_file()


def test_a_failing_example_fails_its_page(tmp_path):
    # Given a page whose console example shows output the command does not print,
    # and one whose Python example raises
    wrong_output = tmp_path / "wrong.md"
    wrong_output.write_text("```console\n$ hqueue --version\nhqueue, version 99\n```\n")
    raising = tmp_path / "raising.md"
    raising.write_text("Text.\n\n```python\nx = 1\n```\n\n```python\nraise ValueError(x)\n```\n")
    for page, says in ((wrong_output, "where the page shows"), (raising, "raising.md:7")):
        workdir = tmp_path / page.stem
        workdir.mkdir()
        # When its examples run
        done = subprocess.run(
            [sys.executable, "-m", "tests.helpers.doc_examples", str(page), str(workdir)],
            cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # Then the page fails, naming where
        assert done.returncode == 1
        assert says in done.stderr


@pytest.mark.slow
def test_the_readme_first_command_works_in_a_fresh_copy(tmp_path):
    # Given a copy of the repository as committed or staged (no venv)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    if not files or files == [""]:
        pytest.skip("not a git checkout")
    copy = tmp_path / "hqueue"
    for file in filter(None, files):
        source, target = ROOT / file, copy / file
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))  # hqueue/rpc/thrift links to thrift/
        elif source.is_file():
            shutil.copy2(source, target)
    # When the README's first command runs there, verbatim
    done = subprocess.run(
        ["bash", "-c", README_COMMANDS[0]], cwd=copy, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    # Then it installs hqueue and its demo puts and scans 100,000 messages
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "100,000" in done.stdout or "100000" in done.stdout, done.stdout
