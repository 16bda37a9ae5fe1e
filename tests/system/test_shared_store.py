"""Several processes on one embedded store (hqueue/sharing.py): real processes, real kill -9.

* A producer, ``hqueue tail``, a consumer-group member and the shell work
  on one ``local://`` store at once: the first to open it serves it on its
  Unix socket, the others are its clients.
* The serving process is killed (kill -9) under load, again and again: the
  next process to use the store takes it over; no acknowledged write is
  lost, no ID is acknowledged twice, and the others carry on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.sharing import SOCKET_NAME

from ..processes import ROOT, Proc, pause, python_env, serving_pid, wait_for


def _writer(data: str) -> Proc:
    return Proc("-m", "tests.helpers.crash_writer", data, "q")


def _tail(data: str) -> Proc:
    return Proc("-m", "hqueue.cli", "--url", f"local://{data}", "tail", "q", "--start", "0", "--format", "json")


def _member(data: str) -> Proc:
    return Proc("-m", "tests.helpers.group_consumer", f"local://{data}", "q", "g", "30", "0")


def _acked(writers: list[Proc]) -> list[tuple[int, int, int]]:
    out = []
    for writer in writers:
        out += [tuple(map(int, line.split())) for line in writer.lines]
    return out  # type: ignore[return-value]


def _stored(data: str) -> set[tuple[int, int, int]]:
    with HQueue("q", data_dir=data) as queue:
        return {(m.partition_id, m.id.timestamp, m.id.sequence) for m in queue.scan()}


@pytest.fixture
def data(tmp_path):
    path = str(tmp_path / "data")
    with HQueueAdmin(data_dir=path) as admin:
        admin.create_queue("q", 2)
    return path


def test_a_producer_tail_a_group_member_and_the_shell_share_one_store(data):
    # Given a producer, hqueue tail and a consumer-group member on one local:// store
    procs = [_writer(data), _tail(data), _member(data)]
    try:
        wait_for(lambda: procs[0].lines and procs[1].lines and "READY" in procs[2].lines, 60, "all three at work")
        # Then one of them serves the store, on a socket only its owner may use
        assert serving_pid(data) in {p.pid for p in procs}
        assert oct(os.stat(os.path.join(data, SOCKET_NAME)).st_mode & 0o777) == "0o600"
        # And the shell, opened now, works on the same store meanwhile
        shell = subprocess.run(
            [sys.executable, "-m", "hqueue.cli", "--url", f"local://{data}", "shell",
             "-e", "list", "-e", "describe 'q'", "-e", "put 'q', 'from-shell', 'hello'"],
            cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert shell.returncode == 0, shell.stderr
        assert "q" in shell.stdout
        # And the member and tail see what the producer and the shell wrote
        wait_for(lambda: any(line.startswith("A ") for line in procs[2].lines), 30, "the member's acks")
        wait_for(lambda: any("from-shell" in line for line in procs[1].lines), 30, "tail to show the shell's put")
    finally:
        for proc in procs:
            proc.kill()
    acked = _acked(procs[:1])
    assert acked and not set(acked) - _stored(data)


def test_asyncio_calls_of_a_second_process_go_through_the_serving_one(data):
    """The first receive of an asyncio consumer in a process that is the serving process's
    client raised AttributeError (an acceptance probe): that client sees no writes of its
    own to wake a receive, so it polls."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue

    tail = _tail(data)  # serves the store; this process becomes its client
    try:
        wait_for(lambda: serving_pid(data) == tail.pid, 60, "hqueue tail to serve the store")

        async def main() -> list[bytes]:
            async with AsyncHQueue("q", f"local://{data}") as queue, queue.producer() as producer:
                async with queue.consumer("g") as consumer:
                    assert await consumer.receive(wait=0) == []
                    waiting = asyncio.ensure_future(consumer.receive(wait=10))
                    await producer.send(Message("t", b"through the socket"))
                    got = await waiting
                    await consumer.ack(got)
                    return [d.value for d in got]

        assert asyncio.run(asyncio.wait_for(main(), 60)) == [b"through the socket"]
        wait_for(lambda: any("through the socket" in line for line in tail.lines), 30, "tail to show the send")
    finally:
        tail.kill()


HOLD_THEN_EXIT = """
import sys, time
from hqueue import HQueueAdmin
with HQueueAdmin(data_dir=sys.argv[1]):
    print("HOLDING", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_an_asyncio_receive_in_a_client_process_waits_in_the_serving_one_and_survives_its_kill(data):
    """An asyncio member in a client process asked the serving process without waiting every
    50 ms while it waited (a thread-bound poll): now its receive waits there, over the Unix
    socket on the loop, and when that process is killed under it, this one takes the store
    over and the receive goes on."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue, executor

    holder = Proc("-c", HOLD_THEN_EXIT, data, "3600")
    takes = []
    real_take = executor.ExecutorGroups._take

    async def counted(self, *args):
        takes.append(args)
        return await real_take(self, *args)

    executor.ExecutorGroups._take = counted
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> tuple[list[bytes], list[bytes]]:
            async with AsyncHQueue("q", f"local://{data}") as queue, queue.consumer("g") as consumer:
                assert await consumer.receive(wait=1.5) == []  # a wait of 1.5 s: no look in a worker
                assert takes == []
                waiting = asyncio.ensure_future(consumer.receive(wait=30))
                await asyncio.sleep(0.5)
                with HQueue("q", data_dir=data) as other:  # a put from another client goes to it
                    other.put(Message("t", b"first"), partition_id=0)
                first = await waiting
                await consumer.ack(first)
                waiting = asyncio.ensure_future(consumer.receive(wait=30))
                await asyncio.sleep(0.5)
                holder.kill()  # under the waiting receive
                await queue.put(Message("t", b"after the kill"), partition_id=1)  # this process serves it now
                second = await waiting
                await consumer.ack(second)
                return [d.value for d in first], [d.value for d in second]

        assert asyncio.run(asyncio.wait_for(main(), 90)) == ([b"first"], [b"after the kill"])
        assert serving_pid(data) != holder.pid
    finally:
        executor.ExecutorGroups._take = real_take
        holder.kill()


def test_an_asyncio_receive_cancelled_in_a_client_process_hands_back_what_it_was_given(data):
    """The receive waits in the serving process: cancelled, the long poll there ends by
    itself, and a message it was handed goes back unseen (attempt 1 for the next receive)."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue

    holder = Proc("-c", HOLD_THEN_EXIT, data, "3600")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> list[tuple[bytes, int]]:
            async with AsyncHQueue("q", f"local://{data}") as queue, queue.consumer("g") as consumer:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(consumer.receive(wait=5), 0.3)
                await queue.put(Message("t", b"m"), partition_id=0)  # the cancelled long poll may get it
                got = await consumer.receive(wait=10)
                await consumer.ack(got)
                return [(d.value, d.attempt) for d in got]

        assert asyncio.run(asyncio.wait_for(main(), 60)) == [(b"m", 1)]
    finally:
        holder.kill()


def test_an_asyncio_member_in_a_client_process_ends_with_its_handle_and_by_its_deadline(data):
    """Found by a review of the receive that waits in the serving process: a closed handle's
    consumer went on receiving (and leased what it could never ack), a cancelled receive made
    close() wait out its whole long poll, and a stopped serving process held a receive for
    two timeouts plus its wait."""
    import signal

    from hqueue import Message
    from hqueue.aio import AsyncHQueue
    from hqueue.errors import DeadlineExceeded

    holder = Proc("-c", HOLD_THEN_EXIT, data, "3600")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> None:
            queue = AsyncHQueue("q", f"local://{data}")
            consumer = await queue.consumer("g").open()
            receiving = asyncio.ensure_future(consumer.receive(wait=60))
            await asyncio.sleep(0.3)
            receiving.cancel()
            await asyncio.wait_for(consumer.close(), 10)  # the long poll is a slice of 1 s, not the 60 s
            await queue.close()
            with pytest.raises(RuntimeError, match="closed"):
                await consumer.receive(wait=1)
            with HQueue("q", data_dir=data) as other:  # nothing stays leased to the closed one
                other.put(Message("t", b"m"), partition_id=0)
                with other.consumer("g") as member:
                    assert [d.value for d in member.receive(wait=10)] == [b"m"]

            stopped = AsyncHQueue("q", f"local://{data}")
            async with stopped, stopped.consumer("g2") as waiting:
                (await stopped.async_engine()).sync.timeout = 2  # its StoreClient's (30 s by default)
                await waiting.receive(wait=0)
                pause(holder.proc)  # the serving process answers nothing
                try:
                    with pytest.raises(DeadlineExceeded):
                        await asyncio.wait_for(waiting.receive(wait=1), 10)  # one deadline: 2 s + 1 s
                finally:
                    holder.proc.send_signal(signal.SIGCONT)

            handle = await AsyncHQueue("q", f"local://{data}").open()
            member = await handle.consumer("g3").open()
            await member.receive(wait=0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(member.receive(wait=30), 0.3)
            pause(holder.proc)  # its poll is never answered
            try:
                await asyncio.wait_for(handle.close(), 10)  # not the receive's 30 s plus its timeout
            finally:
                holder.proc.send_signal(signal.SIGCONT)

        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        holder.kill()


def test_a_member_that_left_a_store_another_process_serves_is_not_counted_in_again(data):
    """A receive cancelled in a client process left its poll running in the serving process;
    the member left at once, and that poll counted it in again: its partitions waited for it
    until the member timeout (10 s) while another member had nothing (a review's probe)."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue

    holder = Proc("-c", HOLD_THEN_EXIT, data, "3600")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> set[bytes]:
            async with AsyncHQueue("q", f"local://{data}") as queue:
                a, b = queue.consumer("g", member="a"), queue.consumer("g", member="b")
                await a.receive(wait=0)
                await b.receive(wait=0)
                receiving = asyncio.ensure_future(a.receive(wait=60))
                await asyncio.sleep(0.3)
                receiving.cancel()
                await a.close()
                await queue.put(Message("t", b"p0"), partition_id=0)
                await queue.put(Message("t", b"p1"), partition_id=1)
                got: set[bytes] = set()
                async with asyncio.timeout(5):  # both partitions are b's now (not after 10 s)
                    while len(got) < 2:
                        deliveries = await b.receive(wait=1)
                        await b.ack(deliveries)
                        got |= {d.value for d in deliveries}
                await b.close()
                return got

        assert asyncio.run(asyncio.wait_for(main(), 60)) == {b"p0", b"p1"}
    finally:
        holder.kill()


def test_a_handle_closed_right_after_a_cancelled_receive_leaves_no_poll_behind(data):
    """The handle closed at once after a cancelled receive: the poll still running in the
    serving process leased the next message to the member that was gone, and it came back
    as attempt 2 after the lease (a review's probe)."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue

    holder = Proc("-c", HOLD_THEN_EXIT, data, "3600")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")
        with HQueue("q", data_dir=data) as queue, queue.consumer("g", member="b") as b:
            b.receive(wait=0)

            async def main() -> None:
                handle = await AsyncHQueue("q", f"local://{data}").open()
                a = await handle.consumer("g", member="a").open()
                await a.receive(wait=0)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(a.receive(wait=20), 0.3)
                await handle.close()

            asyncio.run(asyncio.wait_for(main(), 60))
            queue.put(Message("t", b"p0"), partition_id=0)
            queue.put(Message("t", b"p1"), partition_id=1)
            got: dict[bytes, int] = {}
            while len(got) < 2:
                deliveries = b.receive(wait=10)
                assert deliveries, f"b got only {got}"
                b.ack(deliveries)
                got |= {d.value: d.attempt for d in deliveries}
            assert got == {b"p0": 1, b"p1": 1}
    finally:
        holder.kill()


def test_a_receive_waiting_when_the_serving_process_exits_carries_on_with_the_next(data):
    """The serving process closed its last handle (a normal exit) while a client's receive
    waited: after the 2 s grace the receive woke on the closing store and raised
    QueueNotFound for a queue that exists (an acceptance probe)."""
    from hqueue import Message

    holder = Proc("-c", HOLD_THEN_EXIT, data, "1.5")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")
        with HQueue("q", data_dir=data) as queue, queue.consumer("g", member="m") as consumer:
            assert consumer.receive(wait=0) == []
            assert consumer.receive(10, wait=5) == []  # the holder exits meanwhile: nothing, no error
            assert holder.proc.wait(timeout=30) == 0
            queue.put(Message("t", b"after"), partition_id=0)
            assert [d.value for d in consumer.receive(10, wait=5)] == [b"after"]
    finally:
        holder.kill()


def test_asyncio_scans_cancelled_in_a_client_process_leave_its_connections_in_step(data):
    """In a client process, a cancelled scan's fetch went on in its thread while its close ran
    on the loop: two threads on one connection read each other's answers (QueueNotFound for
    a queue that exists, ProtocolError), and such a connection went back to the pool the
    puts use; the close also blocked the loop (an acceptance probe)."""
    from hqueue import Message
    from hqueue.aio import AsyncHQueue

    with HQueue("q", data_dir=data) as queue:
        for pid in (0, 1):
            queue.put([Message("t", b"x" * 100) for _ in range(5000)], partition_id=pid)
    holder = Proc("-c", HOLD_THEN_EXIT, data, "300")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> tuple[list[str], dict, dict]:
            errors: list[str] = []
            acked: dict[bytes, tuple] = {}
            async with AsyncHQueue("q", f"local://{data}") as scanned, AsyncHQueue("q", f"local://{data}") as put:
                done = False

                async def putter() -> None:
                    n = 0
                    while not done:
                        n += 1
                        batch = [Message("p", b"put-%d-%d" % (n, i)) for i in range(2)]
                        for message, mid in zip(batch, await put.put(batch, partition_id=n % 2), strict=True):
                            acked[message.value] = (n % 2, mid)

                putting = asyncio.ensure_future(putter())
                for round in range(120):

                    async def scan() -> None:
                        async for _ in scanned.scan():
                            await asyncio.sleep(0.0005)

                    task = asyncio.ensure_future(scan())
                    await asyncio.sleep(0.001 * (round % 6))
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    except Exception as e:  # noqa: BLE001 - what the test counts
                        errors.append(f"{type(e).__name__}: {e}")
                done = True
                await putting
                stored = {m.value: (m.partition_id, m.id) async for m in put.scan() if m.topic == "p"}
            return errors, acked, stored

        errors, acked, stored = asyncio.run(asyncio.wait_for(main(), 240))
        assert errors == []
        assert acked and all(stored.get(value) == where for value, where in acked.items())
    finally:
        holder.kill()


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor, gone)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def test_a_handle_closed_with_scans_open_closes_their_connections(data):
    """Closed with scans under way (their scanners kept by the application), an AsyncHQueue of
    a client process left their connections to the serving process open, and the scanners
    there, until they were collected (an attacker's pass); the blocking handle too."""
    from hqueue.aio import AsyncHQueue

    with HQueue("q", data_dir=data) as queue:
        for _ in range(4):
            queue.put([Message("t", b"x")] * 5000, partition_id=0)  # (more than a scan's first answers)
    holder = Proc("-c", HOLD_THEN_EXIT, data, "300")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")
        before = _sockets()

        async def main() -> list:
            queue = AsyncHQueue("q", f"local://{data}")
            await queue.open()
            scanners = [queue.scan(caching=5) for _ in range(3)]
            for scanner in scanners:
                await scanner.__anext__()
            await queue.close()
            return scanners  # (kept: not collected before the count)

        kept = asyncio.run(main())
        assert _sockets() == before and kept
        queue = HQueue("q", f"local://{data}")
        scans = [iter(queue.scan(partition_id=0)) for _ in range(3)]
        for scan in scans:
            next(scan)
        queue.close()
        assert _sockets() == before and scans
    finally:
        holder.kill()


def test_a_member_closed_while_the_serving_process_is_paused_raises_nothing(data):
    """Its leave unanswered, an asyncio member of a client process raised DeadlineExceeded from
    close() where one of a server's returned (its leases there run out; an attacker's pass)."""
    from hqueue.aio import AsyncHQueue

    holder = Proc("-c", HOLD_THEN_EXIT, data, "300")
    try:
        wait_for(lambda: serving_pid(data) == holder.pid, 60, "the holder to serve the store")

        async def main() -> None:
            async with AsyncHQueue("q", f"local://{data}", timeout=2) as queue:
                consumer = queue.consumer("g")
                await consumer.receive(1, wait=0.1)
                pause(holder.proc)
                try:
                    await consumer.close()
                finally:
                    holder.proc.send_signal(signal.SIGCONT)
                with HQueue("q", f"local://{data}", timeout=2) as blocking:
                    member = blocking.consumer("g2")
                    member.receive(1, wait=0.1)
                    pause(holder.proc)
                    try:
                        member.close()
                    finally:
                        holder.proc.send_signal(signal.SIGCONT)

        asyncio.run(main())
    finally:
        holder.kill()


@pytest.mark.slow
def test_kill_9_of_the_serving_process_under_load_loses_no_acknowledged_write(data):
    kills = int(os.environ.get("HQUEUE_SHARED_KILLS", "10"))
    writers = [_writer(data), _writer(data)]
    tail, member = _tail(data), _member(data)
    dead_writers: list[Proc] = []
    killed_kinds: collections.Counter[str] = collections.Counter()
    try:
        wait_for(lambda: all(w.lines for w in writers) and "READY" in member.lines, 60, "the processes at work")
        for _ in range(kills):
            serving = serving_pid(data)
            assert serving is not None
            victim = next(p for p in [*writers, tail, member] if p.pid == serving)
            # When the serving process is killed under load
            victim.kill()
            if victim in writers:
                killed_kinds["writer"] += 1
                dead_writers.append(writers.pop(writers.index(victim)))
                writers.append(_writer(data))
            elif victim is tail:
                killed_kinds["tail"] += 1
                tail = _tail(data)
            else:
                killed_kinds["member"] += 1
                member = _member(data)
            # Then the others carry on: every writer gets new acknowledgements, and another serves the store
            marks = [(w, len(w.lines)) for w in writers]
            wait_for(lambda marks=marks: all(len(w.lines) > m + 10 for w, m in marks), 30, "writes to go on")
            wait_for(lambda gone=serving: serving_pid(data) not in (None, gone), 30, "another process to serve")
        for proc in [tail, member]:
            assert proc.proc.poll() is None, "a client died with the serving process"
    finally:
        for proc in [*writers, tail, member]:
            if proc.proc.poll() is None:
                proc.kill()
    acked = _acked([*writers, *dead_writers])
    twice = [i for i, n in collections.Counter(acked).items() if n > 1]
    lost = set(acked) - _stored(data)
    assert twice == [], f"{len(twice)} IDs acknowledged twice"
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged writes lost"
    print(f"\nshared store: {kills} kill -9 of the serving process ({dict(killed_kinds)}), {len(acked)} acked, 0 lost")


CHURN = """
import random, sys, time
from hqueue import HQueue, Message
errors, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        with HQueue("q", data_dir=sys.argv[1]) as queue:
            for _ in range(random.randint(1, 10)):
                queue.put(Message("t", b"v"))
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
    time.sleep(random.random() * 0.02)
print(len(errors), errors[:3], flush=True)
"""


@pytest.mark.slow
def test_processes_that_open_and_close_one_store_again_and_again_see_no_error(data):
    """Each process's last handle closing hands the store on: a read on a connection the
    old holder reset as it left (one just made, or one idle in the pool) failed with
    ServerUnavailable after 0.12 s of tries, while the next holder was still coming
    (2-5 errors in 20 s with three such processes: an acceptance probe)."""
    churners = [Proc("-c", CHURN, data, "10") for _ in range(3)]
    for churner in churners:
        assert churner.proc.wait(timeout=120) == 0
        churner.kill()  # (reaped: joins its reader)
    assert [churner.lines for churner in churners] == [["0 []"]] * 3


def test_processes_that_use_a_held_store_leave_its_holder_s_log_alone(data):
    """Each process that came to a store another one held opened RocksDB first, which set up
    its log (renaming the holder's LOG away) before it failed on the lock: 53 LOG.old files
    after 10 takeovers, and the holder's own log lost among them."""
    import glob

    with HQueue("q", data_dir=data) as queue:  # (this process holds the store)
        queue.put(Message("t", b"x"), partition_id=0)
        before = set(glob.glob(os.path.join(data, "LOG.old.*")))
        for _ in range(3):
            client = Proc("-c", PUT_ONE_ELSEWHERE, data)
            assert client.proc.wait(timeout=60) == 0
            client.kill()
        assert set(glob.glob(os.path.join(data, "LOG.old.*"))) == before
        assert len(list(queue.scan())) == 4


PUT_ONE_ELSEWHERE = (
    "import sys\nfrom hqueue import HQueue, Message\nfrom hqueue.sharing import StoreClient\n"
    "with HQueue('q', data_dir=sys.argv[1]) as queue:\n"
    " assert isinstance(queue.engine, StoreClient)\n queue.put(Message('t', b'y'), partition_id=0)"
)


def _as_nobody() -> None:
    os.setgid(65534)
    os.setgroups([65534])
    os.setuid(65534)


def _nobody_python() -> tuple[list[str], dict[str, str]]:
    """A Python user nobody may run with hqueue and its packages (this one, or the system's
    of the same version with this one's packages: a venv's interpreter may live under a
    home only its owner may enter); skips the test when there is none."""
    packages = os.pathsep.join(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}))
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for python, env in [(sys.executable, python_env()), (system, dict(python_env(), PYTHONPATH=f"{ROOT}:{packages}"))]:
        try:
            probe = subprocess.run([python, "-c", "import hqueue, rocksdict"], cwd=ROOT, env=env,
                                   preexec_fn=_as_nobody, capture_output=True)  # fmt: skip
        except OSError as e:
            tried.append(f"{python}: {e}")
            continue
        if probe.returncode == 0:
            return [python], env
        tried.append(f"{python}: {probe.stderr[-200:]!r}")
    pytest.skip("user nobody cannot run hqueue here: " + "; ".join(tried))


def test_a_user_of_the_store_directory_s_group_uses_the_store_through_its_socket():
    """The socket is 0660 when the store directory's group may write in it, but such a user
    could not open RocksDB's files and got StorageError instead of becoming the serving
    process's client (an acceptance probe). When the serving process died, such a client's
    calls failed at once with that StorageError (it tried to take the store over, which it
    may not), instead of waiting for a process that may (another probe)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    python, env = _nobody_python()
    base = tempfile.mkdtemp(prefix="hqueue-shared-group-")  # (pytest's are its owner's only)
    os.chmod(base, 0o755)
    data = os.path.join(base, "data")
    os.makedirs(data)
    os.chown(data, 0, 65534)
    os.chmod(data, 0o2770)  # the group may write; new files (the socket) get its group
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q", 2)
    put = [*python, "-m", "hqueue.cli", "--url", f"local://{data}", "put", "q", "group"]
    tail = _tail(data)  # root serves the store
    try:
        wait_for(lambda: os.path.exists(os.path.join(data, SOCKET_NAME)), 60, "hqueue tail to serve the store")
        assert oct(os.stat(os.path.join(data, SOCKET_NAME)).st_mode & 0o777) == "0o660"
        done = subprocess.run([*put, "from-the-group"], cwd=ROOT, env=env, preexec_fn=_as_nobody,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        wait_for(lambda: any("from-the-group" in line for line in tail.lines), 30, "tail to show the group's put")
        tail.kill()  # kill -9: no process serves the store, and nobody may not take it over
        waiting = subprocess.Popen([*put, "while-none-serves"], cwd=ROOT, env=env, preexec_fn=_as_nobody,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(3)
        assert waiting.poll() is None, waiting.communicate()[1]  # it waits for the next holder
        tail = _tail(data)
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        wait_for(lambda: any("while-none-serves" in line for line in tail.lines), 30, "tail to show the put")
    finally:
        tail.kill()
        shutil.rmtree(base, ignore_errors=True)


def test_the_socket_is_given_the_store_directory_s_group_and_a_stranger_is_told_at_once():
    """Without setgid on the store's directory, its socket took the serving process's group,
    not the directory's: a member of the directory's group waited 30 s and got "no process
    serves the store". A user the socket refuses waited as long, for the same wrong words
    (an acceptance probe)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    python, env = _nobody_python()
    base = tempfile.mkdtemp(prefix="hqueue-shared-group-")
    os.chmod(base, 0o755)
    grouped, private = os.path.join(base, "grouped"), os.path.join(base, "private")
    os.makedirs(grouped)
    os.chown(grouped, 0, 65534)
    os.chmod(grouped, 0o770)  # the group may write; no setgid
    os.makedirs(private, mode=0o755)
    tails = []
    try:
        for data in (grouped, private):
            with HQueueAdmin(data_dir=data) as admin:
                admin.create_queue("q", 1)
            tails.append(_tail(data))
            wait_for(lambda d=data: os.path.exists(os.path.join(d, SOCKET_NAME)), 60, "hqueue tail to serve the store")
        socket_stat = os.stat(os.path.join(grouped, SOCKET_NAME))
        assert (socket_stat.st_gid, oct(socket_stat.st_mode & 0o777)) == (65534, "0o660")
        assert oct(os.stat(os.path.join(private, SOCKET_NAME)).st_mode & 0o777) == "0o600"
        for data, code in ((grouped, 0), (private, 1)):
            done = subprocess.run([*python, "-m", "hqueue.cli", "--url", f"local://{data}", "put", "q", "t", "v"],
                                  cwd=ROOT, env=env, preexec_fn=_as_nobody, capture_output=True, text=True,
                                  timeout=120)  # fmt: skip
            assert done.returncode == code, (data, done.stderr)
        assert "this user may not connect to the store's socket" in done.stderr and "Traceback" not in done.stderr
        assert "token" not in done.stderr
    finally:
        for tail in tails:
            tail.kill()
        shutil.rmtree(base, ignore_errors=True)


def test_a_client_the_next_holder_s_socket_refuses_is_told_at_once():
    """A client of a store whose next holder's socket refuses it (the directory no longer
    lets its group in) waited its whole timeout, then said no process served the store."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a process as another user")
    python, env = _nobody_python()
    base = tempfile.mkdtemp(prefix="hqueue-shared-group-")
    os.chmod(base, 0o755)
    data = os.path.join(base, "data")
    os.makedirs(data)
    os.chown(data, 0, 65534)
    os.chmod(data, 0o770)
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q", 1)
    script = (
        "import sys\nfrom hqueue import HQueue, Message, HQueueError\n"
        f"with HQueue('q', 'local://{data}') as q:\n"
        "    q.put(Message('t', b'first')); print('first', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    try:\n        q.put(Message('t', b'second')); print('second')\n"
        "    except HQueueError as e:\n        print(type(e).__name__, e)\n"
    )
    tail = _tail(data)
    client = None
    try:
        wait_for(lambda: os.path.exists(os.path.join(data, SOCKET_NAME)), 60, "hqueue tail to serve the store")
        client = subprocess.Popen([*python, "-c", script], cwd=ROOT, env=env, preexec_fn=_as_nobody,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)  # fmt: skip
        assert client.stdout.readline().strip() == "first"  # type: ignore[union-attr]
        os.chmod(data, 0o750)  # the group may no longer write: the next holder's socket is its user's alone
        tail.kill()
        tail = _tail(data)
        socket_file = os.path.join(data, SOCKET_NAME)
        wait_for(lambda: os.path.exists(socket_file) and os.stat(socket_file).st_mode & 0o777 == 0o600, 60, "the next")
        out, err = client.communicate("go\n", timeout=50)  # (its calls wait 30 s at most)
        assert out.startswith("NotAuthorized") and "may not connect to the store's socket" in out, (out, err)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        tail.kill()
        shutil.rmtree(base, ignore_errors=True)


# -- one store, one engine per process; and fork() ------------------------------------------


def test_two_spellings_of_one_directory_are_one_store_in_a_process(tmp_path):
    """A symlink to the directory, or a leading "//", opened it twice in one process: two
    RocksDB writers on one directory, IDs given twice, then a store that would not open
    (an attacker's pass)."""
    from hqueue import Message

    real = tmp_path / "data"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with HQueueAdmin(f"local://{real}") as admin:
        admin.create_queue("q", 1)
    spellings = [f"local://{real}", f"local://{tmp_path}/link", f"local:///{real}", f"local://{real}/"]
    handles = [HQueue("q", url) for url in spellings]
    try:
        assert len({id(h.engine) for h in handles}) == 1
        ids = [i for h in handles for i in h.put([Message("t", b"x")] * 50)]
        assert len(set(ids)) == len(ids) == 200
    finally:
        for h in handles:
            h.close()
    with HQueue("q", f"local://{real}") as queue:
        assert sorted(m.id for m in queue.scan()) == sorted(ids)


@pytest.mark.parametrize("path", ["x#y", "x?y", "x\ny"])
def test_a_store_path_a_url_would_read_otherwise_is_refused(tmp_path, path):
    """'/tmp/x#y' named the store in /tmp/x (and a newline was dropped): two configured
    directories could silently be one store."""
    from hqueue import InvalidArgument

    with pytest.raises(InvalidArgument, match="may not hold '#', '\\?' or control characters"):
        HQueueAdmin(data_dir=str(tmp_path / path))
    with pytest.raises(InvalidArgument, match="'#' part|takes no options|control characters"):
        HQueueAdmin(f"local://{tmp_path}/{path}")
    with pytest.raises(InvalidArgument, match="a local:// URL takes no options"):
        HQueueAdmin(f"local://{tmp_path}/data?timeout=5")
    with HQueueAdmin(data_dir=str(tmp_path / "odd://name")) as admin:  # a path, "://" and all
        admin.create_queue("q", 1)
    assert os.path.isdir(tmp_path / "odd:" / "name")


def _in_child(work) -> tuple[int, str]:
    """Run ``work()`` in a forked child; (its exit status, what it wrote or raised)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never run the parent's cleanup
        os.close(read)
        try:
            out, code = str(work()), 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out, code = f"{type(e).__name__}: {e}", 1
        os.write(write, out.encode()[:60000])
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    return os.waitpid(pid, 0)[1], out


def test_a_forked_child_uses_the_store_as_a_client_and_not_the_parents_handles(tmp_path):
    """A child forked with the store open wrote to RocksDB with the parent's engine (acked
    IDs given to other messages, 4,000 of 6,000 acked puts lost); one forked from a client
    shared its put lanes (the parent's puts answered with the child's IDs)."""
    from hqueue import Message
    from hqueue.sharing import StoreClient

    url = f"local://{tmp_path}/data"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    with HQueue("q", url) as parent:
        before = parent.put([Message("t", b"parent")] * 100)

        def child_opens_its_own():
            with HQueue("q", url) as queue:
                assert isinstance(queue.engine, StoreClient), type(queue.engine)
                return len(queue.put([Message("t", b"child")] * 100))

        assert _in_child(child_opens_its_own) == (0, "100")

        def child_uses_the_parents():
            return parent.put(Message("t", b"inherited"))

        status, out = _in_child(child_uses_the_parents)
        assert status != 0 and "HQueue was opened before this process forked: open one in this process" in out
        # nor a consumer or a scanner made before the fork (they wrote and read through the parent's engine)
        with parent.consumer("g") as consumer:
            scanner = parent.get_queue_scanner(caching=10)
            for name, use in (("Consumer", lambda: consumer.receive(1, wait=0)), ("scanner", lambda: list(scanner))):
                status, out = _in_child(use)
                assert status != 0 and f"this {name} was opened before this process forked" in out, out
            scanner.close()
        after = parent.put([Message("t", b"parent")] * 100)
        values = collections.Counter(m.value for m in parent.scan())
    assert values == {b"parent": 200, b"child": 100}
    assert min(after) > max(before)


def test_a_message_that_kills_the_process_holding_its_group_is_dead_lettered_after_its_retries(tmp_path):
    """A poison message that made the process holding the store crash came back as a first
    delivery in the next one, for ever: the failures were counted by the process that died.
    The holder's hand-out mark makes the next holder count each crash."""
    data = str(tmp_path / "data")
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q", 1)
    from hqueue import Message

    with HQueue("q", data_dir=data) as queue:
        poison = queue.put(Message("t", b"poison"))[0]
    script = (
        "import os, signal, sys\nfrom hqueue import HQueue\n"
        "with HQueue('q', data_dir=sys.argv[1]) as q, q.consumer('g', max_retries=1) as c:\n"
        "    got = c.receive(1, wait=3)\n"
        "    print(got[0].attempt if got else 0, flush=True)\n"
        "    if got:\n        os.kill(os.getpid(), signal.SIGKILL)  # the message kills its holder\n"
    )
    attempts = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script, data], cwd=ROOT, env=python_env(),
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        attempts.append(int(done.stdout.strip() or -1))
    assert attempts == [1, 2, 0], attempts  # the third holder counted a second failure: past max_retries=1
    with HQueue("q.dlq", data_dir=data) as dlq:
        dead = list(dlq.scan())
    assert [m.value for m in dead] == [b"poison"], dead
    with HQueue("q", data_dir=data) as queue, queue.consumer("g") as consumer:
        assert consumer.receive(1, wait=0.5) == []  # finished in the group: not handed out again
        queue.put(Message("t", b"fine"))
    # A holder that stops cleanly with a message in flight counts no failure for it
    clean = script.replace("os.kill(os.getpid(), signal.SIGKILL)", "pass")
    attempts = [
        subprocess.run(
            [sys.executable, "-c", clean, data], cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=60
        ).stdout.strip()  # fmt: skip
        for _ in range(2)
    ]
    assert attempts == ["1", "1"], attempts
    assert poison is not None


def _holder(data: str, body: str, consumer: str = "max_retries=1") -> str:
    """Run ``body`` in a process of its own, with ``q`` (queue 'q') and ``c`` (a member of
    group 'g', made with ``consumer``'s arguments) open on the store, and ``die()`` to kill
    it with SIGKILL; what it printed."""
    script = (
        "import os, signal, sys, time\nfrom hqueue import HQueue, Message\n"
        "def die():\n    sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        f"with HQueue('q', data_dir=sys.argv[1]) as q, q.consumer('g', {consumer}) as c:\n"
        + textwrap.indent(body, "    ")
    )
    done = subprocess.run([sys.executable, "-c", script, data], cwd=ROOT, env=python_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.stdout.strip()


def _dead_letters(data: str) -> list[bytes]:
    with HQueueAdmin(data_dir=data) as admin:
        if not admin.queue_exists("q.dlq"):
            return []
        with admin.queue("q.dlq") as dlq:
            return sorted(m.value for m in dlq.scan())


def _store_with(tmp_path, *values: bytes, durability: str = "SYNC_WAL") -> str:
    data = str(tmp_path / "data")
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q", 1, durability=durability)
    with HQueue("q", data_dir=data) as queue:
        queue.put([Message("t", value) for value in values])
    return data


@pytest.mark.parametrize("failed", ["nack", "lease run out"])
def test_a_death_counts_no_failure_for_a_message_waiting_for_its_retry(tmp_path, failed):
    """A message whose failure was counted already (nacked, or its lease ran out) waits for
    its retry, held by nobody: a death then is not its failure. It comes back as attempt 2,
    not dead-lettered (max_retries=1: a second count would have)."""
    data = _store_with(tmp_path, b"m")
    fail = "c.nack(got, delay=60)" if failed == "nack" else "time.sleep(1.5); q.pending('g')"
    out = _holder(data, f"got = c.receive(1, wait=3)\nprint(got[0].attempt)\n{fail}\ndie()\n",
                  "max_retries=1, lease=1")  # fmt: skip
    assert out == "1"
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\n") == "[(b'm', 2)]"
    assert _dead_letters(data) == []


def test_each_death_counts_only_what_its_holder_held(tmp_path):
    """A death counted once stays counted once: the next holder that dies having only read
    the group's state (describe), or having handed out again only some of the messages,
    counts those it held, not the first holder's again (max_retries=1)."""
    values = [b"%d" % i for i in range(20)]
    data = _store_with(tmp_path, *values)
    assert _holder(data, "print(len(c.receive(20, wait=3)))\ndie()\n") == "20"  # each failed once
    assert _holder(data, "q.pending('g')\nprint('read')\ndie()\n") == "read"  # holds nothing
    assert _holder(data, "print([d.attempt for d in c.receive(5, wait=3)])\ndie()\n") == "[2, 2, 2, 2, 2]"
    out = _holder(data, "got = c.receive(100, wait=3)\nprint(sorted(d.attempt for d in got))\nc.ack(got)\n")
    assert out == str([2] * 15)  # the five that died twice are past max_retries=1
    assert len(_dead_letters(data)) == 5


def test_a_skip_wal_queues_death_does_not_count_an_ack_it_lost(tmp_path):
    """On a SKIP_WAL queue a kill loses the latest acks (they go out again): the hand-out
    mark is lost with them, so an acked message is never counted failed (max_retries=0
    dead-lettered it)."""
    data = _store_with(tmp_path, b"m", durability="SKIP_WAL")
    out = _holder(data, "got = c.receive(1, wait=3)\nprint(c.ack(got))\ndie()\n", "max_retries=0")
    assert out == "1"
    out = _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\n", "max_retries=0")
    assert out in ("[]", "[(b'm', 1)]")  # (the ack kept, or lost with the mark)
    assert _dead_letters(data) == []


def test_hqueue_consume_stopped_by_sigterm_leaves_its_group_cleanly(tmp_path):
    """SIGTERM (systemd's or Kubernetes' stop) ends `hqueue consume` as Ctrl-C does: what it
    held goes back unseen, where being killed counted a failure (max_retries=0 dead-lettered it)."""
    data = _store_with(tmp_path, b"m")
    with HQueue("q", data_dir=data) as queue:  # the group, made with max_retries=0
        queue.consumer("g", max_retries=0).close()
    consume = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", f"local://{data}", "consume", "q", "g", "--no-ack"],
        cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert consume.stdout is not None
        assert consume.stdout.readline().rstrip().endswith("m")  # it holds the message
        consume.send_signal(signal.SIGTERM)
        assert consume.wait(timeout=30) == 130
    finally:
        consume.kill()
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\n", "max_retries=0") == (
        "[(b'm', 1)]"
    )
    assert _dead_letters(data) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_hqueue_consume_exec_stopped_stops_the_command_s_processes_too(tmp_path, signum):
    """Only the command's shell was killed: what it started went on with the message, which
    the group handed to another member at once (the same message worked on twice). SIGHUP
    (the terminal closed) stops it cleanly too."""
    data = _store_with(tmp_path, b"m")
    pids = tmp_path / "pids"
    command = f"echo $$ > {pids}; sleep 60 & echo $! >> {pids}; sleep 61 & echo $! >> {pids}; wait; echo finished"
    consume = subprocess.Popen(
        [sys.executable, "-m", "hqueue.cli", "--url", f"local://{data}", "consume", "q", "g", "--exec", command],
        cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 3, 30, "the command to start")
        started = [int(pid) for pid in pids.read_text().split()]
        consume.send_signal(signum)
        assert consume.wait(timeout=30) == 130
    finally:
        consume.kill()

    def gone() -> bool:
        for pid in started:
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                return False
        return True

    wait_for(gone, 10, "none of the command's processes to be left")
    assert consume.stdout is not None and "finished" not in consume.stdout.read()
    # and the message went back unseen, for the next member
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\n") == "[(b'm', 1)]"


def test_hqueue_consume_exec_s_command_may_use_the_terminal(tmp_path):
    """In a process group of its own, CMD was a background job of the terminal: a prompt on
    /dev/tty stopped it (SIGTTIN) and consume waited for ever (a review)."""
    import pty
    import select

    data = _store_with(tmp_path, b"m")
    command = 'cat >/dev/null; printf "ok? " >/dev/tty; read x </dev/tty; echo "got $x" >/dev/tty'
    argv = [sys.executable, "-m", "hqueue.cli", "--url", f"local://{data}", "consume", "q", "g", "--max", "1",
            "--exec", command]  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:  # the child: consume, on the terminal
        os.chdir(ROOT)
        os.execvpe(argv[0], argv, python_env())
    out = b""
    try:
        deadline = time.monotonic() + 30
        while b"ok? " not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                out += os.read(fd, 4096)
        assert b"ok? " in out, out
        os.write(fd, b"yes\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    out += os.read(fd, 4096)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        assert done and os.waitstatus_to_exitcode(status) == 0, out
        assert b"got yes" in out
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.parametrize("affinity", ["", ", key_affinity='topic'"], ids=["any order", "key order"])
def test_a_message_whose_retries_are_spent_goes_to_the_dead_letters_after_its_holder_stops(tmp_path, affinity):
    """A message past its retries waits for its dead-letter write while the dead-letter
    queue cannot take it (here: disabled). The next holder (its first stopped meanwhile)
    dead-letters it; it handed it out again, as attempt 2 of max_retries=0."""
    data = _store_with(tmp_path, b"m")
    with HQueueAdmin(data_dir=data) as admin:
        admin.create_queue("q.dlq", 1)
        admin.disable_queue("q.dlq")
    out = _holder(data, "got = c.receive(1, wait=3)\ntime.sleep(1.5)\nprint(q.pending('g')[0].attempt)\n",
                  f"max_retries=0, lease=1{affinity}")  # fmt: skip
    assert out == "2"  # its lease ran out: a failure, past max_retries=0, and no dead-letter queue to take it
    with HQueueAdmin(data_dir=data) as admin:
        admin.enable_queue("q.dlq")
    assert _holder(data, "print(c.receive(1, wait=1))\n", f"max_retries=0{affinity}") == "[]"
    assert _dead_letters(data) == [b"m"]


def test_a_retry_out_again_at_a_clean_stop_is_not_counted_at_a_later_death(tmp_path):
    """H1 hands x out twice (nack 0 between), then closes CLEANLY: leave gives x back unseen,
    its record stays b'1+', the mark is removed. H2 hands out only 'a' (below x) and dies.
    H3 must not count x (H2 never held it): x failed once only, max_retries=1."""
    data = _store_with(tmp_path, b"a", b"x")
    out = _holder(
        data,
        (
            "got = c.receive(2, wait=3)\n"
            "x = [d for d in got if d.value == b'x']\n"
            "c.nack(x, delay=0)\n"
            "again = c.receive(1, wait=3)\n"
            "print([(d.value, d.attempt) for d in got + again])\n"
        ),
    )  # clean exit: consumer leaves, store closes (marks cleared)
    assert out == "[(b'a', 1), (b'x', 1), (b'x', 2)]"
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\ndie()\n") == "[(b'a', 1)]"
    out = _holder(data, "got = c.receive(10, wait=3)\nprint(sorted((d.value, d.attempt) for d in got))\nc.ack(got)\n")
    assert out == "[(b'a', 2), (b'x', 2)]"
    assert _dead_letters(data) == []


def test_first_delivery_handed_with_a_retry_in_one_receive_is_marked(tmp_path):
    """A receive that hands out a retry (marked at once, with the mark) and then a first
    delivery: the first delivery must be covered by a mark too, else a death does not count it."""
    data = _store_with(tmp_path, b"m0", b"m1")
    out = _holder(
        data,
        (
            "got = c.receive(1, wait=3)\n"
            "c.nack(got, delay=0)\n"
            "time.sleep(0.3)\n"
            "got = c.receive(2, wait=3)\n"
            "print([(d.value, d.attempt) for d in got])\n"
            "time.sleep(1)\n"
            "die()\n"
        ),
        "max_retries=5",
    )
    assert out == "[(b'm0', 2), (b'm1', 1)]"
    out = _holder(
        data,
        "got = c.receive(10, wait=3)\nprint(sorted((d.value, d.attempt) for d in got))\nc.ack(got)\n",
        "max_retries=5",
    )
    assert out == "[(b'm0', 3), (b'm1', 2)]"


def test_a_hand_out_long_before_the_death_is_counted(tmp_path):
    """An embedded store's mark is written by every receive that hands out more: m1, handed
    out 0.02 s after m0, then held 2 s by a holder that dies, counts (the mark was written
    at most every 0.1 s, and m1 waited for a next receive to be marked)."""
    data = _store_with(tmp_path, b"m0", b"m1")
    out = _holder(
        data,
        (
            "got = c.receive(1, wait=3)\n"
            "c.ack(got)\n"
            "got2 = c.receive(1, wait=3)\n"
            "print([(d.value, d.attempt) for d in got + got2])\n"
            "time.sleep(2)\n"
            "die()\n"
        ),
        "max_retries=5",
    )
    assert out == "[(b'm0', 1), (b'm1', 1)]"
    out = _holder(
        data,
        "got = c.receive(10, wait=3)\nprint(sorted((d.value, d.attempt) for d in got))\nc.ack(got)\n",
        "max_retries=5",
    )
    assert out == "[(b'm1', 2)]"


def test_a_death_read_while_the_queue_is_disabled_still_counts(tmp_path):
    """The next holder's first read of the group failed half way (the queue disabled): the
    half-read state was kept, and the death never counted."""
    from hqueue import QueueDisabled

    data = _store_with(tmp_path, b"m")
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\ndie()\n") == "[(b'm', 1)]"
    with HQueueAdmin(data_dir=data) as admin, HQueue("q", data_dir=data) as queue:
        admin.disable_queue("q")
        with pytest.raises(QueueDisabled):
            queue.pending("g")
        admin.enable_queue("q")
        with queue.consumer("g") as member:
            assert [(d.value, d.attempt) for d in member.receive(1, wait=3)] == [(b"m", 2)]


def test_messages_a_member_gave_back_unseen_are_not_counted_at_a_death_before_they_go_out_again(tmp_path):
    """A member that closes gives back what it holds, unseen: held by nobody, they are no
    failure of a death that comes before another member takes them (attempt 1, not 2)."""
    data = _store_with(tmp_path, b"a", b"b")
    body = (
        "first = q.consumer('g', member='first')\n"
        "print(sorted((d.value, d.attempt) for d in first.receive(2, wait=3)))\n"
        "first.close()\n"
        "die()\n"
    )
    assert _holder(data, body) == "[(b'a', 1), (b'b', 1)]"
    out = _holder(data, "got = c.receive(10, wait=3)\nprint(sorted((d.value, d.attempt) for d in got))\nc.ack(got)\n")
    assert out == "[(b'a', 1), (b'b', 1)]"


def test_a_message_that_kills_its_holder_in_a_key_ordered_group_is_dead_lettered_after_its_retries(tmp_path):
    """With key affinity (the Processor's groups) a death counted nothing: a message that
    made each holder crash came back as attempt 1 for ever, and its key's later messages
    waited behind it. Each first delivery is marked out there, so each crash counts."""
    data = _store_with(tmp_path, b"poison", b"next")
    body = "got = c.receive(1, wait=3)\nprint([(d.value, d.attempt) for d in got])\ndie()\n"
    ordered = "max_retries=1, key_affinity='topic'"
    assert _holder(data, body, ordered) == "[(b'poison', 1)]"
    assert _holder(data, body, ordered) == "[(b'poison', 2)]"
    out = _holder(
        data, "got = c.receive(10, wait=3)\nprint([(d.value, d.attempt) for d in got])\nc.ack(got)\n", ordered
    )
    assert out == "[(b'next', 1)]"  # the poison past max_retries=1, in the dead letters; its key goes on
    assert _dead_letters(data) == [b"poison"]


def test_a_message_held_back_for_its_key_is_not_counted_at_a_death(tmp_path):
    """In a key-ordered group a message whose key another member holds is held back, never
    handed out: a death counts the held one only (attempt 2), the held-back one goes out
    after it as a first delivery."""
    data = _store_with(tmp_path, b"a1", b"a2", b"a3")
    body = (
        "other = q.consumer('g', member='other', key_affinity='topic')\n"
        "held = c.receive(1, wait=3)\n"
        "print([(d.value, d.attempt) for d in held], other.receive(10, wait=0.5))\n"
        "die()\n"
    )
    assert _holder(data, body, "max_retries=1, key_affinity='topic'") == "[(b'a1', 1)] []"
    out = _holder(
        data,
        "got = c.receive(10, wait=3)\nprint([(d.value, d.attempt) for d in got])\nc.ack(got)\n",
        "max_retries=1, key_affinity='topic'",
    )
    assert out == "[(b'a1', 2), (b'a2', 1), (b'a3', 1)]"  # in key order
    assert _dead_letters(data) == []


@pytest.mark.parametrize("affinity", ["", ", key_affinity='topic'"], ids=["any order", "key order"])
def test_a_retry_given_back_unseen_is_not_counted_at_a_death(tmp_path, affinity):
    """A retry handed out again is marked out; given back unseen (its member closed) it waits,
    held by nobody: a death before it goes out again is not its failure (its mark stayed, and
    max_retries=1 dead-lettered it)."""
    data = _store_with(tmp_path, b"x")
    body = (
        f"first = q.consumer('g', member='first'{affinity})\n"
        "got = first.receive(1, wait=3)\n"
        "first.nack(got, delay=0)\n"
        "again = first.receive(1, wait=3)\n"
        "print([(d.value, d.attempt) for d in got + again])\n"
        "first.close()\n"
        "die()\n"
    )
    assert _holder(data, body, f"max_retries=1{affinity}") == "[(b'x', 1), (b'x', 2)]"
    out = _holder(
        data, "got = c.receive(10, wait=3)\nprint([(d.value, d.attempt) for d in got])\nc.ack(got)\n",
        f"max_retries=1{affinity}",
    )  # fmt: skip
    assert out == "[(b'x', 2)]"
    assert _dead_letters(data) == []


@pytest.mark.parametrize("affinity", ["", ", key_affinity='topic'"], ids=["any order", "key order"])
def test_a_message_given_back_at_a_clean_stop_counts_at_the_next_holders_death(tmp_path, affinity):
    """A clean stop gives m back unseen (a record of no failures); the next holder hands it
    out and dies: that death counts (attempt 2). With key affinity a message read with a
    record was not marked out, so each clean stop gave a message that kills its holder one
    death for free."""
    data = _store_with(tmp_path, b"m")
    body = "print([(d.value, d.attempt) for d in c.receive(1, wait=3)])\n"
    assert _holder(data, body, f"max_retries=3{affinity}") == "[(b'm', 1)]"  # a clean stop
    assert _holder(data, body + "die()\n", f"max_retries=3{affinity}") == "[(b'm', 1)]"
    assert _holder(data, body, f"max_retries=3{affinity}") == "[(b'm', 2)]"


def test_a_held_back_message_handed_out_by_the_next_holder_counts_at_its_death(tmp_path):
    """m2, held back for its key when the first holder died, has a record (not out); the next
    holder hands it out (after m1's ack) and dies holding it: that death counts it."""
    data = _store_with(tmp_path, b"m1", b"m2")
    ordered = "max_retries=3, key_affinity='topic'"
    body = (
        "other = q.consumer('g', member='other', key_affinity='topic')\n"
        "held = c.receive(1, wait=3)\n"
        "print([(d.value, d.attempt) for d in held], other.receive(10, wait=0.5))\n"
        "die()\n"
    )
    assert _holder(data, body, ordered) == "[(b'm1', 1)] []"
    body = (
        "got = c.receive(1, wait=3)\nc.ack(got)\ngot += c.receive(1, wait=3)\n"
        "print([(d.value, d.attempt) for d in got])\ndie()\n"
    )
    assert _holder(data, body, ordered) == "[(b'm1', 2), (b'm2', 1)]"
    assert _holder(data, "print([(d.value, d.attempt) for d in c.receive(5, wait=3)])\n", ordered) == "[(b'm2', 2)]"
