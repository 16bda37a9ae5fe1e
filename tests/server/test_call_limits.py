"""What one call may cost a server: the put caps (messages, bytes), the frame
limit, and the memory budget of all calls under way. Each refusal is a typed
error naming the limit, comes before anything is unpacked (or, for the frame
limit and the budget, before the frame's body is even read), writes nothing,
and leaves the connection serving.

The RSS and stall figures these bounds buy are in ``bench/hostile.py``.
"""

import socket
import struct
import threading

import pytest
from click.testing import CliRunner

from hqueue import HQueue, HQueueAdmin, LimitExceeded, Message, ServerBusy
from hqueue.errors import InvalidArgument, InvalidQueueName
from hqueue.rpc import packed, wire
from hqueue.rpc.budget import InflightBudget
from hqueue.rpc.connections import ServerLimits
from hqueue.rpc.frames import FrameReader
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from .test_hardening import _call, raw_client


def make_server(tmp_path, limits=None, **caps):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, limits=limits, **caps).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 1, max_message_bytes=2000)
    return server


def stored(server) -> int:
    with HQueue("q", f"hqueue://{server.address}") as queue:
        return sum(1 for _ in queue.scan())


@pytest.fixture
def capped(tmp_path):
    server = make_server(tmp_path, max_put_messages=100, max_put_bytes=1000)
    yield server
    server.stop()


# -- the put caps ----------------------------------------------------------------------


def test_a_blob_over_the_message_cap_is_refused_from_its_header(capped):
    client = raw_client(capped.port)
    with pytest.raises(T.TInvalidMessage, match=r"max_put_messages=100: .* this one has 101"):
        client.putPacked("q", 0, packed.pack([b"t"] * 101, [b""] * 101))
    # A blob of 1.8M messages inside the frame limit is refused before one is unpacked.
    with pytest.raises(T.TInvalidMessage, match=r"max_put_messages=100: .* this one has 1864135"):
        client.putPacked("q", 0, struct.pack("<I", 1_864_135) + b"\0" * (8 * 1_864_135))
    with pytest.raises(T.TInvalidMessage, match="max_put_messages=100"):
        client.scheduleTimers("q", 0, packed.pack([b"t"] * 101, [b""] * 101), 0)
    assert client.putPacked("q", 0, packed.pack([b"t"] * 100, [b""] * 100)).count == 100  # at the cap: taken
    client.close()
    assert stored(capped) == 100


def test_a_blob_over_the_byte_cap_is_refused(capped):
    client = raw_client(capped.port)
    with pytest.raises(T.TInvalidMessage, match=r"max_put_bytes=1000: .* this one has 1002"):
        client.putPacked("q", 0, packed.pack([b"t", b"t"], [b"x" * 500, b"x" * 500]))
    assert client.listQueues()[0].name == "q"
    client.close()
    assert stored(capped) == 0


def test_struct_puts_have_the_same_caps(capped):
    client = raw_client(capped.port)
    with pytest.raises(T.TInvalidMessage, match="max_put_messages=100"):
        client.putMessages("q", [T.TMessage(topic=b"t", value=b"")] * 101)
    with pytest.raises(T.TInvalidMessage, match="max_put_bytes=1000"):
        client.putMessagesWithPid("q", 0, [T.TMessage(topic=b"t", value=b"x" * 500)] * 2)
    client.close()
    assert stored(capped) == 0


def test_a_server_with_lower_caps_refuses_a_batch_whole_and_names_the_limit(capped):
    """A batch is atomic: a server with lower caps refuses it whole, typed, and the client never splits it."""
    with HQueue("q", f"hqueue://{capped.address}") as queue:
        with pytest.raises(LimitExceeded, match="--max-put-messages") as refused:
            queue.put([Message("t", b"%03d" % i) for i in range(250)], partition_id=0)
        assert (refused.value.limit, refused.value.value) == ("max_put_messages", 100)
        assert len(queue.put([Message("t", b"%03d" % i) for i in range(100)], partition_id=0)) == 100
        with pytest.raises(LimitExceeded, match="--max-put-bytes") as refused:
            queue.put([Message("t", b"x" * 300)] * 10, partition_id=0)
        assert (refused.value.limit, refused.value.value) == ("max_put_bytes", 1000)
    assert stored(capped) == 100


def test_a_batch_over_the_servers_frame_limit_is_refused_whole(tmp_path):
    limits = ServerLimits(max_frame_bytes=64 * 1024)
    server = make_server(tmp_path, limits)
    try:
        with HQueue("q", f"hqueue://{server.address}") as queue:
            with pytest.raises(LimitExceeded, match="frame"):
                queue.put([Message("t", b"x" * 900)] * 300, partition_id=0)  # 270 KB
            assert len(queue.put([Message("t", b"x" * 900)] * 30, partition_id=0)) == 30
        assert stored(server) == 30
    finally:
        server.stop()


# -- the frame limit ---------------------------------------------------------------------


@pytest.fixture
def small_frames(tmp_path):
    server = make_server(tmp_path, ServerLimits(max_frame_bytes=1 << 20, max_inflight_bytes=1 << 20))
    yield server
    server.stop()


def test_a_frame_over_the_limit_is_refused_unread_and_the_connection_goes_on(small_frames):
    client = raw_client(small_frames.port)
    with pytest.raises(T.TInvalidMessage, match=r"max_frame_bytes=1048576: a call of \d+ bytes"):
        client.putPacked("q", 0, packed.pack([b"t"] * 3000, [b"x" * 600] * 3000))
    assert client.listQueues()[0].name == "q"  # the same connection: the refused body was read past
    client.close()
    assert stored(small_frames) == 0


def test_a_refused_frame_of_a_call_without_TInvalidMessage_gets_TIOError(small_frames):
    """authenticate is the one call that does not declare TInvalidMessage."""
    junk = b"\x0b\x00\x63" + struct.pack("!i", 2 << 20) + b"j" * (2 << 20) + b"\x00"  # a 2 MiB string in field 99
    call = _call(b"authenticate", junk)
    listing = _call(b"listQueues", b"\x00")
    with socket.create_connection(("127.0.0.1", small_frames.port), timeout=10) as s:
        s.sendall(struct.pack("!I", len(call)) + call + struct.pack("!I", len(listing)) + listing)
        reader = s.makefile("rb")
        refused, listed = (_result(reader, name) for name in ("authenticate", "listQueues"))
    assert refused.io.message.startswith("LimitExceeded: max_frame_bytes=1048576")
    assert [info.name for info in listed.success] == ["q"]  # then the listing, on the same connection


def _result(reader, method: str):
    """The next reply frame from ``reader``, decoded as ``method``'s result."""
    from thriftpy2.protocol import TBinaryProtocol
    from thriftpy2.transport import TMemoryBuffer

    (size,) = struct.unpack("!I", reader.read(4))
    protocol = TBinaryProtocol(TMemoryBuffer(reader.read(size)))
    assert protocol.read_message_begin()[0] == method
    result = getattr(T.HQueueService, f"{method}_result")()
    result.read(protocol)
    return result


def test_every_call_but_authenticate_answers_a_refused_argument_with_TInvalidMessage(capped):
    """A generated client in another language gets a typed TInvalidMessage, its kind first,
    for a bad name on any call (these answered TIOError, "the store failed", before)."""
    declared = {
        name[: -len("_result")]
        for name, result in vars(T.HQueueService).items()
        if name.endswith("_result") and any(field[2] is T.TInvalidMessage for field in result.thrift_spec.values())
    }
    calls = {name[: -len("_args")] for name in vars(T.HQueueService) if name.endswith("_args")}
    assert calls - declared == {"authenticate"}
    client = raw_client(capped.port)
    bad = "x" * 300  # (longer than any queue name)
    refusals = {
        "getQueueLocations": lambda: client.getQueueLocations(bad),
        "describeQueue": lambda: client.describeQueue(bad),
        "getQueue": lambda: client.getQueue(bad),
        "truncateQueue": lambda: client.truncateQueue(bad),
        "disableQueue": lambda: client.disableQueue(bad),
        "enableQueue": lambda: client.enableQueue(bad),
        "listGroups": lambda: client.listGroups(bad),
        "listSubscribers": lambda: client.listSubscribers(bad),
        "describeGroup": lambda: client.describeGroup("q", "g" * 10_000),
        "groupLeave": lambda: client.groupLeave("q", "g" * 10_000, "m"),
        "deleteGroup": lambda: client.deleteGroup("q", "g" * 10_000),
    }
    for call, refused in refusals.items():
        with pytest.raises(T.TInvalidMessage) as error:
            refused()
        assert error.value.message.split(": ")[0] in {"InvalidQueueName", "InvalidArgument"}, call
    assert client.listQueues()[0].name == "q"  # the connection goes on
    client.close()
    with HQueueAdmin(f"hqueue://{capped.address}") as admin:  # and the Python client raises the typed error
        with pytest.raises(InvalidArgument):
            admin.engine._call("describeGroup", "q", "g" * 10_000)


def test_a_hostile_60_MiB_blob_is_refused_by_a_default_server(tmp_path):
    """The issue's blob: 6,990,506 messages of 9 bytes. Refused from its frame's head, typed; nothing written."""
    server = make_server(tmp_path)
    try:
        count = 60 * 2**20 // 9
        client = raw_client(server.port, timeout_ms=60_000)
        with pytest.raises(T.TInvalidMessage, match="max_frame_bytes=20971520"):
            client.putPacked("q", 0, packed.pack([b"t"] * count, [b""] * count))
        assert client.listQueues()[0].name == "q"
        client.close()
        assert stored(server) == 0
    finally:
        server.stop()


# -- the in-flight budget ----------------------------------------------------------------


def test_a_big_frame_waits_for_the_budget_then_is_refused_typed(tmp_path):
    limits = ServerLimits(max_frame_bytes=1 << 20, max_inflight_bytes=1 << 20, inflight_wait=0.3)
    server = make_server(tmp_path, limits)
    budget = server._server.budget
    try:
        # Given a call that holds 900 KB of the 1 MiB budget (its body never comes)
        holder = socket.create_connection(("127.0.0.1", server.port))
        head = _call(b"listQueues", b"")
        holder.sendall(struct.pack("!I", 900_000) + head)
        wait_for_budget(budget, 900_000)
        # When another call of 200 KB comes: it waits, gets no room, and is refused unread
        client = raw_client(server.port)
        blob = packed.pack([b"t"] * 200, [b"x" * 990] * 200)
        with pytest.raises(T.TIOError, match="ServerBusy: max_inflight_bytes=1048576"):
            client.putPacked("q", 0, blob)
        wait_for_budget(budget, 900_000)  # it never took bytes it had no room for (its answer's go once sent)
        # Small calls never wait: acks, receives and small puts go on
        assert client.putPacked("q", 0, packed.pack([b"t"], [b"small"])).count == 1
        # Once the holder goes, the big call is taken
        holder.close()
        wait_for_budget(budget, 0)
        assert client.putPacked("q", 0, blob).count == 200
        client.close()
        assert stored(server) == 201
    finally:
        server.stop()


def test_the_client_retries_a_busy_server_until_there_is_room(tmp_path):
    limits = ServerLimits(max_frame_bytes=1 << 20, max_inflight_bytes=1 << 20, inflight_wait=0.2)
    server = make_server(tmp_path, limits)
    try:
        holder = socket.create_connection(("127.0.0.1", server.port))
        holder.sendall(struct.pack("!I", 900_000) + _call(b"listQueues", b""))
        wait_for_budget(server._server.budget, 900_000)
        threading.Timer(1.0, holder.close).start()
        with HQueue("q", f"hqueue://{server.address}") as queue:
            assert len(queue.put([Message("t", b"x" * 990)] * 200, partition_id=0)) == 200
        with HQueue("q", f"hqueue://{server.address}") as queue:
            queue.engine.owner_timeout = 0.5
            holder = socket.create_connection(("127.0.0.1", server.port))
            holder.sendall(struct.pack("!I", 900_000) + _call(b"listQueues", b""))
            wait_for_budget(server._server.budget, 900_000)
            with pytest.raises(ServerBusy, match="max-inflight-bytes"):
                queue.put([Message("t", b"x" * 990)] * 200, partition_id=0)
            holder.close()
        assert stored(server) == 200
    finally:
        server.stop()


def wait_for_budget(budget: InflightBudget, used: int) -> None:
    from ..processes import wait_for

    wait_for(lambda: budget.used == used, 10, f"{used} bytes of the budget in use")


def test_the_budget_serves_waiters_in_turn_and_bounds_the_wait():
    budget = InflightBudget(100)
    assert budget.reserve(80, wait=1)
    assert not budget.reserve(30, wait=0.05)  # no room in time: nothing taken
    assert budget.used == 80
    assert budget.reserve(5, wait=None)  # a frame already in memory: counted, never waits
    got = []
    big = threading.Thread(target=lambda: got.append(("big", budget.reserve(90, wait=10))))
    big.start()
    from ..processes import wait_for

    wait_for(lambda: budget._line, 5, "the big frame to wait")
    small = threading.Thread(target=lambda: got.append(("small", budget.reserve(10, wait=10))))
    small.start()  # it would fit now, but it is behind the big one
    wait_for(lambda: len(budget._line) == 2, 5, "the small frame to queue")
    budget.release(85)
    big.join(5)
    small.join(5)
    assert got == [("big", True), ("small", True)] and budget.used == 100


def test_limits_that_cannot_hold_a_frame_are_refused():
    with pytest.raises(ValueError, match="'max_inflight_bytes'"):
        ServerLimits(max_frame_bytes=2 << 20, max_inflight_bytes=1 << 20)
    from hqueue.cli.main import main

    result = CliRunner().invoke(main, ["server", "--max-frame-bytes", "100000000", "--storage", "memory://"])
    assert result.exit_code == 2 and "--max-inflight-bytes (67108864) must be at least" in result.output
    with pytest.raises(ValueError, match="'inflight_share' must be more than 0"):
        ServerLimits(inflight_share=0)
    result = CliRunner().invoke(main, ["server", "--inflight-share", "1.5", "--storage", "memory://"])
    assert result.exit_code == 2 and "--inflight-share" in result.output


# -- pieces ------------------------------------------------------------------------------


def test_a_big_frame_is_read_into_one_buffer_and_the_next_frame_follows():
    ours, theirs = socket.socketpair()
    reader = FrameReader(ours, 1 << 20, idle_timeout=5, body_timeout=5)
    big = _call(b"putPacked", b"x" * 300_000)
    after = _call(b"listQueues", b"\x00")
    sender = threading.Thread(
        target=theirs.sendall, args=(b"".join(struct.pack("!I", len(f)) + f for f in (big, after, big, after)),)
    )
    sender.start()
    assert reader.next_size() == len(big) and not reader.complete
    assert reader.call_head() == ("putPacked", 1)
    assert bytes(reader.body()) == big
    assert reader.read() == after
    assert reader.next_size() == len(big) and reader.call_head()[0] == "putPacked"
    reader.skip()  # a refused call: its body read past, never held
    assert reader.read() == after
    sender.join()
    ours.close()
    theirs.close()


def test_limit_errors_cross_the_wire_with_their_limit():
    for error in (LimitExceeded("max_put_bytes", 1000, "too big"), ServerBusy("max_inflight_bytes", 5, "busy: try")):
        back = wire.from_thrift_error(wire.to_thrift_error(error))
        assert (type(back), back.limit, back.value, str(back)) == (type(error), error.limit, error.value, str(error))
    assert isinstance(LimitExceeded("max_put_bytes", 1, "x"), InvalidArgument)


def test_a_big_frame_trickled_in_times_out_on_the_body_timeout_all_told():
    """A peer that sends a byte now and then would hold its share of the budget for ever."""
    ours, theirs = socket.socketpair()
    reader = FrameReader(ours, 1 << 20, idle_timeout=5, body_timeout=0.5)
    stop = threading.Event()

    def trickle() -> None:
        theirs.sendall(struct.pack("!I", 500_000) + _call(b"listQueues", b""))
        for _ in range(30):  # 3 s at most, then the peer goes
            if stop.wait(0.1):
                break
            theirs.sendall(b"x")
        theirs.close()

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        assert reader.next_size() == 500_000
        with pytest.raises(TimeoutError):
            reader.body()
    finally:
        stop.set()
        sender.join()
        ours.close()


def test_a_huge_name_is_refused_without_being_repeated_back(capped):
    """An error that echoed a 19 MiB queue name made a 40 MiB reply (bench/hostile.py --packed)."""
    client = raw_client(capped.port)
    with pytest.raises(T.TInvalidMessage, match="at most 200 characters; this one has 100000") as refused:
        client.getQueue("q" * 100_000)
    assert len(refused.value.message) < 200
    with pytest.raises(T.TInvalidMessage) as refused:  # created through its info: the name is checked later
        client.createQueue(T.TQueueInfo(name="-" * 100_000, partitions=1))
    assert len(refused.value.message) < 5000 and refused.value.message.endswith("characters)")
    client.close()


def test_a_name_too_long_for_any_queue_is_a_typed_error_through_the_client(capped):
    # (was StorageError, "an internal storage error", for every call but a drop)
    name, url = "x" * 204, f"hqueue://127.0.0.1:{capped.port}"  # as a 200-character DLQ's own .dlq
    with HQueueAdmin(url) as admin:
        assert admin.queue_exists(name) is False  # as on an embedded store
        for call in (admin.describe_queue, admin.disable_queue, admin.list_groups):
            with pytest.raises(InvalidQueueName, match="at most 200 characters"):
                call(name)
    with pytest.raises(InvalidQueueName), HQueue(name, url) as queue:
        queue.put(Message("t", b"x"))


# -- receipts --------------------------------------------------------------------------


def test_one_group_call_carries_at_most_max_receipts(capped):
    client = raw_client(capped.port)
    client.openGroup("q", "g", None, 0, 3)
    made_up = b"".join(b"\0\0" + struct.pack(">QH", 4_000_000_000_000, i) for i in range(wire.MAX_RECEIPTS + 1))
    for call, args in (
        ("groupAck", ("q", "g", made_up)),
        ("groupNack", ("q", "g", "m", made_up, -1)),
        ("groupExtend", ("q", "g", "m", made_up, 1000)),
        ("groupDeadLetter", ("q", "g", "m", made_up)),
    ):
        with pytest.raises(T.TInvalidMessage, match=f"max_receipts={wire.MAX_RECEIPTS}"):
            getattr(client, call)(*args)
    assert client.groupAck("q", "g", made_up[: 12 * wire.MAX_RECEIPTS]) == 0  # at the cap: taken (and ignored)
    client.close()


def test_a_budget_too_small_for_a_scan_answer_is_warned_of(tmp_path, caplog):
    """Below 64 MiB a client's share is less than one 16 MiB answer, and below about 21 MiB one
    unread answer can hold the whole budget (an audit): the server says so at start."""
    with caplog.at_level("WARNING", logger="hqueue.rpc.threaded"):
        server = make_server(tmp_path, ServerLimits(max_inflight_bytes=8 << 20, max_frame_bytes=1 << 20))
        server.stop()
    assert (
        "less than one scan answer (16777216): one client that stops reading can hold more than its share and "
        "the whole budget" in caplog.text
    )


@pytest.mark.parametrize("io", ["loop", "threads"])
def test_a_call_over_the_container_limit_is_a_typed_error_and_the_connection_goes_on(tmp_path, io):
    """A scan naming 100,001 topics through a server: the server closed the connection,
    and the client tried again until its deadline (30 s), then said the server had
    closed it (an attacker's pass). A whole frame over the element limit is refused with
    LimitExceeded, at once, and the connection serves the next call."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, io=io).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            queue.put(Message("t1", b"x"), 0)
            with pytest.raises(LimitExceeded, match="max_items|at most 100,000") as raised:
                list(queue.scan(topics=[b"t%d" % i for i in range(100_001)], partition_id=0))
            assert raised.value.limit == "max_items"
            assert [m.value for m in queue.scan(topics=["t1"])] == [b"x"]
    finally:
        server.stop()
