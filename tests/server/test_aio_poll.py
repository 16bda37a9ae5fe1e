"""The asyncio client's polling for answers (aio/client/awake.py): a wait polls only while
answers come that soon, the loop's other tasks run meanwhile, and nothing keeps the loop
awake once the waits end. What it buys is in bench/ (aio_groups.py); these tests check
behaviour and CPU left alone."""

from __future__ import annotations

import asyncio
import gc
import struct
import time
from types import SimpleNamespace

import pytest

from hqueue import Message
from hqueue.aio import AsyncHQueue, AsyncHQueueAdmin
from hqueue.aio.client import awake as awake_module
from hqueue.aio.client.awake import Awake, awake
from hqueue.errors import InvalidArgument
from hqueue.rpc.spin import DEFAULT_CLIENT_POLL_US, NEAR_MISSES, STRETCH, Spin
from hqueue.server import HQueueServer


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", "127.0.0.1", 0, local_socket=False).start()
    yield server
    server.stop()


async def spin_of(admin: AsyncHQueueAdmin) -> Spin | None:
    """The poll of the connection ``admin`` calls on (after one call)."""
    await admin.list_queues()
    (pool,) = (await admin.async_engine())._pools.values()
    (connection,) = pool._idle
    return connection._frames.spin


def test_an_asyncio_connection_polls_as_its_url_or_environment_says(server, monkeypatch):
    async def spins() -> list[Spin | None]:
        found = []
        for options in ("", "?poll_us=250", "?poll_us=0"):
            async with AsyncHQueueAdmin(f"hqueue://{server.address}{options}") as admin:
                found.append(await spin_of(admin))
        monkeypatch.setenv("HQUEUE_POLL_US", "40")
        async with AsyncHQueueAdmin(f"hqueue://{server.address}") as admin:
            found.append(await spin_of(admin))
        return found

    default, given, none, from_env = asyncio.run(spins())
    assert default is not None and default.limit == DEFAULT_CLIENT_POLL_US / 1e6
    assert given is not None and given.limit == 250e-6
    assert none is None
    assert from_env is not None and from_env.limit == 40e-6

    async def refused(bad: str) -> None:
        with pytest.raises(InvalidArgument, match="poll_us"):  # before any connection
            async with AsyncHQueueAdmin(f"hqueue://127.0.0.1:1?poll_us={bad}") as admin:
                await admin.list_queues()

    for bad in ("-1", "x", "10001"):
        asyncio.run(refused(bad))


def test_quick_answers_are_polled_for_and_a_late_one_is_slept_for(server, monkeypatch):
    caught = []
    spin_caught = Spin.caught
    monkeypatch.setattr(Spin, "caught", lambda spin: (caught.append(1), spin_caught(spin))[1])

    async def main() -> tuple[float, bool]:
        url = f"hqueue://{server.address}?poll_us=10000"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 1)
        async with AsyncHQueue("q", url) as queue:
            for i in range(200):  # one call after another: answers come within the poll
                await queue.put(Message("t", b"%d" % i), 0)
            async with queue.consumer("g") as member:
                await member.ack(await member.receive(200, wait=0))
                started = time.process_time()
                assert await member.receive(10, wait=1.5) == []  # answered after 1.5 s: slept for
                late = time.process_time() - started
            return late, awake().running

    late, still_polling = asyncio.run(main())
    assert caught, "no answer that came at once was caught by a poll"
    assert late < 0.3, f"a receive waiting 1.5 s used {late:.2f} s of the process's CPU"
    assert not still_polling


def test_the_loops_other_tasks_run_while_a_call_polls(server):
    async def main() -> tuple[int, bool]:
        url = f"hqueue://{server.address}?poll_us=10000"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 1)
            ticks, polling, stop = 0, False, False

            async def ticker() -> None:
                nonlocal ticks, polling
                while not stop:
                    ticks += 1
                    polling = polling or awake().running  # (seen by another task: the calls' poll ran meanwhile)
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(ticker())
            try:
                for _ in range(50):
                    await admin.list_queues()
            finally:
                stop = True
                await task
            return ticks, polling

    ticks, polling = asyncio.run(main())
    assert polling and ticks > 50


def test_a_wait_that_polls_teaches_its_spin_and_leaves_the_loop_asleep_after():
    async def main() -> None:
        keeper = Awake()
        spin = Spin(2000)
        began = keeper.begin(spin)  # off: a blocking wait, timed
        assert began < 0 and not keeper.running
        keeper.end(spin, began, came=True)  # (at once: a poll would have caught it)
        assert spin.on
        began = keeper.begin(spin)
        assert began > 0 and keeper.running
        keeper.end(spin, began, came=True)  # within the limit: caught, it polls on
        assert spin.on
        await asyncio.sleep(0.01)
        assert not keeper.running  # no wait left: the loop may sleep

        began = keeper.begin(spin)
        await asyncio.sleep(0.005)  # longer than the 2 ms poll
        keeper.end(spin, began, came=True)
        assert not spin.on  # in vain: it waits for short waits again before it polls
        await asyncio.sleep(0.01)
        assert not keeper.running

        spin.blocked(0.00001), spin.blocked(0.00001)
        assert spin.on
        began = keeper.begin(spin)
        keeper.end(spin, began, came=False)  # cancelled: learns nothing, and stops counting it
        assert spin.on and not keeper._polls

    asyncio.run(main())


def test_a_poll_in_vain_counts_its_wait_toward_a_stretch_as_a_blocking_clients_does(monkeypatch):
    now = [100.0]  # (the asyncio side's clock, moved by hand: no timing in the test)
    monkeypatch.setattr(awake_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    async def main() -> tuple[list[int], list[float]]:
        keeper, asyncio_spin, blocking_spin = Awake(), Spin(300), Spin(300)

        def asyncio_wait(seconds: float) -> None:
            began = keeper.begin(asyncio_spin)
            now[0] += seconds
            keeper.end(asyncio_spin, began, came=True)

        # Given both polling after a quick answer
        asyncio_wait(0.00001)
        blocking_spin.blocked(0.00001)
        assert asyncio_spin.on and blocking_spin.on
        # When an answer comes 430 µs later: past the 300 µs poll (in vain), within its stretch
        asyncio_wait(0.00043)
        assert blocking_spin.poll(lambda: []) is None  # (a blocking client's poll, then its wait: rpc/bounded.py)
        blocking_spin.blocked(0.00043)
        # Then both count that wait as a near one: as many more stretch either poll
        needed = []
        for spin, wait in ((asyncio_spin, asyncio_wait), (blocking_spin, blocking_spin.blocked)):
            count = 0
            while not spin.on:
                wait(0.00043)
                count += 1
            needed.append(count)
        return needed, [asyncio_spin.limit, blocking_spin.limit]

    needed, limits = asyncio.run(main())
    assert needed == [NEAR_MISSES - 1, NEAR_MISSES - 1]
    assert limits == [STRETCH * 300e-6] * 2


def test_an_event_loop_that_ended_leaves_nothing_behind():
    from hqueue.aio.client import awake as module

    async def main() -> None:
        awake()

    before = len(module._AWAKE)
    for _ in range(3):
        asyncio.run(main())
    gc.collect()
    assert len(module._AWAKE) <= before  # (each loop's keeper went with its loop)


def test_a_cancelled_call_that_polled_leaves_no_poll_running(server):
    async def main() -> tuple[list[float], bool]:
        url = f"hqueue://{server.address}?poll_us=10000"
        async with AsyncHQueueAdmin(url) as admin:
            await admin.create_queue("q", 1)
        async with AsyncHQueue("q", url) as queue:
            async with queue.consumer("g") as member:
                for _ in range(30):  # quick answers: the connection polls
                    await member.receive(1, wait=0)
                call = asyncio.ensure_future(member.receive(1, wait=5))
                await asyncio.sleep(0.05)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            await asyncio.sleep(0.05)
            now = time.perf_counter()  # (its answer, still read, may be owed: its poll ended all the same)
            return [end for end in awake()._polls.values() if end > now], awake().running

    assert asyncio.run(main()) == ([], False)


def test_a_long_wait_under_way_does_not_keep_the_loop_polling_after_a_quick_one():
    async def main() -> bool:
        keeper = Awake()
        long_wait, quick = Spin(1000), Spin(20_000)
        long_wait.on = quick.on = True
        keeper.begin(long_wait)  # (a long poll: its answer comes seconds later)
        await asyncio.sleep(0.005)  # its 1 ms of polling is over
        keeper.end(quick, keeper.begin(quick), came=True)  # a quick call on another connection, answered
        await asyncio.sleep(0.002)
        return keeper.running

    assert asyncio.run(main()) is False  # (it polled on for the quick call's 20 ms)


def test_an_answer_that_comes_in_pieces_teaches_its_spin_once():
    from hqueue.aio.client.frames import Frames

    learned = []

    class Counted(Spin):
        def blocked(self, seconds: float) -> None:
            learned.append("blocked")
            super().blocked(seconds)

        def caught(self) -> None:
            learned.append("caught")
            super().caught()

        def missed(self) -> None:
            learned.append("missed")
            super().missed()

    class Transport(asyncio.Transport):
        def pause_reading(self) -> None: ...

    async def main() -> None:
        frames = Frames()
        frames.spin = Counted(500)
        frames.connection_made(Transport())
        body = struct.pack("!Ii", 0x80010002, 16) + b"scannerGetPacked" + struct.pack("!i", 0)
        body += b"\x0b\x00\x00" + struct.pack("!i", 600) + b"x" * 600 + b"\x00"
        answer = struct.pack("!i", len(body)) + body
        frames.sent("scannerGetPacked", 0)
        reading = asyncio.ensure_future(frames.answer())
        for start in range(0, len(answer), 64):  # (a big answer comes in many reads)
            await asyncio.sleep(0)
            frames.data_received(answer[start : start + 64])
        assert await reading == answer[4:]

    asyncio.run(main())
    assert len(learned) == 1, learned
