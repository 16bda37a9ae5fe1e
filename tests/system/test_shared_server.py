"""``hqueue server`` on a ``local://`` store serves it to local processes too (hqueue/sharing.py).

* A second local process opening ``local://`` the directory becomes the
  server's client over the store's Unix socket, at once (no StorageLocked),
  while remote clients use TCP as before.
* With an auth file, TCP needs a token; the socket needs none: who may
  connect there is decided by the socket file's permissions (another user
  is refused by the kernel).
* When the server stops, the next local process to make a call takes the
  store over; ``--no-local-socket`` keeps the old refusal.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
import sys
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message, NotAuthorized, ServerUnavailable, StorageLocked, sharing
from hqueue.rpc.unix import short_unix_path
from hqueue.server import HQueueServer
from hqueue.sharing import SOCKET_NAME, StoreClient

from ..processes import ROOT, ServerProcess, python_env, server_certificate

TOKEN = "ops-secret-0123456789abc"
AUTH_FILE = f'[tokens.ops]\nsecret = "{TOKEN}"\nadmin = ["*"]\n'


SYSTEM_PYTHON = "/usr/bin/python3"


def _hqueue(*args: str) -> subprocess.CompletedProcess:
    """The hqueue command in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "hqueue.cli", *args], cwd=ROOT, env=python_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


@pytest.fixture
def served(tmp_path):
    """``hqueue server`` with an auth file on a local store, its queue ``q`` made over TCP."""
    (tmp_path / "auth.toml").write_text(AUTH_FILE)
    data = tmp_path / "data"
    server = ServerProcess(f"local://{data}", tmp_path, extra_args=("--auth-file", str(tmp_path / "auth.toml")))
    with HQueueAdmin(f"hqueue://{TOKEN}@{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server, str(data)
    server.kill()


def test_a_local_process_opening_a_store_hqueue_server_holds_becomes_its_client(served):
    server, data = served
    # Given hqueue server holding local://DATA (with an auth file)
    # When this process opens the same local:// URL
    with HQueue("q", data_dir=data) as queue:
        # Then it is the server's client over the store's socket, at once, with no token
        assert isinstance(queue.engine, StoreClient)
        ids = queue.put([Message("t", b"local-%d" % i) for i in range(5)], partition_id=1)
        assert [m.value for m in queue.scan()] == [b"local-%d" % i for i in range(5)]
    # And TCP clients see the same store, with their token; without one they are refused
    with HQueue("q", f"hqueue://{TOKEN}@{server.address}") as remote:
        assert [m.id for m in remote.scan()] == ids
    with pytest.raises(NotAuthorized), HQueue("q", f"hqueue://{server.address}") as remote:
        remote.put(Message("t", b"x"))
    # And the socket is the server owner's alone
    socket_file = os.path.join(data, SOCKET_NAME)
    assert stat.S_ISSOCK(os.stat(socket_file).st_mode) and oct(os.stat(socket_file).st_mode & 0o777) == "0o600"
    # And the command line works on local:// while the server runs
    listed = _hqueue("--url", f"local://{data}", "scan", "q")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("local-") == 5


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="needs root and " + SYSTEM_PYTHON)
def test_another_user_cannot_connect_to_the_socket(served):
    server, data = served
    # Given a directory others may enter (the socket's own mode is what keeps them out)
    os.chmod(os.path.dirname(data), 0o755)
    os.chmod(data, 0o755)
    # When another user connects to the socket (this venv's Python may be out of its reach: the system's)
    code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({os.path.join(data, SOCKET_NAME)!r})"
    nobody = pwd.getpwnam("nobody")
    raw = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid)))  # fmt: skip
    # Then the kernel refuses it, and nothing was written
    assert "PermissionError" in raw.stderr, raw.stderr
    with HQueue("q", f"hqueue://{TOKEN}@{server.address}") as remote:
        assert list(remote.scan()) == []


def test_when_the_server_stops_a_local_client_takes_the_store_over(served):
    server, data = served
    with HQueue("q", data_dir=data) as queue:
        first = queue.put(Message("t", b"before"), partition_id=0)
        # When the server stops (SIGTERM: it drains, removes its socket, lets the store go)
        assert server.terminate() == 0
        assert not os.path.exists(os.path.join(data, SOCKET_NAME)) or os.path.exists(os.path.join(data, "LOCK"))
        # Then this process's next call takes the store over, IDs going on from the server's
        second = queue.put(Message("t", b"after"), partition_id=0)
        assert second > first
        assert [m.value for m in queue.scan()] == [b"before", b"after"]


def test_no_local_socket_keeps_the_store_to_the_server(tmp_path, monkeypatch):
    data = tmp_path / "data"
    server = ServerProcess(f"local://{data}", tmp_path, extra_args=("--no-local-socket",))
    try:
        # Given hqueue server --no-local-socket on the store: no socket
        assert not os.path.exists(data / SOCKET_NAME)
        # Then another process is refused (after a moment's wait for a socket; the CLI's words: test_cli.py)
        monkeypatch.setattr(sharing, "STARTUP_WAIT", 0.2)
        with pytest.raises(StorageLocked, match="--no-local-socket"):
            HQueueAdmin(data_dir=str(data))
    finally:
        server.kill()


_SLOW_TO_SERVE = """
import sys, time
import hqueue.connection as connection
from hqueue import HQueue

serve = connection._serve_store


def slowly(engine, limits):  # (as a store of thousands of queues opens: its lock held, its socket to come)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    serve(engine, limits)


connection._serve_store = slowly
with HQueue("q", sys.argv[1]):
    time.sleep(60)
"""


@pytest.mark.parametrize("timeout, slow", [(30, sharing.STARTUP_WAIT + 2), (0.5, 2)])
def test_a_process_opening_a_store_whose_holder_is_still_starting_becomes_its_client(tmp_path, timeout, slow):
    """A holder takes the store's lock seconds before its socket listens (2.4 s for a store of
    2,774 queues, more on a loaded machine): a second process gave up after STARTUP_WAIT (3 s)
    with StorageLocked, naming a holder "that does not share it" (an attacker's pass). The
    holder says it is starting (sharing.starting), and the second waits for it, up to its
    timeout, and STARTUP_WAIT with a shorter one (0.5 s gave up after 0.5 s: a review)."""
    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    holder = subprocess.Popen([sys.executable, "-c", _SLOW_TO_SERVE, url, str(slow)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with HQueue("q", url, timeout=timeout) as queue:  # (a client: the holder keeps the store)
            queue.put(Message("t", b"through the holder"), partition_id=0)
            assert time.monotonic() - started > slow - 0.5
            assert [m.value for m in queue.scan()] == [b"through the holder"]
        assert holder.poll() is None
        assert os.listdir(tmp_path / "data") == [n for n in os.listdir(tmp_path / "data") if "starting" not in n]
    finally:
        holder.kill()
        holder.wait()


def test_stray_or_planted_starting_files_neither_stop_nor_hang_a_store_s_holder(tmp_path):
    """Names no process has (a pid past any, a digit int() refuses) made the holder's sweep
    raise, so the store was served by no one; a FIFO planted under the holder's own pid made
    its open wait for ever (a review)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    for name in ("hqueue.starting.99999999999999999999", "hqueue.starting.\u00b2", "hqueue.starting.x"):
        (data / name).write_text("")
    script = (
        "import os, sys\n"
        "from hqueue import HQueueAdmin\n"
        "os.mkfifo(os.path.join(sys.argv[1], f'hqueue.starting.{os.getpid()}'))\n"
        "with HQueueAdmin(data_dir=sys.argv[1]) as admin:\n"
        "    admin.create_queue('q', 1)\n"
        "    print(os.path.exists(os.path.join(sys.argv[1], 'hqueue.sock')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # served


def test_an_in_process_server_hands_the_socket_on_to_the_store_s_other_handles(tmp_path):
    data = str(tmp_path / "data")
    # Given an hqueue server in this process on a local store, and an HQueueAdmin on it too
    server = HQueueServer(f"local://{data}", port=0).start()
    assert server.local_socket == os.path.join(data, SOCKET_NAME)
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q", 1)
        # When the server stops while the admin keeps the store open here
        server.stop()
        # Then this process still serves the store to another process
        other = _hqueue("--url", f"local://{data}", "list")
        assert other.returncode == 0 and "q" in other.stdout, other.stderr


@pytest.mark.parametrize("io", ["loop", "threads"])
def test_a_tls_server_s_local_socket_speaks_clear(tmp_path, io):
    """With --tls-cert every accepted connection was wrapped in TLS, the Unix socket's too:
    local processes got "connection reset" and could not take the store over either, so
    local:// was dead while the server ran (a fresh user's probe)."""
    cert, context = server_certificate(tmp_path)
    data = str(tmp_path / "data")
    server = HQueueServer(f"local://{data}", port=0, ssl_context=context, io=io).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}?tls=1&ca={cert}") as admin:
            admin.create_queue("q", 1)
        put = _hqueue("--url", f"local://{data}", "put", "q", "t", "through-the-socket")
        assert put.returncode == 0, put.stderr
        with HQueue("q", f"hqueue://{server.address}?tls=1&ca={cert}") as queue:
            assert [m.value for m in queue.scan()] == [b"through-the-socket"]
        with pytest.raises(ServerUnavailable):  # TCP stays TLS only
            HQueueAdmin(f"hqueue://{server.address}?timeout=5").list_queues()
    finally:
        server.stop()


def test_both_ends_of_a_socket_connection_send_a_put_s_frame_in_one_message(tmp_path):
    # Given a server on a local store, and a client of its socket
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        assert server.local_socket is not None
        client = StoreClient(f"local://{tmp_path}/data")
        try:
            client.list_queues()
            pool = client._pool("")
            connection = pool.take()
            pool.give_back(connection)
            # Then each end's send buffer holds a put of 1,000 100-byte messages (130 KB) whole: Linux's
            # default (208 KiB) sends at most half its size at once (bench/shared.py measures the cost)
            sent = [connection.socket.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)]  # type: ignore[union-attr]
            sent += [s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) for _, s in server._server.places.open.values()]
            assert len(sent) == 2 and min(sent) >= 2 * 212992, sent
        finally:
            client.release()
    finally:
        server.stop()


def test_services_replaced_on_a_store_stop_hearing_its_writes(tmp_path):
    # Given a store this process opened (its own services), then served (the server's replace them)
    with HQueueAdmin(data_dir=str(tmp_path / "data")) as admin:
        events = admin.engine.events  # type: ignore[attr-defined]
        # Then only the services at work hear the engine: one group service, one timer loop
        assert [f.__qualname__ for f in events._written].count("GroupService._on_write") == 1
        assert [f.__qualname__ for f in events._scheduled] == ["TimerService.scheduled"]
        dropped = [f.__qualname__ for f in events._dropped]
        assert dropped.count("GroupService.forget") == 1  # and the store's own listeners (dead-letter notes) once
        assert len(dropped) == len(set(dropped))


def test_the_socket_is_never_open_to_others_even_under_a_permissive_umask(tmp_path):
    # Given a process whose umask lets others write (0), binding the store's socket
    code = (
        "import os, sys\nfrom hqueue.rpc.unix import unix_listener\nos.umask(0)\n"
        "unix_listener(sys.argv[1], 1, 0o600)\nprint(oct(os.stat(sys.argv[1]).st_mode & 0o777))"
    )
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.sock")], cwd=ROOT, env=python_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    # Then the file is made 0600 by bind itself: no moment when another user could connect before a chmod
    assert made.stdout.strip() == "0o600", made.stderr


def test_the_socket_appears_with_its_group_and_mode_and_never_follows_a_symlink(tmp_path):
    """The socket was given its group and mode by path after bind: a member of a
    group-writable directory could swap a symlink in between, and have the serving user
    (root too) give that group another file of its own (a review's probe)."""
    from hqueue.rpc.unix import unix_listener

    secret = tmp_path / "secret"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    planted = tmp_path / "s.sock"
    planted.symlink_to(secret)
    with pytest.raises(OSError, match="cannot listen on .*s.sock"):  # a file there: never replaced, nor followed
        unix_listener(str(planted), 1, 0o660, 65534)
    assert (oct(secret.stat().st_mode & 0o777), secret.stat().st_gid) == ("0o600", os.getgid())
    planted.unlink()
    group = 65534 if os.geteuid() == 0 else os.getgid()
    listener = unix_listener(str(planted), 1, 0o660, group)
    try:
        info = os.lstat(planted)
        assert stat.S_ISSOCK(info.st_mode) and (oct(info.st_mode & 0o777), info.st_gid) == ("0o660", group)
        assert sorted(os.listdir(tmp_path)) == ["s.sock", "secret"]  # the private directory is gone
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(planted))
    finally:
        listener.close()


def test_a_private_directory_swapped_in_by_name_is_refused(tmp_path, monkeypatch):
    """The socket was bound and given its group and mode by path in its private directory:
    another user of a group-writable store directory could rename that directory and put
    one of its own there, with a symlink to a file of the serving user (a review's probe:
    the file was given the group and made 0660). Now only descriptors of the directory
    made are used, and one swapped in before it is opened is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make the other user's directory")
    from hqueue.rpc import unix

    victim = tmp_path / "victim"
    victim.write_text("root only")
    os.chmod(victim, 0o600)
    real_open = os.open

    def swapping(name, flags, *args, dir_fd=None, **kwargs):
        if isinstance(name, str) and name.startswith(".hqueue-") and dir_fd is not None:
            os.rename(name, name + ".mine", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the attacker's swap
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            os.chown(name, 65534, 65534, dir_fd=dir_fd)
            os.symlink(victim, tmp_path / name / "s.sock")
        return real_open(name, flags, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(unix.os, "open", swapping)
    with pytest.raises(OSError, match="was replaced"):
        unix.unix_listener(str(tmp_path / "s.sock"), 1, 0o660, 65534)
    monkeypatch.undo()
    assert (oct(victim.stat().st_mode & 0o777), victim.stat().st_gid, victim.read_text()) == ("0o600", 0, "root only")
    assert not (tmp_path / "s.sock").exists()


def test_a_store_reached_through_a_symlink_is_served_there(tmp_path):
    """The store's directory was opened O_NOFOLLOW to bind its socket: a store named by a
    symlink (a common layout: /var/lib/hqueue -> /data/hqueue) failed to open."""
    os.makedirs(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    url = f"local://{tmp_path}/link"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
        assert stat.S_ISSOCK(os.stat(tmp_path / "real" / SOCKET_NAME).st_mode)
        code = f"from hqueue import HQueue\nwith HQueue('q', {url!r}) as q: print(type(q.engine).__name__)"
        other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=python_env(), capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert other.stdout.strip() == "StoreClient", other.stderr


def test_what_a_process_killed_while_making_the_socket_left_is_swept(tmp_path):
    """A holder killed between making its private directory and removing it left it there
    for good (a review: 54 of 200 kills in a tight loop)."""
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        admin.create_queue("q", 1)
    left = tmp_path / "data" / ".hqueue-0123456789abcdef"
    os.mkdir(left, 0o700)
    with socket.socket(socket.AF_UNIX) as half_made, short_unix_path(str(left / SOCKET_NAME)) as short:
        half_made.bind(short)  # (CI's temporary paths are longer than sun_path holds)
    others = tmp_path / "data" / ".hqueue-not-mine"  # not a private one (others may enter): left alone
    os.mkdir(others, 0o755)
    with HQueueAdmin(f"local://{tmp_path}/data") as admin:
        assert not left.exists() and others.exists()


def test_a_server_that_fails_to_start_lets_go_of_the_stores_socket(tmp_path):
    from hqueue.server import HQueueServer
    from hqueue.sharing import SOCKET_NAME

    # Given a console port another program holds
    url = f"local://{tmp_path / 'data'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        # When a server on a local store fails to start on it
        with pytest.raises(OSError):
            HQueueServer(url, port=0, console_port=taken.getsockname()[1])
    # Then it left the store's socket behind it: no file, and the next server serves it
    assert not (tmp_path / "data" / SOCKET_NAME).exists()
    server = HQueueServer(url, port=0).start()
    try:
        assert server.local_socket == str(tmp_path / "data" / SOCKET_NAME)
    finally:
        server.stop()
