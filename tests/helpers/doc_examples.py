"""Runs the code examples of a documentation page, in order, as a reader would.

``python -m tests.helpers.doc_examples PAGE.md WORKDIR [SUMMARY.json]`` runs
every example of one page in ``WORKDIR`` (the page's own store and files),
and exits 1 at the first that fails, naming its page and line. What runs:

- ```` ```python ```` blocks, in one namespace per page (``WORKDIR`` is the
  current directory and on ``sys.path``);
- ```` ```console ```` blocks: each ``$ command`` line (a trailing ``\\``
  continues it) runs with ``bash`` and the venv's ``hqueue`` first on
  ``PATH``, and must exit 0. Lines after a command are its expected output
  (stdout and stderr), where ``...`` matches anything; output that starts
  with ``Error:`` or ``ERROR:`` means the command must fail. A ``$ hqueue
  server …`` line starts the server in the background (the runner waits
  until it listens, and stops it when the page is done);
- ```` ```bash ```` blocks: the whole block, as one ``bash -e`` script;
- a block of the shell's transcripts (lines starting ``hqueue(main):001:0> ``):
  each command runs as ``hqueue shell -e COMMAND``, checked as a console
  command, except that timings (``0.0031 seconds``) may differ and more
  lines may follow what the transcript shows;
- a block right after ``<!-- file: NAME -->`` is written to ``WORKDIR/NAME``
  instead (a config file, a module a later example imports).

A block right after ``<!-- not run: REASON -->`` is skipped and listed with
its reason. Other blocks (```` ```text ````, diagrams) are not code.

The ports ``9700`` and ``9701`` in a page's examples stand for two free
ports the runner picks, so that examples can name a fixed address while the
tests share a machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<kind>not run|file):\s*(?P<value>.*?)\s*-->\s*$")
SHELL_PROMPT = re.compile(r"^hqueue\(main\):\d+:\d+> (?P<command>.*)$")
TIMING = re.compile(r"\b\d+\.\d+ seconds\b")
COMMAND_TIMEOUT = 120
PORTS = ("9700", "9701")


@dataclass
class Block:
    """One fenced block of a page."""

    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None = None  # the reason given
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        """python, console, bash, shell (a transcript), file, not run, or text."""
        if self.not_run is not None:
            return "not run"
        if self.file is not None:
            return "file"
        if self.lang == "python":
            return "python"
        if self.lang == "console":
            return "console"
        if self.lang in ("bash", "sh", "shell"):
            return "bash"
        if any(SHELL_PROMPT.match(line) for line in self.text.splitlines()):
            return "shell"
        return "text"


def parse(path: Path, page: str | None = None) -> list[Block]:
    """The fenced blocks of a Markdown page, with the directive before each."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    directive: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            found = DIRECTIVE.match(lines[i])
            if found:
                directive = (found["kind"], found["value"])
            elif lines[i].strip():
                directive = None
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        block = Block(page or path.name, i - len(body), opening["lang"].lower(), "\n".join(body) + "\n")
        if directive and directive[0] == "not run":
            block.not_run = directive[1]
        elif directive:
            block.file = directive[1]
        blocks.append(block)
        directive = None
        i += 1
    return blocks


class ExampleFailed(Exception):
    """An example did not do what its page says."""


def free_ports(count: int) -> list[int]:
    """``count`` different free ports (each held until all are picked: the kernel may
    hand a port just let go to the next bind)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def commands(text: str, prompt: re.Pattern[str] | None = None) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block or a shell transcript."""
    pairs: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        found = prompt.match(line) if prompt else re.match(r"^\$ (?P<command>.*)$", line)
        if found:
            command = found["command"]
            while prompt is None and command.endswith("\\"):
                command += "\n" + next(lines, "")
            pairs.append((command, []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(command, "\n".join(output).rstrip()) for command, output in pairs]


def matches(expected: str, actual: str) -> bool:
    """Whether output matches what the page shows: ``...`` matches anything."""
    lines = [line.rstrip() for line in actual.rstrip().splitlines()]
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, "\n".join(lines), re.DOTALL) is not None


class Page:
    """The run of one page: its namespace, its directory, its servers."""

    def __init__(self, path: Path, workdir: Path) -> None:
        self.path, self.workdir = path, workdir
        self.ports = {port: str(real) for port, real in zip(PORTS, free_ports(len(PORTS)), strict=True)}
        self.namespace: dict = {"__name__": "__main__"}
        self.servers: list[tuple[subprocess.Popen, Path]] = []
        bin_dir = str(Path(sys.executable).parent)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HQUEUE_")}
        self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "")
        self.ran: dict[str, int] = {}
        self.not_run: list[dict] = []

    def text(self, block: Block) -> str:
        """The block's code, with the example ports standing for free ones."""
        code = block.text
        for port, real in self.ports.items():
            code = re.sub(rf"\b{port}\b", real, code)
        return code

    def run(self, blocks: list[Block]) -> None:
        os.chdir(self.workdir)
        sys.path.insert(0, str(self.workdir))
        try:
            for block in blocks:
                kind = block.kind
                if kind == "not run":
                    self.not_run.append({"where": block.where, "lang": block.lang, "reason": block.not_run})
                    continue
                if kind == "text":
                    continue
                getattr(self, "run_" + kind.replace(" ", "_"))(block)
                self.ran[kind] = self.ran.get(kind, 0) + 1
        finally:
            self.stop_servers()

    def run_file(self, block: Block) -> None:
        (self.workdir / block.file).write_text(self.text(block))  # type: ignore[operator]

    def run_python(self, block: Block) -> None:
        code = compile("\n" * block.line + self.text(block), str(self.path), "exec")
        try:
            exec(code, self.namespace)
        except BaseException as e:
            raise ExampleFailed(f"{block.where}: the Python example raised\n{traceback.format_exc()}") from e

    def run_bash(self, block: Block) -> None:
        self.check(block, self.text(block), "")

    def run_console(self, block: Block) -> None:
        for command, expected in commands(self.text(block)):
            if re.match(r"^(\w+=\S* )*hqueue( --url \S+)? server\b", command):
                self.start_server(block, command)
            else:
                self.check(block, command, expected)

    def run_shell(self, block: Block) -> None:
        for command, expected in commands(self.text(block), SHELL_PROMPT):
            self.check(block, "hqueue shell -e " + shlex.quote(command), expected, transcript=True)

    def check(self, block: Block, command: str, expected: str, transcript: bool = False) -> None:
        args = ["bash", "-e", "-o", "pipefail", "-c", command]
        try:
            done = subprocess.run(
                args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise ExampleFailed(f"{block.where}: `{command}` ran past {COMMAND_TIMEOUT}s") from e
        output = done.stdout
        if transcript:
            # Timings differ from run to run; `-e` adds where it stopped after an error.
            expected, output = TIMING.sub("N seconds", expected), TIMING.sub("N seconds", output)
            expected += "..."
        should_fail = expected.startswith(("Error:", "ERROR:"))
        if (done.returncode != 0) != should_fail:
            want = "fail" if should_fail else "succeed"
            raise ExampleFailed(
                f"{block.where}: `{command}` should {want}; it exited {done.returncode}:\n{done.stdout[-3000:]}"
            )
        if expected and not matches(expected, output):
            raise ExampleFailed(
                f"{block.where}: `{command}` printed\n{output[-3000:]}\n--- where the page shows ---\n{expected}"
            )

    def start_server(self, block: Block, command: str) -> None:
        log = self.workdir / f"server-{len(self.servers)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["bash", "-c", "exec " + command], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.servers.append((proc, log))
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ExampleFailed(f"{block.where}: `{command}` did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)

    def stop_servers(self) -> None:
        for proc, _log in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main() -> int:
    path, workdir = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    page = Page(path, workdir)
    status = 0
    try:
        page.run(parse(path))
    except ExampleFailed as e:
        print(e, file=sys.stderr)
        status = 1
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps({"ran": page.ran, "not_run": page.not_run}))
    sys.stdout.flush()
    # Examples may leave threads running (a subscriber, a consumer): the page is done.
    os._exit(status)


if __name__ == "__main__":
    main()
