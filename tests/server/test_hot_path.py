"""What a call costs the server (issue 21): counted, never timed (timings are in bench/server_cpu.py).

* a put updates its metrics with no label look-up (the queue's series are bound once);
* a frame is read and its reply written on a plain socket with the kernel's
  timeouts, so no ``poll`` goes before each ``recv`` and ``send``, and a reply
  is written whole or not at all within ``body_timeout``;
* a packed batch of one topic unpacks to one topic object, repeated;
* a consumer group with nothing in flight moves ``done`` with no look-up per ID.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading

import prometheus_client.metrics
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hqueue.scanner
import hqueue.server.handler
import hqueue.server.scanners
from hqueue import HQueue, HQueueAdmin, Message
from hqueue.groups.state import HEAP_SLACK, OpenIds, PartitionState
from hqueue.message import MessageID
from hqueue.metrics import ServerMetrics
from hqueue.rpc import packed
from hqueue.rpc.frames import FrameReader
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from .test_hardening import raw_client


def test_a_put_looks_up_no_metric_label(tmp_path, monkeypatch):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        lookups = collections.Counter()
        labels = prometheus_client.metrics.MetricWrapperBase.labels

        def counted(self, *args, **kwargs):
            lookups[self._name] += 1
            return labels(self, *args, **kwargs)

        monkeypatch.setattr(prometheus_client.metrics.MetricWrapperBase, "labels", counted)
        with HQueue("q", url) as queue:
            for _ in range(50):
                queue.put(Message("t", b"x"), partition_id=0)
            queue.put([Message("t", b"y")] * 10, partition_id=0)
        assert not lookups
        series = server.metrics.puts("q")
        assert series is server.metrics.puts("q")  # bound once
        assert (series.calls, series.messages) == (51, 60)
    finally:
        server.stop()


def test_put_series_render_as_a_counter_and_a_histogram():
    metrics = ServerMetrics()
    metrics.puts('a "q"').observe(0.0002, 7)
    metrics.puts('a "q"').observe(2.0, 1)
    metrics.puts('a "q"').observe(50.0, 1)
    text = metrics.render().decode()
    assert 'hqueue_put_messages_total{queue="a \\"q\\""} 9.0\n' in text
    assert 'hqueue_put_seconds_bucket{le="0.00025",queue="a \\"q\\""} 1.0\n' in text
    assert 'hqueue_put_seconds_bucket{le="5.0",queue="a \\"q\\""} 2.0\n' in text
    assert 'hqueue_put_seconds_bucket{le="+Inf",queue="a \\"q\\""} 3.0\n' in text
    assert 'hqueue_put_seconds_count{queue="a \\"q\\""} 3.0\n' in text
    assert "# TYPE hqueue_put_seconds histogram\n" in text


def _timeval(sock: socket.socket, option: int) -> float:
    seconds, micros = struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("@ll")))
    return seconds + micros / 1e6


def test_a_plain_socket_uses_the_kernels_timeouts():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(ours, 1024, idle_timeout=7, body_timeout=3)
        assert ours.gettimeout() is None  # blocking: Python polls before no recv or send
        assert (_timeval(ours, socket.SO_RCVTIMEO), _timeval(ours, socket.SO_SNDTIMEO)) == (7, 3)
        theirs.sendall(struct.pack(">I", 5) + b"hello")
        assert reader.read() == b"hello"
        reader.send(b"reply")
        assert theirs.recv(100) == struct.pack(">I", 5) + b"reply"


def test_idle_past_the_kernel_timeout_is_a_timeout():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(ours, 1024, idle_timeout=0.1, body_timeout=5)
        with pytest.raises(TimeoutError):
            reader.read()


def test_a_reply_bigger_than_the_socket_buffers_arrives_whole():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(ours, 1024, idle_timeout=5, body_timeout=10)
        reply = bytes(range(256)) * 40_000  # 10 MB: many partial sends
        got = bytearray()

        def read_all():
            while len(got) < 4 + len(reply):
                got.extend(theirs.recv(1 << 20))

        reading = threading.Thread(target=read_all)
        reading.start()
        reader.send(reply)
        reading.join(30)
        assert bytes(got) == struct.pack(">I", len(reply)) + reply


def test_a_reply_the_peer_does_not_take_ends_on_the_body_timeout():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(ours, 1024, idle_timeout=5, body_timeout=0.2)
        with pytest.raises(TimeoutError, match="reply"):
            reader.send(b"x" * 20_000_000)  # nobody reads


def test_one_topic_unpacks_to_one_object():
    topics, values = packed.unpack(packed.pack([b"crawler"] * 100, [b"v%d" % i for i in range(100)]))
    assert topics == [b"crawler"] * 100 and len({id(t) for t in topics}) == 1
    assert values == [b"v%d" % i for i in range(100)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"", b"a", b"bb", b"\x00" * 12]), st.binary(max_size=40)), max_size=60))
def test_unpack_is_the_inverse_of_pack(pairs):
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    assert packed.unpack(packed.pack(keys, values)) == (keys, values)


class CountingDict(dict):
    probes = 0

    def __contains__(self, key):
        CountingDict.probes += 1
        return super().__contains__(key)


def test_done_moves_past_finished_ids_with_no_look_up_each():
    ids = [MessageID(1000, i).to_bytes() for i in range(1000)]
    state = PartitionState(done=ids[0], scan=MessageID(1001).to_bytes(), leases=CountingDict(), ready=CountingDict())
    state.open.extend(ids)
    CountingDict.probes = 0
    assert state.lowest_open() == state.scan
    assert not state.open and CountingDict.probes == 0
    state.open.extend(ids)
    state.leases[ids[500]] = ("m", 1.0)  # one still held: the finished ones before it go
    assert state.lowest_open() == ids[500]
    assert len(state.open) == 500


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.sets(st.integers(0, 2999), max_size=40)), max_size=30))
def test_the_first_open_id_is_the_first_one_still_held(rounds):
    """OpenIds against the deque it replaced: each round hands out more IDs, some of them
    still held (leased, waiting, held back); the first held one is where ``done`` may go."""
    ids = [MessageID(1000, i).to_bytes() for i in range(3000)]
    ours, theirs, handed = OpenIds(), collections.deque(), 0
    for more, held_numbers in rounds:
        ours.extend(ids[handed : handed + more])
        theirs.extend(ids[handed : handed + more])
        handed = min(3000, handed + more)
        held = {ids[n] for n in held_numbers}
        leases, ready, back = [{i for i in held if int.from_bytes(i[-2:], "big") % 3 == r} for r in range(3)]
        holders = [c for c in (leases, ready, back) if c] or [set()]
        while theirs and not any(theirs[0] in h for h in holders):
            theirs.popleft()
        assert ours.first_open(holders) == (theirs[0] if theirs else None)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_open_ids_give_their_front_back():
    ids = [MessageID(1000, i).to_bytes() for i in range(3 * HEAP_SLACK)]
    open_ids = OpenIds(ids)
    assert open_ids.first_open([{ids[-1]}]) == ids[-1]
    assert open_ids.ids == [ids[-1]] and open_ids.head == 0  # (not 3,071 finished ones kept)
    open_ids.extend(ids[:3])
    open_ids.drop({ids[0]})
    assert list(open_ids) == [ids[-1], ids[1], ids[2]]
    open_ids.keep([{ids[2]}, {ids[1]}])
    assert list(open_ids) == [ids[1], ids[2]]
    assert open_ids.first_open([]) is None and len(open_ids) == 0  # nothing holds any: all finished


def test_a_packed_scan_reply_makes_no_message_object(tmp_path, monkeypatch):
    built = collections.Counter()
    for module in (hqueue.scanner, hqueue.server.handler):
        original = module.messages_from_columns

        def counted(keys, values, original=original):
            built["messages"] += len(keys)
            return original(keys, values)

        monkeypatch.setattr(module, "messages_from_columns", counted)
    monkeypatch.setattr(hqueue.server.scanners, "SCAN_REPLY_BYTES", 1000)  # 100-byte cells: 10 a reply
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        sent = [Message("topic", b"%088d" % i) for i in range(2500)]  # 12 + 5 + 88 bytes a cell
        with HQueue("q", url) as queue:
            queue.put(sent, partition_id=0)
            client = raw_client(server.port)
            scanner = client.messageScannerOpen("q", 0, T.TMessageScan())
            first = packed.unpack(client.messageScannerGetPacked(scanner, 1000))
            assert len(first[0]) == 10  # the cell that reaches the reply's size is the last
            assert not built
            two = client.messageScannerGetList(scanner, 2)  # the struct calls go on from the same place
            assert [m.value for m in two] == [m.value for m in sent[10:12]]
            rest = []
            while True:
                keys, values = packed.unpack(client.messageScannerGetPacked(scanner, 7))
                if not keys:
                    break
                assert len(keys) <= 7
                rest += values
            assert rest == [m.value for m in sent[12:]]
            assert built["messages"] == 2  # only for the struct call
            client.close()
    finally:
        server.stop()
