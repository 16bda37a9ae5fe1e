"""Real servers for the tests: ZooKeeper (Debian's package) and hqueue servers.

A fixture that needs a server it cannot find skips locally but fails under
``CI=true`` (dramatiq's ``check_redis`` pattern): CI must run everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def python_env() -> dict[str, str]:
    """The environment for subprocesses that import hqueue and tests."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


def missing(what: str) -> None:
    """Skip locally, fail in CI."""
    if in_ci():
        pytest.fail(f"{what} is required in CI (tests/run.sh installs it)")
    pytest.skip(f"{what} is not installed (run tests/run.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def taken(port: int) -> bool:
    """Whether something on this machine holds ``port`` on loopback."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def wait_for(condition, timeout: float = 10.0, what: str = "the condition", interval: float = 0.05):
    """Poll ``condition()`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def drain(consumer, want: int, timeout: float = 10.0, wait: float = 0.2, retry_on: tuple[type, ...] = ()):
    """A consumer-group member's deliveries, received until ``want`` came or
    ``timeout`` passed (what came: the caller asserts). Errors in ``retry_on``
    (a server going away) are retried."""
    got: list = []

    def enough() -> bool:
        nonlocal got
        try:
            got += consumer.receive(want - len(got), wait=wait)
        except retry_on:
            time.sleep(wait)
        return len(got) >= want

    try:
        wait_for(enough, timeout, f"{want} deliveries", interval=0)
    except AssertionError:
        pass
    return got


class ZooKeeperServer:
    """A standalone ZooKeeper from Debian's ``zookeeper`` package, on loopback."""

    def __init__(self, workdir: Path) -> None:
        if not ZOOKEEPER_JAR.exists() or not shutil.which("java"):
            missing("Debian's zookeeper package (and Java)")
        data = workdir / "data"
        data.mkdir(parents=True)
        # A port free when picked may be taken before Java binds it (tests run side by side):
        # then ZooKeeper exits (saying nothing: Debian's jar has no log binding), and another is picked.
        for attempt in range(5):
            self._start(workdir, data)
            try:
                wait_for(self._answers, 60, "ZooKeeper to start")
                return
            except AssertionError:
                self.stop()
                if attempt == 4 or not taken(self.port):
                    raise

    def _start(self, workdir: Path, data: Path) -> None:
        self.port = free_port()
        config = workdir / "zoo.cfg"
        # tickTime 200 ms: sessions may be as short as 0.4 s and at most 4 s.
        config.write_text(
            f"tickTime=200\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\nmaxClientCnxns=0\n"
        )
        self.log = open(workdir / "zookeeper.log", "w")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", f"/etc/zookeeper/conf:{ZOOKEEPER_JAR}",
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited: see {self.log.name}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                return b"Mode" in s.recv(1024)
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


class Proc:
    """A process whose output lines are read as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.endswith("\n"):  # the text after the last newline was cut by a kill
                self.lines.append(line[:-1])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)


class ServerProcess:
    """``hqueue server`` in a subprocess, so that a test can kill -9 it."""

    def __init__(
        self,
        storage: str,
        workdir: Path,
        *,
        zk: str | None = None,
        port: int = 0,
        name: str = "s",
        extra_args: tuple[str, ...] = (),
        max_open_files: int | tuple[int, int] | None = None,
    ) -> None:
        self.storage, self.zk, self.name, self.workdir = storage, zk, name, workdir
        self.extra_args, self.max_open_files = list(extra_args), max_open_files
        self.log_path = workdir / f"server-{name}.log"
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> ServerProcess:
        args = [sys.executable, "-m", "hqueue.cli", "server", "--storage", self.storage, "--port", str(self.port),
                "--session-timeout", "2", "--id", self.name]  # fmt: skip
        if self.zk:
            args += ["--zk", self.zk]
        args += self.extra_args
        log = open(self.log_path, "a")
        self._log_offset = log.tell()  # only this run's lines count
        limit = self.max_open_files

        def limit_files() -> None:
            if limit is not None:  # (soft, hard), or both
                resource.setrlimit(resource.RLIMIT_NOFILE, limit if isinstance(limit, tuple) else (limit, limit))

        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=python_env(), stdout=log, stderr=log, preexec_fn=limit_files if limit else None
        )
        log.close()
        line = wait_for(self._serving, 60, f"server {self.name} to serve")
        self.port = int(line)
        return self

    def _serving(self) -> str | None:
        """Its port, once it has started everything: "listening on" comes when the port is
        bound, before the server's threads start; "serving" when they all have."""
        if self.proc and self.proc.poll() is not None:
            raise AssertionError(f"server {self.name} exited:\n{self.log_path.read_text()[-3000:]}")
        text = self.log_path.read_text()[self._log_offset :]
        found = re.findall(r"hqueue server [\d.]+:(\d+) serving ", text)
        return found[-1] if found else None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def announced(self, what: str, timeout: float = 30) -> str:
        """The URL it printed for ``what`` ("console" or "metrics"): started with
        ``--console-port 0`` or ``--metrics-port 0``, it took a port no other process held,
        where a port picked by the test could be taken by someone else before it binds."""
        pattern = rf".*\b{what} on (http://[^/\s]+)"

        def found() -> str | None:
            lines = self.log_path.read_text()[self._log_offset :].splitlines()
            urls = [m.group(1) for m in map(re.compile(pattern).match, lines) if m]
            return urls[-1] if urls else None

        return wait_for(found, timeout, f"server {self.name} to announce its {what}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye to ZooKeeper."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP, returning once every thread has stopped: the signal is only queued when
        kill() returns, and on a busy machine a thread may still answer a request after it."""
        assert self.proc is not None
        pause(self.proc)

    def resume(self) -> None:
        """SIGCONT: a paused server goes on."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, and the exit status of the clean shutdown."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def pause(proc: subprocess.Popen) -> None:
    """SIGSTOP ``proc``, returning once every thread of it has stopped: kill() returns once the
    signal is queued, and on a busy machine the thread that takes it may run late, while
    another still answers a request sent after kill() (a put acknowledged by a "paused" server)."""
    proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: stopped(proc.pid), 30, f"process {proc.pid} to stop", interval=0.005)


def stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T in /proc)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:  # a thread that just ended
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def server_certificate(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1 and localhost (openssl): its file, and a
    server-side TLS context that serves it."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


def serving_pid(data: str) -> int | None:
    """The process holding (and so serving) the embedded store in ``data``, if any."""
    from hqueue.storage.lockholder import lock_holder

    holder = lock_holder(data)
    return int(holder.split()[1].rstrip(":")) if holder else None


@contextmanager
def one_queue_served(
    tmp_path: Path, messages: int, timeout: float = 2.0, io: str = "loop"
) -> Iterator[tuple[ServerProcess, Any, str]]:
    """A server process (``--io io``) on a fresh embedded store, with queue "q" (1 partition)
    holding ``messages`` messages (values b"0", b"1"…): (the server, an open HQueue on it, its
    URL, with the client's ``timeout``). Resumed if a test paused it, then stopped."""
    from hqueue import HQueue, HQueueAdmin, Message

    server = ServerProcess(f"local://{tmp_path}/data", tmp_path, extra_args=("--io", io))
    url = f"hqueue://{server.address}?timeout={timeout:g}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            queue.put([Message("t", b"%d" % i) for i in range(messages)], 0)
            yield server, queue, url
    finally:
        server.resume()
        server.terminate()


@contextmanager
def queue_with_group_limits(request, tmp_path: Path, limits, partitions: int = 1) -> Iterator[tuple[Any, Any]]:
    """Queue "q" (of ``partitions``) whose groups have ``limits``, and the group service that keeps
    them: on an embedded store opened with them, or (``request.param == "remote"``) through
    an in-process server started with them."""
    from hqueue import HQueue, HQueueAdmin
    from hqueue.api import groups_of
    from hqueue.server import HQueueServer

    server = None
    if request.param == "remote":
        server = HQueueServer(f"local://{tmp_path}/server", port=0, group_limits=limits).start()
        request.addfinalizer(server.stop)
        url, opened = f"hqueue://{server.address}", {}
    else:
        url, opened = f"local://{tmp_path}/data", {"group_limits": limits}
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions)
    with HQueue("q", url, **opened) as queue:
        yield queue, (server.groups if server is not None else groups_of(queue.engine))


@contextmanager
def slow_link(address: str, delay: float) -> Iterator[str]:
    """A TCP relay to ``address`` that holds each chunk a client sends for ``delay``
    seconds (a slow network): yields the relay's host:port."""
    host, _, port = address.rpartition(":")
    listener = socket.create_server(("127.0.0.1", 0))
    ends: list[socket.socket] = [listener]

    def pump(source: socket.socket, sink: socket.socket, hold: float) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                time.sleep(hold)
                sink.sendall(chunk)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                upstream = socket.create_connection((host, int(port)))
                ends.extend((client, upstream))
                threading.Thread(target=pump, args=(client, upstream, delay), daemon=True).start()
                threading.Thread(target=pump, args=(upstream, client, 0.0), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        for end in ends:
            end.close()
