"""Another language's client against a running server (SPEC C9).

Generates Java code from thrift/hqueue.thrift with Apache Thrift's compiler
(Debian's thrift-compiler), compiles tests/crosslang/HQueueJavaClient.java
against Debian's libthrift-java, and runs it against a server on loopback.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.server import HQueueServer

from ..processes import ROOT, missing

JARS = ["thrift.jar", "slf4j-api.jar", "commons-lang3.jar", "geronimo-annotation-1.3-spec.jar"]


@pytest.fixture(scope="module")
def java_client(tmp_path_factory) -> tuple[Path, str]:
    """Compiled generated code and the client: (classes dir, classpath)."""
    jars = [Path("/usr/share/java") / j for j in JARS]
    if not shutil.which("thrift") or not shutil.which("javac") or not all(j.exists() for j in jars):
        missing("Debian's thrift-compiler and libthrift-java (and a JDK)")
    work = tmp_path_factory.mktemp("java")
    gen, classes = work / "gen", work / "classes"
    gen.mkdir()
    classes.mkdir()
    subprocess.run(
        [
            "thrift",
            "--gen",
            "java:generated_annotations=suppress",
            "-out",
            str(gen),
            str(ROOT / "thrift/hqueue.thrift"),
        ],
        check=True,
    )
    classpath = ":".join(map(str, jars))
    sources = [*map(str, gen.rglob("*.java")), str(ROOT / "tests/crosslang/HQueueJavaClient.java")]
    subprocess.run(
        ["javac", "-nowarn", "-d", str(classes), "-cp", classpath, *sources], check=True, capture_output=True
    )
    return classes, classpath


def test_a_generated_java_client_puts_and_scans_against_the_server(java_client, tmp_path):
    classes, classpath = java_client
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("polyglot", 4)
        with HQueue("polyglot", url) as queue:
            (python_id,) = queue.put(Message("java", b"from python"), partition_id=1)
        # When the Java client runs
        result = subprocess.run(
            ["java", "-cp", f"{classes}:{classpath}", "HQueueJavaClient", str(server.port), "polyglot"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        # Then it sees Python's message, its own puts, and typed errors
        assert f"scan 1 {python_id} java from python" in lines
        assert "putMessages 3" in lines and "locations 4" in lines
        assert "typed TQueueNotFound no_such_queue" in lines
        assert sum(line.startswith("scan 1 ") for line in lines) == 5
        # And Python reads what Java wrote, in ID order
        with HQueue("polyglot", url) as queue:
            values = [m.value for m in queue.scan()]
        assert values == [b"from python", b"hello from java", b"batch 0", b"batch 1", b"batch 2"]
    finally:
        server.stop()
