"""The push channel as an attacker meets it (issue 18.1, SPEC C7 "The push channel").

A subscriber listens on a port anyone may reach. Only pushes a server
proves with the subscriber's key get through; forged, replayed, foreign or
malformed ones are refused with TPushRefused and never reach a listener;
a TLS server pushes over TLS pinned to the subscriber's certificate, so a
relay in between reads no value.
"""

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from hqueue import HQueue, HQueueAdmin, Message, MessageID
from hqueue.errors import InvalidArgument
from hqueue.rpc import packed, threaded
from hqueue.rpc.connections import ServerLimits
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer
from hqueue.subscriptions.listener import MessageListener, Subscriber, Subscription
from hqueue.subscriptions.push import mac, mac_packed

from ..helpers.relay import Relay
from ..processes import server_certificate, wait_for


class Collect(MessageListener):
    def __init__(self) -> None:
        self.messages: list = []
        self._lock = threading.Lock()

    def on_messages(self, messages) -> None:
        with self._lock:
            self.messages.extend(messages)


def subscriber_client(address: str, timeout_ms: int = 10_000, ssl_context=None):
    host, _, port = address.rpartition(":")
    return make_client(
        T.HQueueSubscriberService, host, int(port), proto_factory=TBinaryProtocolFactory(),
        trans_factory=TFramedTransportFactory(), timeout=timeout_ms, ssl_context=ssl_context,
    )  # fmt: skip


def tmessage(pid: int, timestamp: int, value: bytes = b"forged", sequence: int = 0):
    return T.TMessage(
        id=T.TMessageID(timestamp=timestamp, sequenceID=sequence), partitionID=pid, topic=b"t", value=value
    )


@pytest.fixture
def running(tmp_path):
    """A server, a 2-partition queue and a running subscriber with a real message delivered."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 2)
    queue = HQueue("q", url)
    listener = Collect()
    subscriber = queue.create_subscriber(Subscription("s"), [listener]).start()
    queue.put(Message("t", b"real"), partition_id=0)
    wait_for(lambda: len(listener.messages) == 1, 30, "the real message")
    yield server, queue, subscriber, listener
    subscriber.stop()
    queue.close()
    server.stop()


def proof(subscriber, challenge, sequence, messages, *, pid=0, epoch=0, queue="q", name="s", key=None, sign=mac):
    """The proof a server with the subscriber's key (or ``key``) would send; ``sign``:
    :func:`mac` over TMessages, :func:`mac_packed` over a packed blob."""
    key = key if key is not None else subscriber.credentials.key
    return T.TPushProof(
        queue=queue, subscriber=name, partitionID=pid, epoch=epoch, sequence=sequence,
        mac=sign(key, challenge, sequence, epoch, queue, name, pid, messages),
    )  # fmt: skip


def test_pushes_without_a_proof_or_challenge_are_refused_and_never_reach_a_listener(running):
    _, queue, subscriber, listener = running
    client = subscriber_client(subscriber.address)
    with pytest.raises(T.TPushRefused, match="challenge"):
        client.consumeMessages([tmessage(999, 1)])  # no challenge on this connection, no proof
    client.pushChallenge()
    with pytest.raises(T.TPushRefused, match="proof"):
        client.consumeMessages([tmessage(999, 1)])
    with pytest.raises(T.TPushRefused, match="NotAuthorized: a call of .* bytes before the connection proved"):
        client.consumeMessages([tmessage(0, 10**12 + i) for i in range(100_000)], T.TPushProof(mac=b"x" * 32))
    with pytest.raises(T.TPushRefused, match="proof"):  # refused unread: the connection goes on
        client.consumeMessages([tmessage(999, 1)])
    client.close()
    assert [m.value for m in listener.messages] == [b"real"]
    assert subscriber.guard.refused == 3  # (the big call never reached the guard)
    queue.put(Message("t", b"after"), partition_id=1)  # real pushes still come
    wait_for(lambda: len(listener.messages) == 2, 30, "the next real message")


def test_a_wrong_key_a_replay_and_a_push_of_another_subscription_are_refused(running):
    _, _, subscriber, listener = running
    client = subscriber_client(subscriber.address)
    challenge = client.pushChallenge()
    batch = [tmessage(0, 2**40, b"one")]
    with pytest.raises(T.TPushRefused, match="key"):
        client.consumeMessages(batch, proof(subscriber, challenge, 1, batch, key=b"k" * 32))
    # With the key (as a server has it): accepted once, refused when replayed.
    assert client.consumeMessages(batch, proof(subscriber, challenge, 1, batch)) == 0
    with pytest.raises(T.TPushRefused, match="replay"):
        client.consumeMessages(batch, proof(subscriber, challenge, 1, batch))
    # Proven but not of this subscription: other partition, queue, subscriber; IDs out of order; going back.
    cases = [
        ({"pid": 999}, [tmessage(999, 2**40 + 1)], "partition 999"),
        ({"queue": "other"}, [tmessage(0, 2**40 + 1)], "not this subscriber"),
        ({"name": "t"}, [tmessage(0, 2**40 + 1)], "not this subscriber"),
        ({}, [tmessage(1, 2**40 + 1)], "another partition"),
        ({}, [tmessage(0, 2**40 + 3), tmessage(0, 2**40 + 2)], "increase"),
        ({}, [tmessage(0, 2**39)], "goes back"),
    ]
    for sequence, (changes, messages, error) in enumerate(cases, start=2):
        with pytest.raises(T.TPushRefused, match=error):
            client.consumeMessages(messages, proof(subscriber, challenge, sequence, messages, **changes))
    # A push recorded on one connection fails on another (its challenge differs).
    other = subscriber_client(subscriber.address)
    other.pushChallenge()
    batch = [tmessage(0, 2**40 + 5)]
    with pytest.raises(T.TPushRefused, match="key"):
        other.consumeMessages(batch, proof(subscriber, challenge, 50, batch))
    client.close()
    other.close()
    assert [m.value for m in listener.messages] == [b"real", b"one"]


def test_a_stolen_key_of_a_previous_run_is_worthless(running):
    _, _, subscriber, _ = running
    old = subscriber.credentials
    subscriber.stop()
    subscriber.start()
    assert subscriber.credentials.key != old.key


def test_a_tls_server_pushes_over_tls_pinned_to_the_subscriber(tmp_path):
    cert, context = server_certificate(tmp_path)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, ssl_context=context).start()
    url = f"hqueue://{server.address}?tls=1&ca={cert}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueue("q", url) as queue:
            # A subscriber listening in clear is refused by a TLS server.
            with pytest.raises(InvalidArgument, match="TLS"):
                queue.create_subscriber(Subscription("clear"), [Collect()], tls=False, takeover_timeout=0).start()
            # Over a tls=1 URL the subscriber listens with TLS; a relay between reads no value.
            port = socket.create_server(("127.0.0.1", 0))
            subscriber_port = port.getsockname()[1]
            port.close()
            relay = Relay(("127.0.0.1", subscriber_port))
            listener = Collect()
            subscription = Subscription("s")
            subscriber = queue.create_subscriber(
                subscription, [listener], port=subscriber_port, advertise=f"127.0.0.1:{relay.port}"
            )
            with subscriber:
                assert subscriber.credentials.certificate is not None
                queue.put(Message("t", b"top-secret-value"))
                wait_for(lambda: len(listener.messages) == 1, 30, "the push through the relay")
                assert b"top-secret-value" not in relay.seen and len(relay.seen) > 0
                # Anyone talking plain Thrift to the subscriber gets nothing.
                with pytest.raises(Exception):  # noqa: B017 - the TLS listener drops a plain client
                    subscriber_client(subscriber.address, timeout_ms=2000).pushChallenge()
            relay.close()
    finally:
        server.stop()


def test_many_subscribers_share_the_push_pool_and_a_server_pushes_to_at_most_its_limit(tmp_path):
    import threading

    before = {t.ident for t in threading.enumerate() if t.name.startswith("hqueue-push")}
    server = HQueueServer(f"local://{tmp_path}/data", port=0, push_threads=2, max_subscribers=5).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 4)
        with HQueue("q", url) as queue:
            listeners = [Collect() for _ in range(8)]
            subscribers = [
                queue.create_subscriber(Subscription(f"s{i}"), [listener]).start()
                for i, listener in enumerate(listeners)
            ]
            queue.put([Message("t", b"%d" % i, partition_id=i % 4) for i in range(40)])
            wait_for(lambda: sum(len(listener.messages) == 40 for listener in listeners) == 5, 30, "5 subscribers")
            push = [t for t in threading.enumerate() if t.name.startswith("hqueue-push") and t.ident not in before]
            assert len(push) == 2  # 8 subscribers x 4 partitions: the pool's 2 threads
            assert sum(len(listener.messages) == 0 for listener in listeners) == 3  # over the limit: they wait
            for subscriber in subscribers[:5]:
                subscriber.stop()
            wait_for(lambda: all(len(listener.messages) == 40 for listener in listeners), 30, "the other 3")
            for subscriber in subscribers[5:]:
                subscriber.stop()
    finally:
        server.stop()


def test_one_queue_s_subscribers_cannot_take_every_place_from_another_queue_s(tmp_path):
    # Given a server that pushes to at most 3 subscribers, and 5 attached to queue "busy"
    server = HQueueServer(f"local://{tmp_path}/data", port=0, max_subscribers=3).start()
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("busy", 1)
            admin.create_queue("payments", 1)
        with HQueue("busy", url) as busy, HQueue("payments", url) as payments:
            many = [busy.create_subscriber(Subscription(f"s{i}"), [Collect()]).start() for i in range(5)]
            # When a subscriber of another queue attaches
            listener = Collect()
            with payments.create_subscriber(Subscription("billing"), [listener]):
                payments.put(Message("t", b"paid"), partition_id=0)
                # Then it gets its place (the places are dealt to the queues in turn)
                wait_for(lambda: len(listener.messages) == 1, 30, "a push to the other queue's subscriber")
            for subscriber in many:
                subscriber.stop()
    finally:
        server.stop()


def test_places_are_dealt_to_queues_in_turn_those_pushed_to_first():
    from hqueue.subscriptions.manager import fair_share
    from hqueue.subscriptions.registry import Registration

    attached = [Registration("a", f"s{i}", None, None) for i in range(5)] + [Registration("b", "x", None, None)]
    assert [(r.queue, r.name) for r in fair_share(attached, 3, {("a", "s4")})] == [("a", "s4"), ("b", "x"), ("a", "s0")]
    assert len(fair_share(attached, 10, set())) == 6


@contextlib.contextmanager
def hostile_subscribers(tmp_path, answer: Callable[[socket.socket], None], heartbeats: bool = False):
    """A server with 4 push threads, a queue "q", and 4 subscribers of queue "hostile"
    (each with a message to take in each of its 4 partitions), each connection the server
    makes to them given to ``answer`` in a thread of its own; ``heartbeats``: their
    registrations kept alive. Yields the server, its URL, the raw client that registered
    them and their names (a name removed from it is heartbeaten no more)."""
    from hqueue.rpc.wire import T as W

    from .test_hardening import raw_client

    server = HQueueServer(f"local://{tmp_path}/data", port=0, push_threads=4).start()
    url = f"hqueue://{server.address}"
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    stop = threading.Event()

    def accept(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                threading.Thread(target=answer, args=(sock.accept()[0],), daemon=True).start()

    for sock in listeners:
        threading.Thread(target=accept, args=(sock,), daemon=True).start()
    client = raw_client(server.port)
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("hostile", 4)
            admin.create_queue("q", 1)
        keys = {}
        for i, sock in enumerate(listeners):
            name, address, key = f"h{i}", f"127.0.0.1:{sock.getsockname()[1]}", W.TPushKey(key=os.urandom(32))
            client.addSubscriber("hostile", name, None, None, None)
            client.subscriberHeartbeat("hostile", name, address, None, key)
            keys[name] = (address, key)

        def beat() -> None:  # (as a subscriber's own heartbeats do)
            with contextlib.closing(raw_client(server.port)) as beating:
                while not stop.is_set():
                    for name, (address, key) in list(keys.items()):
                        with contextlib.suppress(Exception):
                            beating.subscriberHeartbeat("hostile", name, address, None, key)
                    time.sleep(0.5)

        if heartbeats:
            threading.Thread(target=beat, daemon=True).start()
        with HQueue("hostile", url) as hostile:
            hostile.put([Message("t", b"x", partition_id=p) for p in range(4)])
        yield server, url, client, keys
    finally:
        stop.set()
        client.close()
        for sock in listeners:
            sock.close()
        server.stop()


def test_subscribers_that_never_answer_leave_the_others_most_of_the_push_threads(tmp_path):
    """Listeners that accept a server's connection and never answer its challenge held a
    push thread each for the whole send timeout (a minute): 8 of them, registered by one
    token, held all 8 and another tenant's pushes waited 29 s at the median, 57 s at most
    (an attacker pass). A handshake has 5 s now, and slow subscribers share a quarter of
    the threads."""
    silent: list[socket.socket] = []
    try:
        # Given as many silent subscribers as push threads, each with messages to take
        with hostile_subscribers(tmp_path, silent.append) as (_, url, _, _):
            wait_for(lambda: len(silent) >= 4, 30, "the silent subscribers' connections")
            # When another subscriber attaches, and messages come for it
            listener = Collect()
            with HQueue("q", url) as queue, queue.create_subscriber(Subscription("s"), [listener]):
                queue.put([Message("t", b"%d" % i) for i in range(3)], partition_id=0)
                # Then it gets them while the silent ones go on taking no answer (before: a minute)
                wait_for(lambda: len(listener.messages) == 3, 20, "pushes beside silent subscribers")
    finally:
        for sock in silent:
            sock.close()


@pytest.mark.parametrize("how", ["drip", "flood"])
def test_a_subscriber_that_drips_or_floods_its_answer_is_cut_off_and_holds_no_push_thread(tmp_path, how):
    """The server's push client timed each read alone and took any frame its head declared
    (an attacker's pass): a subscriber answering the challenge one byte every 3 s held a
    push thread for as long as it liked (8 of them: no other subscriber got a push in 40 s),
    and one declaring 2 GB and streaming zeros grew the server by what it sent (56 to 859
    MB). The handshake has 5 s all told now (each push its send timeout), and an answer over
    64 KiB ends the connection at its head. Then, deleted, their 16 workers stopped one
    by one held every other subscriber's start for 35-50 s: each stop waited for the next
    worker's handshake."""
    cut: list[float] = []  # how long each hostile answer went on before the server closed it
    flooded: list[int] = []  # the bytes of declared answers the server took
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        started = time.monotonic()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)  # the challenge's call
            if how == "drip":
                conn.sendall(struct.pack(">i", 1000))
                while not stop.is_set() and time.monotonic() - started < 60:
                    conn.sendall(b"\0")
                    time.sleep(1)
                    conn.settimeout(0.01)
                    with contextlib.suppress(TimeoutError):
                        if conn.recv(1) == b"":
                            break  # closed by the server
                    conn.settimeout(None)
            else:
                conn.sendall(struct.pack(">i", 2**31 - 1))
                zeros = bytes(1 << 20)
                conn.settimeout(5)
                while not stop.is_set() and time.monotonic() - started < 60:
                    conn.sendall(zeros)  # (a full socket waits 5 s, then TimeoutError: the server reads no more)
                    flooded.append(len(zeros))
        cut.append(time.monotonic() - started)

    try:
        # Given as many hostile subscribers as push threads, each with messages to take
        with hostile_subscribers(tmp_path, answer, heartbeats=True) as (_, url, client, names):
            # Then the server ends each hostile answer well before it would end (60 s)
            wait_for(lambda: len(cut) >= 8, 40, "the hostile answers cut off")
            assert max(cut) < 15, cut
            assert sum(flooded) < 64 << 20  # what the sockets' buffers hold, not the 2 GB declared
            # And another subscriber gets its pushes meanwhile
            listener = Collect()
            with HQueue("q", url) as queue, queue.create_subscriber(Subscription("s"), [listener]):
                queue.put([Message("t", b"%d" % i) for i in range(3)], partition_id=0)
                wait_for(lambda: len(listener.messages) == 3, 20, "pushes beside hostile subscribers")
            # And once the hostile ones are deleted, a new subscriber starts at once
            for name in list(names):
                names.pop(name)
                client.deleteSubscriber(name, "hostile")
            listener = Collect()
            with HQueue("q", url) as queue, queue.create_subscriber(Subscription("s2"), [listener]):
                queue.put(Message("t", b"3"), partition_id=0)
                wait_for(lambda: b"3" in [m.value for m in listener.messages], 20, "a new subscriber's pushes")
    finally:
        stop.set()


def test_idle_connections_cannot_keep_a_server_from_pushing(tmp_path, monkeypatch):
    """The listener's connections all taken by peers that never prove anything: a
    server's connection closes the oldest of them, and once its push is proven it
    keeps its place (an attacker's pass held 1,024 idle connections: pushes stopped)."""
    monkeypatch.setattr(Subscriber, "limits", ServerLimits(max_connections=3))
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", 1)
    listener = Collect()
    with HQueue("q", url) as queue, queue.create_subscriber(Subscription("s"), [listener]) as subscriber:
        host, _, port = subscriber.address.rpartition(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(3)]  # they never say a word
        wait_for(lambda: subscriber._server.connections >= 3, 10, "the idle connections accepted")
        queue.put(Message("t", b"through"), partition_id=0)
        wait_for(lambda: len(listener.messages) == 1, 30, "a push despite the idle connections")
        more = [socket.create_connection((host, int(port))) for _ in range(3)]  # the proven one stays
        queue.put(Message("t", b"again"), partition_id=0)
        wait_for(lambda: len(listener.messages) == 2, 30, "a second push on the proven connection")
        for s in idle + more:
            s.close()
    server.stop()
    assert [m.value for m in listener.messages] == [b"through", b"again"]


# -- consumePacked: the same push as one blob (the server's first choice) ------------------------


def cells(pid: int, *ids: tuple[int, int], value: bytes = b"v") -> tuple[list[bytes], list[bytes]]:
    """Cell keys (12-byte rowkey, then the topic) and values, as a packed push carries them."""
    keys = [struct.pack(">HQH", pid, timestamp, sequence) + b"t" for timestamp, sequence in ids]
    return keys, [value] * len(keys)


def packed_proof(subscriber, challenge, sequence, blob, **changes):
    return proof(subscriber, challenge, sequence, blob, sign=mac_packed, **changes)


def test_a_packed_push_is_proven_over_its_blob_and_refused_as_the_other_kind_is(running):
    _, _, subscriber, listener = running
    client = subscriber_client(subscriber.address)
    blob = packed.pack(*cells(0, (2**40, 0), value=b"one"))
    with pytest.raises(T.TPushRefused, match="challenge"):
        client.consumePacked(blob, T.TPushProof(mac=b"x" * 32, sequence=1))
    challenge = client.pushChallenge()
    with pytest.raises(T.TPushRefused, match="proof"):
        client.consumePacked(blob)
    with pytest.raises(T.TPushRefused, match="key"):
        client.consumePacked(blob, packed_proof(subscriber, challenge, 1, blob, key=b"k" * 32))
    # The proof of the same messages as TMessages is no proof of the blob (each kind has its domain).
    as_tmessages = [tmessage(0, 2**40, b"one")]
    with pytest.raises(T.TPushRefused, match="key"):
        client.consumePacked(blob, proof(subscriber, challenge, 1, as_tmessages))
    assert client.consumePacked(blob, packed_proof(subscriber, challenge, 1, blob)) == 0
    with pytest.raises(T.TPushRefused, match="replay"):
        client.consumePacked(blob, packed_proof(subscriber, challenge, 1, blob))
    # Proven, but malformed or not of this subscription: never passed on.
    bad = [
        ({}, b"\x05\x00\x00\x00", "malformed"),
        ({}, packed.pack([b"short"], [b"v"]), "rowkey"),
        ({"pid": 999}, packed.pack(*cells(999, (2**40 + 1, 0))), "partition 999"),
        ({}, packed.pack(*cells(1, (2**40 + 1, 0))), "another partition"),
        ({}, packed.pack(*cells(0, (2**40 + 3, 0), (2**40 + 2, 0))), "increase"),
        ({}, packed.pack(*cells(0, (2**40 + 3, 1), (2**40 + 3, 1))), "increase"),
        ({}, packed.pack(*cells(0, (2**39, 0))), "goes back"),
        ({"queue": "other"}, packed.pack(*cells(0, (2**40 + 1, 0))), "not this subscriber"),
    ]
    for sequence, (changes, garbage, error) in enumerate(bad, start=2):
        with pytest.raises(T.TPushRefused, match=error):
            client.consumePacked(garbage, packed_proof(subscriber, challenge, sequence, garbage, **changes))
    # A proven push of no messages proves the key (what a server sends first): accepted, nothing passed on.
    empty = packed.pack([], [])
    assert client.consumePacked(empty, packed_proof(subscriber, challenge, 97, empty)) == 0
    with pytest.raises(T.TPushRefused, match="replay"):
        client.consumePacked(empty, packed_proof(subscriber, challenge, 97, empty))
    with pytest.raises(T.TPushRefused):  # not even bytes
        client.consumePacked(None, packed_proof(subscriber, challenge, 99, b""))
    # A proof with no epoch is one of epoch 0, as its MAC is (it did not end the connection with a TypeError).
    later = packed.pack(*cells(0, (2**40 + 10, 0), value=b"two"))
    no_epoch = packed_proof(subscriber, challenge, 100, later)
    no_epoch.epoch = None
    assert client.consumePacked(later, no_epoch) == 0
    client.close()
    got = listener.messages[1]
    assert [m.value for m in listener.messages] == [b"real", b"one", b"two"]
    assert (got.id, got.partition_id, got.topic) == (MessageID(2**40, 0), 0, "t")
    assert subscriber.guard.refused == len(bad) + 7  # and the empty push replayed


def test_a_subscriber_that_does_not_know_packed_pushes_gets_every_message_as_tmessages(tmp_path, monkeypatch):
    """An older subscriber answers consumePacked with UNKNOWN_METHOD: the server pushes to
    it with consumeMessages from then on, and nothing is lost or repeated."""
    older = type(
        "OlderSubscriberService",
        (T.HQueueSubscriberService,),
        {"thrift_services": ["pushChallenge", "consumeMessages"]},
    )
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()  # made before the patch: it serves packed

    class OlderListener(threaded.ThreadedServer):
        def __init__(self, service, handler, *args, **kwargs):
            if service is T.HQueueSubscriberService:
                service = older
            super().__init__(service, handler, *args, **kwargs)

    monkeypatch.setattr(threaded, "ThreadedServer", OlderListener)
    url = f"hqueue://{server.address}"
    try:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 2)
        listener = Collect()
        with HQueue("q", url) as queue, queue.create_subscriber(Subscription("s"), [listener]):
            ids = queue.put([Message("t", b"%d" % i, partition_id=i % 2) for i in range(3000)])
            wait_for(lambda: len(listener.messages) >= 3000, 60, "every message through consumeMessages")
            time.sleep(0.5)  # nothing more comes
            assert sorted(m.id for m in listener.messages) == sorted(ids)
            assert {m.value for m in listener.messages} == {b"%d" % i for i in range(3000)}
    finally:
        server.stop()


def test_a_connection_sends_no_call_over_4_kib_before_it_proves_the_push_key(running):
    """Anyone who reaches the push port held its in-flight budget with a few 16 MiB frames
    sent a byte a second (pushes stalled for as long): until a connection has proven the
    key, a call over 4 KiB is refused from its head, typed, and the connection goes on
    (64 KiB let 1,024 strangers' half-sent frames hold the whole budget: a review)."""
    server, queue, subscriber, listener = running
    blob = packed.pack(*cells(0, *[(2**40 + i, 0) for i in range(100)], value=b"v" * 1000))
    assert len(blob) > 64 * 1024
    client = subscriber_client(subscriber.address)
    challenge = client.pushChallenge()
    with pytest.raises(T.TPushRefused, match="before the connection proved who it is.*pushChallenge"):
        client.consumePacked(blob, packed_proof(subscriber, challenge, 1, blob))  # even proven: too big yet
    empty = packed.pack([], [])
    assert client.consumePacked(empty, packed_proof(subscriber, challenge, 2, empty)) == 0
    assert client.consumePacked(blob, packed_proof(subscriber, challenge, 3, blob)) == 0
    assert len(listener.messages) == 101
    # A slow stranger's big frame holds nothing: refused from its head while the server's pushes go on.
    stranger = socket.create_connection(("127.0.0.1", int(subscriber.address.rpartition(":")[2])))
    stranger.sendall(struct.pack(">i", 16 * 1024 * 1024) + b"\x80\x01\x00\x01")
    queue.put([Message("t", b"x" * 2048) for _ in range(100)], partition_id=1)  # a real push of 200 KB
    wait_for(lambda: len(listener.messages) == 201, 30, "the server's big push")
    stranger.close()
    client.close()
