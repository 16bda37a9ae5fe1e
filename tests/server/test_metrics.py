"""The server's Prometheus metrics (--metrics-port): counts, times, lag."""

import collections
import http.client
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from hqueue import HQueue, HQueueAdmin, Message, MessageListener, Subscription
from hqueue.auth import AuthPolicy
from hqueue.errors import InvalidArgument, NotAuthorized
from hqueue.groups.limits import GroupLimits
from hqueue.server import HQueueServer

from ..processes import ServerProcess, drain, wait_for


def scrape(server) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r"^(hqueue_\S+) (\S+)$", text, re.M)}


def scrape_with(server, *series: str) -> dict[str, float]:
    """A scrape that has ``series`` (a reader's lag shows once the lag book has counted it)."""

    def has_them():
        metrics = scrape(server)
        return metrics if all(s in metrics for s in series) else None

    return wait_for(has_them, 10, f"{series} in a scrape")


class Refuse(MessageListener):
    def on_messages(self, messages):
        raise RuntimeError("not today")


class Take(MessageListener):
    def __init__(self):
        self.count = 0

    def on_messages(self, messages):
        self.count += len(messages)


@pytest.fixture
def server(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    with HQueueAdmin(f"hqueue://{server.address}") as admin:
        admin.create_queue("q", 2)
    yield server
    server.stop()


def test_puts_connections_and_partitions_are_counted(server):
    with HQueue("q", f"hqueue://{server.address}") as queue:
        queue.put([Message("t", b"x")] * 7, partition_id=0)
        queue.put(Message("t", b"y"), partition_id=1)
        metrics = scrape(server)
    assert metrics['hqueue_put_messages_total{queue="q"}'] == 8
    assert metrics['hqueue_put_seconds_count{queue="q"}'] == 2
    assert metrics['hqueue_owned_partitions{queue="q"}'] == 2
    assert metrics["hqueue_connections"] >= 1
    assert metrics["hqueue_inflight_request_bytes"] == 0  # nothing under way between calls
    # a single server's partitions never move: 0, not a family without samples (the dashboard reads it)
    assert metrics['hqueue_partition_changes_total{change="gained"}'] == 0
    assert metrics['hqueue_partition_changes_total{change="lost"}'] == 0


def test_delivery_and_lag_per_subscriber_and_partition(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        taker = Take()
        with (
            queue.create_subscriber(Subscription("taker"), [taker]),
            queue.create_subscriber(Subscription("refuser"), [Refuse()]),
        ):
            queue.put([Message("t", b"x")] * 5, partition_id=1)
            wait_for(lambda: taker.count == 5, 20, "delivery")
            key = '{partition="1",queue="q",subscriber="%s"}'
            failures = 'hqueue_delivery_failures_total{queue="q",subscriber="refuser"}'
            wait_for(lambda: scrape(server).get(failures, 0) > 0, 20, "a refused push")
            lag = "hqueue_subscriber_lag_seconds" + key % "refuser"
            wait_for(lambda: scrape(server).get(lag, 0) > 0, 20, "lag in time")
            taken = "hqueue_subscriber_lag_messages" + key % "taker"
            metrics = scrape_with(server, taken)
    assert metrics['hqueue_delivered_messages_total{queue="q",subscriber="taker"}'] == 5
    assert metrics["hqueue_subscriber_lag_messages" + key % "taker"] == 0
    assert metrics["hqueue_subscriber_lag_seconds" + key % "taker"] == 0
    assert metrics["hqueue_subscriber_lag_messages" + key % "refuser"] == 5  # one waiting batch: lag, not 0
    assert metrics['hqueue_delivery_seconds_count{queue="q",subscriber="taker"}'] >= 1


def test_a_taken_metrics_port_fails_before_anything_starts(server, tmp_path):
    with pytest.raises(OSError, match=f"metrics port {server.metrics_port}"):
        HQueueServer(f"local://{tmp_path}/other", port=0, metrics_port=server.metrics_port)


def test_consumer_groups_are_counted_per_group_and_partition(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("workers", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
        got = []
        while len(got) < 5:
            got += consumer.receive(5, wait=1)
        consumer.ack(got[:3])
        consumer.nack(got[3:4], delay=60)
        group, partition = 'group="workers",queue="q"', 'group="workers",partition="0",queue="q"'
        lag = f"hqueue_group_lag_messages{{{partition}}}"
        metrics = scrape_with(server, lag)
    assert metrics[f"hqueue_group_received_messages_total{{{group}}}"] == 5
    assert metrics[f"hqueue_group_acked_messages_total{{{group}}}"] == 3
    assert metrics[f"hqueue_group_nacked_messages_total{{{group}}}"] == 1
    assert metrics[f"hqueue_group_members{{{group}}}"] == 1
    assert metrics[f"hqueue_group_in_flight_messages{{{partition}}}"] == 1
    assert metrics[f"hqueue_group_retrying_messages{{{partition}}}"] == 1
    assert metrics[f"hqueue_group_lag_messages{{{partition}}}"] == 2
    assert metrics[f"hqueue_group_lag_seconds{{{partition}}}"] >= 0


def test_each_scrape_follows_what_moved_since_the_last(server):
    """A scrape reuses the lines of a partition whose counts did not move: every move
    (a put, a receive, an ack, a nack) shows in the next scrape, and the age keeps growing."""
    partition = 'group="w",partition="0",queue="q"'
    lag, age = f"hqueue_group_lag_messages{{{partition}}}", f"hqueue_group_lag_seconds{{{partition}}}"
    leased, retrying = (
        f"hqueue_group_in_flight_messages{{{partition}}}",
        f"hqueue_group_retrying_messages{{{partition}}}",
    )
    with HQueue("q", f"hqueue://{server.address}") as queue, queue.consumer("w", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(4)], 0)
        got = wait_for(lambda: consumer.receive(2, wait=1), 10, "a delivery")
        first = scrape_with(server, lag)
        assert (first[lag], first[leased], first[retrying]) == (4, len(got), 0)
        time.sleep(0.05)
        again = scrape(server)
        assert again[lag] == 4 and again[age] > first[age]  # nothing moved: same lines, a later age
        queue.put(Message("t", b"more"), 0)
        assert scrape(server)[lag] == 5
        consumer.ack(got[:1])
        after_ack = scrape(server)
        assert (after_ack[lag], after_ack[leased]) == (4, len(got) - 1)
        consumer.nack(got[1:], delay=60)
        after_nack = scrape(server)
        assert (after_nack[lag], after_nack[leased], after_nack[retrying]) == (4, 0, len(got) - 1)


def test_acks_of_receipts_a_group_never_handed_out_are_counted(server):
    from hqueue.api import groups_of
    from hqueue.message import MessageID, encode_rowkey

    with HQueue("q", f"hqueue://{server.address}") as queue, queue.consumer("workers") as consumer:
        queue.put([Message("t", b"x")], 0)
        (real,) = wait_for(lambda: consumer.receive(1, wait=1), 10, "a delivery")
        made_up = [encode_rowkey(0, MessageID(4_000_000_000_000, i)) for i in range(7)]
        assert groups_of(queue.engine).ack("q", "workers", [real.rowkey, *made_up]) == 1
        metrics = scrape(server)
    assert metrics['hqueue_group_unknown_acks_total{group="workers",queue="q"}'] == 7
    assert metrics['hqueue_group_acked_messages_total{group="workers",queue="q"}'] == 1


# -- who may scrape, and what a scrape costs ------------------------------------------------

METRICS_TOKEN = "metrics-token-0123456789"
ADMIN, CRAWLER, PROMETHEUS = "admin-secret-0123456789", "crawler-secret-0123456789", "prom-secret-0123456789"
AUTH_FILE = f"""
[tokens.ops]
secret = "{ADMIN}"
admin = ["*"]

[tokens.crawler]
secret = "{CRAWLER}"
consumer = ["*"]

[tokens.prometheus]
secret = "{PROMETHEUS}"
metrics = ["*"]
"""


def get(port: int, token: str | None = None, path: str = "/metrics") -> tuple[int, bytes]:
    """One HTTP GET as curl would send it: (status, body)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read()
        except (OSError, http.client.HTTPException):
            return e.code, b""  # answered unread (429), then closed before its body
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return 0, b""  # closed without an answer (every connection slot taken)


def server_process(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[ServerProcess, int]:
    """A server whose metrics port is a free one (0: the server's pick, read from its log,
    so that no other test on the machine can take it between a pick and the bind)."""
    if env:
        os.environ.update(env)
    try:
        process = ServerProcess(f"local://{tmp_path}/data", tmp_path, extra_args=("--metrics-port", "0", *args))
    finally:
        for name in env or ():
            os.environ.pop(name, None)
    return process, int(process.announced("metrics").rpartition(":")[2])


def test_metrics_listen_on_loopback_whatever_the_thrift_host(tmp_path):
    # Given a server whose Thrift port listens on every address
    server = HQueueServer(f"local://{tmp_path}/data", host="0.0.0.0", port=0, metrics_port=0)
    try:
        # Then its metrics listen on loopback only, unless told otherwise
        assert server.metrics._endpoint._server.server_address[0] == "127.0.0.1"
    finally:
        server.stop()


def test_a_metrics_token_is_needed_and_checked(tmp_path):
    # Given a server started with a metrics token (from the environment)
    process, port = server_process(tmp_path, env={"HQUEUE_METRICS_TOKEN": METRICS_TOKEN})
    try:
        # Then a request without it, with a wrong one or another scheme gets 401, and no series
        for token in (None, "wrong-token-0123456789", METRICS_TOKEN[:-1]):
            status, body = get(port, token)
            assert status == 401 and b"hqueue_" not in body
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
        request.add_header("Authorization", f"Basic {METRICS_TOKEN}")
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(request, timeout=10)
        # And with it, the series
        status, body = get(port, METRICS_TOKEN)
        assert status == 200 and b"hqueue_connections" in body
        assert get(port, METRICS_TOKEN, "/other")[0] == 404
        # Wrong tokens are log-ins that failed: logged (a scrape answered 700 guesses a second, silently)
        assert get(port, "guess-0123456789abcdef")[0] in (401, 429)  # (its 4th wrong token: maybe unread)
        assert "refused a token from 127.0.0.1" in process.log_path.read_text()
    finally:
        process.terminate()


def test_a_host_guessing_tokens_is_answered_429_unread_and_other_hosts_scrape_on(tmp_path):
    """Wrong tokens were answered at once, 700 a second; then, slowed by sleeping in the
    endpoint's 8 threads, 10 guessing connections kept the right scrape out (a review). A host
    past its free wrong tokens is now answered 429 at once, unread, while it would wait on the
    Thrift port; a scraper on another host reads every time."""
    process, port = server_process(tmp_path, env={"HQUEUE_METRICS_TOKEN": METRICS_TOKEN})
    stop, answers = threading.Event(), collections.Counter()

    def guess() -> None:
        while not stop.is_set():
            answers[get(port, "guess-0123456789abcdef")[0]] += 1

    def scrape_from_another_host() -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.2", 0))
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        status = connection.getresponse().status
        connection.close()
        return status

    guessers = [threading.Thread(target=guess) for _ in range(10)]
    try:
        for thread in guessers:
            thread.start()
        scrapes = []
        for _ in range(15):
            scrapes.append(scrape_from_another_host())
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in guessers:
            thread.join()
        process.terminate()
    assert scrapes == [200] * 15
    assert answers[401] <= 20 and answers[429] > answers[401]  # 3 s of guessing: a few read, the rest not


def test_auth_file_tokens_with_the_metrics_role_may_scrape_and_nothing_else(tmp_path):
    # Given a server with an auth file and no metrics token
    (tmp_path / "auth.toml").write_text(AUTH_FILE)
    process, port = server_process(tmp_path, "--auth-file", str(tmp_path / "auth.toml"))
    try:
        # Then a credential is needed: the metrics role's token, or an admin of every queue
        assert get(port)[0] == 401
        assert get(port, PROMETHEUS)[0] == 200
        # And a right token without the role is 403, however often: not a wrong guess, so not
        # counted against its host (it was 401, and put a scraper's host on hold with 429)
        assert [get(port, CRAWLER)[0] for _ in range(8)] == [403] * 8
        assert get(port, PROMETHEUS)[0] == 200
        assert "refused a token" not in process.log_path.read_text()
        assert get(port, ADMIN)[0] == 200
        # And the metrics token may do nothing on the Thrift port: it is refused there (nor does
        # it keep a connection's place, as a token that may call something does)
        with HQueueAdmin(f"hqueue://{process.address}", token=PROMETHEUS) as admin:
            with pytest.raises(NotAuthorized, match="holds no role on any queue"):
                admin.create_queue("q", 1)
            with pytest.raises(NotAuthorized, match="holds no role on any queue"):
                admin.list_queues()
    finally:
        process.terminate()


def test_only_an_admin_of_every_queue_reads_metrics_not_a_pattern_that_matches_the_name_star(tmp_path):
    """admin = ["?"] or ["[!b]*"] matched the literal name '*': such a token read every
    queue's series, queues it may not see on the Thrift port among them (an audit)."""
    tokens = {"wide": '["*"]', "one_char": '["?"]', "not_b": '["[!b]*"]', "crawl": '["crawl.*"]'}
    (tmp_path / "auth.toml").write_text(
        "".join(f'[tokens.{n}]\nsecret = "{n}-secret-0123456789"\nadmin = {p}\n\n' for n, p in tokens.items())
    )
    policy = AuthPolicy.load(tmp_path / "auth.toml")
    readers = {n for n in tokens if policy.authenticate(f"{n}-secret-0123456789").may_read_metrics()}
    assert readers == {"wide"}
    # and a refusal on the console's audit queue names the role it needs (it named one the token held)
    (tmp_path / "auth.toml").write_text(f'[tokens.w]\nsecret = "{CRAWLER}"\nproducer = ["*"]\n')
    writer = AuthPolicy.load(tmp_path / "auth.toml").authenticate(CRAWLER)
    with pytest.raises(NotAuthorized, match="needs role 'admin'"):
        writer.require("producer", "hqueue-console-audit", "put to")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (f'[tokens.p]\nsecret = "{PROMETHEUS}"\nmetrics = ["crawl.*"]\n', 'metrics must be \\["\\*"\\]'),
        (f'[tokens.p]\nsecret = "{PROMETHEUS}"\nmetrics = "*"\n', 'metrics must be \\["\\*"\\]'),
    ],
)
def test_a_metrics_role_on_some_queues_is_a_clear_error(tmp_path, text, error):
    (tmp_path / "auth.toml").write_text(text)
    with pytest.raises(InvalidArgument, match=error):
        AuthPolicy.load(tmp_path / "auth.toml")


def test_a_short_metrics_token_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="16 characters"):
        HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0, metrics_token="short")


def test_slow_large_and_many_requests_end_with_their_connections(tmp_path):
    # Given a server with a metrics token
    process, port = server_process(tmp_path, "--metrics-token", METRICS_TOKEN)
    try:
        threads = status_field(process.proc.pid, "Threads")
        # When 200 connections open and send nothing, one dribbles a byte at a time,
        # and one sends a megabyte of headers
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        dribbling = socket.create_connection(("127.0.0.1", port))
        big = socket.create_connection(("127.0.0.1", port))
        try:
            big.sendall(b"GET /metrics HTTP/1.0\r\n" + b"X-Pad: " + b"x" * 1_000_000 + b"\r\n\r\n")
        except OSError:
            pass  # closed while we sent: as it should be
        # Then the server holds at most a few threads for them
        assert status_field(process.proc.pid, "Threads") <= threads + 8 + 1
        # And every one of them is closed within the deadline, however it sends
        started = time.monotonic()

        def closed(connection: socket.socket) -> bool:
            connection.settimeout(0.5)
            try:
                connection.sendall(b"G")
                return connection.recv(1024) == b""
            except (TimeoutError, OSError):
                return isinstance(sys.exc_info()[1], ConnectionError)

        wait_for(lambda: closed(dribbling), 20, "the dribbling connection to be closed")
        wait_for(lambda: closed(big), 20, "the large request's connection to be closed")
        assert time.monotonic() - started < 15
        # And a scrape is served again
        wait_for(lambda: get(port, METRICS_TOKEN)[0] == 200, 20, "a scrape")
        # And a request line without a version gets a status line (not an HTTP/0.9 bare body)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as old:
            old.sendall(b"GET /metrics\r\n\r\n")
            assert old.recv(1024).startswith(b"HTTP/1.0 401 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as older:  # or HTTP/0.9 said outright
            older.sendall(b"GET /metrics HTTP/0.9\r\n\r\n")
            assert older.recv(1024).startswith(b"HTTP/1.0 401 ")
        for connection in [*idle, dribbling, big]:
            connection.close()
    finally:
        process.terminate()


def test_headers_past_the_request_limit_are_431_not_a_request_cut_short(tmp_path):
    """8 KiB of request line and headers: the rest was dropped and the request answered as
    if whole (a scrape with the right token, its headers cut)."""
    process, port = server_process(tmp_path, "--metrics-token", METRICS_TOKEN)
    try:
        for pad in (b"X-Pad: " + b"x" * 9000 + b"\r\n", b"X-Pad: x\r\n" * 1000):  # one long header; many
            with socket.create_connection(("127.0.0.1", port), timeout=10) as big:
                big.sendall(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer " + METRICS_TOKEN.encode() + b"\r\n")
                try:
                    big.sendall(pad + b"\r\n")
                except OSError:
                    pass  # answered and closed while we sent
                assert big.recv(1024).startswith(b"HTTP/1.0 431 ")
        assert get(port, METRICS_TOKEN)[0] == 200
    finally:
        process.terminate()


def status_field(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


# -- lag kept as things move -----------------------------------------------------------------


class CountingScans:
    """Counts the store's row reads (the real store's, passed through)."""

    def __init__(self, storage):
        self.storage, self.calls = storage, 0
        self.scan = storage.scan

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.scan(*args, **kwargs)


def test_a_scrape_reads_no_row(server, monkeypatch):
    # Given 20 groups behind on both partitions, and a subscriber behind, all counted once
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        for pid in (0, 1):
            queue.put([Message("t", b"x")] * 50, partition_id=pid)
        for g in range(20):
            with queue.consumer(f"g{g}", member="m") as consumer:
                assert consumer.receive(1, wait=1)
        series = [
            f'hqueue_group_lag_messages{{group="g{g}",partition="{p}",queue="q"}}' for g in range(20) for p in (0, 1)
        ]
        before = scrape_with(server, *series)
        assert before[series[0]] == 50
        # When Prometheus scrapes
        counting = CountingScans(server.engine.storage)
        monkeypatch.setattr(server.engine.storage, "scan", counting)
        after = scrape(server)
    # Then no row was read, and the lag is all there
    assert counting.calls == 0
    assert all(after[s] == 50 for s in series)


def test_group_lag_counts_messages_not_yet_acked_as_they_move(server):
    # Given a group counted once, 5 messages behind
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("workers", member="m") as consumer:
        queue.put([Message("t", b"%d" % i) for i in range(5)], 0)
        got = drain(consumer, 5)
        key = 'hqueue_group_lag_messages{group="workers",partition="0",queue="q"}'
        assert scrape_with(server, key)[key] == 5
        # When messages 2 and 4 are acked (out of order: the cursor stays at 1) and 3 more come
        consumer.ack([got[1], got[3]])
        queue.put([Message("t", b"more")] * 3, 0)
        # Then the lag counts what is not acked, not what lies past the cursor
        assert scrape(server)[key] == 5 - 2 + 3
        # And after acking everything handed out, it is what was never handed out
        consumer.ack([got[0], got[2], got[4]])
        assert scrape(server)[key] == 3
        consumer.ack(drain(consumer, 3))
        metrics = scrape(server)
    assert metrics[key] == 0
    assert metrics['hqueue_group_lag_seconds{group="workers",partition="0",queue="q"}'] == 0


def test_group_lag_with_a_topic_filter_counts_its_topics_only(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("news", member="m", topics=["news"]) as consumer:
        queue.put([Message("news", b"n"), Message("sport", b"s")] * 3, 0)
        consumer.receive(1, wait=1)
        key = 'hqueue_group_lag_messages{group="news",partition="0",queue="q"}'
        assert scrape_with(server, key)[key] == 3
        queue.put([Message("sport", b"s")] * 4 + [Message("news", b"n")], 0)
        assert scrape(server)[key] == 4


def test_the_lag_age_of_a_group_with_a_topic_filter_is_its_own_topics(server):
    """The age was that of the oldest waiting message of any topic: a group of 'news' showed
    the age of a 'sport' message written long before its news (4.5 s for 0.5; an attacker's pass),
    whether the group was counted before (the tally's marks) or after (the seed's oldest)."""
    url = f"hqueue://{server.address}"
    age = 'hqueue_group_lag_seconds{group="%s",partition="0",queue="q"}'
    with HQueue("q", url) as queue:
        early, late = queue.consumer("early", topics=["news"]), queue.consumer("late", topics=["news"])
        queue.put(Message("news", b"n1"), 0)
        scrape_with(server, age % "early")  # (counted with n1 waiting)
        for consumer in (early, late):
            consumer.ack(consumer.receive(10, wait=2))
        queue.put(Message("sport", b"s"), 0)
        time.sleep(2.5)
        queue.put(Message("news", b"n2"), 0)
        metrics = scrape_with(server, age % "early", age % "late")
        early.close()
        late.close()
    assert metrics[age % "early"] < 1.5 and metrics[age % "late"] < 1.5


def test_the_lag_age_of_a_group_counted_at_the_end_of_its_partition_is_its_messages(server):
    """Counted at the end of an empty partition, a group showed an age of 0 for messages
    waiting for ever; counted before a truncate, the age of its old position (an attacker's pass)."""
    url = f"hqueue://{server.address}"
    key = 'hqueue_group_lag_%s{group="g",partition="0",queue="q"}'
    with HQueue("q", url) as queue, HQueueAdmin(url) as admin:
        consumer = queue.consumer("g")
        scrape_with(server, key % "messages")  # (counted with nothing waiting)
        queue.put(Message("t", b"one"), 0)
        time.sleep(1.5)
        metrics = scrape(server)
        assert metrics[key % "messages"] == 1 and metrics[key % "seconds"] >= 1.0
        consumer.ack(consumer.receive(10, wait=2))
        admin.truncate_queue("q")
        time.sleep(2.5)
        queue.put(Message("t", b"two"), 0)
        metrics = wait_for(lambda: (m := scrape(server)).get(key % "messages") == 1 and m, 10, "the lag of one")
        consumer.close()
    assert metrics[key % "seconds"] < 1.5


def test_subscriber_lag_is_kept_as_messages_are_delivered(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue:
        taker = Take()
        with queue.create_subscriber(Subscription("taker"), [taker]):
            queue.put([Message("t", b"x")] * 5, partition_id=0)
            wait_for(lambda: taker.count == 5, 20, "delivery")
            key = 'hqueue_subscriber_lag_messages{partition="0",queue="q",subscriber="taker"}'
            wait_for(lambda: scrape_with(server, key)[key] == 0, 10, "no lag")
            queue.put([Message("t", b"x")] * 7, partition_id=0)
            wait_for(lambda: taker.count == 12, 20, "delivery")
            wait_for(lambda: scrape(server)[key] == 0, 10, "no lag after more")


def test_lag_covers_groups_no_member_used_here_and_every_partition(tmp_path):
    # Given a server whose lag book refreshes often, and a group made but never received from
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0)
    assert server.lag is not None
    server.lag.refresh_interval = 0.2
    server.start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 3)
        with HQueue("q", url) as queue:
            queue.put([Message("t", b"x")] * 4, partition_id=2)
            queue.consumer("idle", member="m").close()  # made, never received from
        # Then its lag shows on every partition
        keys = [f'hqueue_group_lag_messages{{group="idle",partition="{p}",queue="q"}}' for p in range(3)]
        metrics = scrape_with(server, *keys)
        assert [metrics[k] for k in keys] == [0, 0, 4]
    finally:
        server.stop()


def test_a_truncate_counts_lag_afresh(server):
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("workers", member="m") as consumer:
        queue.put([Message("t", b"x")] * 5, 0)
        consumer.receive(1, wait=1)
        key = 'hqueue_group_lag_messages{group="workers",partition="0",queue="q"}'
        assert scrape_with(server, key)[key] == 5
        with HQueueAdmin(url) as admin:
            admin.truncate_queue("q")
        wait_for(lambda: scrape(server).get(key) == 0, 10, "no lag after the truncate")


@pytest.mark.parametrize("gone", ["truncated", "expired"])
def test_lag_past_acks_whose_messages_are_gone_counts_what_waits(tmp_path, gone):
    """One message stuck in a lease and the 19 after it acked: once they were truncated or
    expired, the 19 acked were still taken off a count that no longer had them (5 new
    messages waiting, and describe_group and the metric said 0)."""
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("lt", 1, ttl=2 if gone == "expired" else 0)
            with HQueue("lt", url) as queue, queue.consumer("g", member="m", lease=120) as consumer:
                queue.put([Message("t", b"old")] * 20, 0)
                got = drain(consumer, 20)
                consumer.ack(got[1:])  # the first stays leased: the cursor waits at it
                if gone == "truncated":
                    admin.truncate_queue("lt")
                else:
                    time.sleep(2.5)
                queue.put([Message("t", b"new")] * 5, 0)
                assert admin.describe_group("lt", "g")["partitions"][0]["lag_messages"] == 5
                key = 'hqueue_group_lag_messages{group="g",partition="0",queue="lt"}'
                assert scrape_with(server, key)[key] == 5
                assert [m.value for m in drain(consumer, 5)] == [b"new"] * 5
    finally:
        server.stop()


def test_an_idle_group_s_lag_and_its_age_fall_as_its_messages_expire(tmp_path, monkeypatch):
    """Messages waiting on a queue with a TTL expire with no reader moving: the gauge kept
    counting them for ever (5 messages expired, and 5 shown, their age growing without
    end), while describe_group said 0. And the scrape that saw them expired asked for a
    recount but answered the old count: with nobody scraping meanwhile, lag stayed
    overstated by a whole scrape interval (an attacker's pass: 10 shown 20 s after all 10
    expired); that scrape now waits for the count, as for a first one."""
    import hqueue.lag

    monkeypatch.setattr(hqueue.lag, "EXPIRED_RECOUNT", 0.5)  # (a reader recounted for expiry every 5 s)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("lt", 1, ttl=2)
            with HQueue("lt", url) as queue, queue.consumer("g", member="m") as consumer:
                queue.put([Message("t", b"x")] * 10, 0)
                consumer.ack(drain(consumer, 5))
                lag = 'hqueue_group_lag_messages{group="g",partition="0",queue="lt"}'
                age = 'hqueue_group_lag_seconds{group="g",partition="0",queue="lt"}'
                assert scrape_with(server, lag)[lag] == 5
                time.sleep(2.5)  # then the 5 waiting expire
                assert admin.describe_group("lt", "g")["partitions"][0]["lag_messages"] == 0
                scraped = scrape(server)  # (the first one since they expired)
                assert (scraped[lag], scraped[age]) == (0, 0)
                # And what comes next counts from nothing
                queue.put([Message("t", b"new")] * 3, 0)
                wait_for(lambda: scrape(server)[lag] == 3, 10, "the 3 new messages as lag")
    finally:
        server.stop()


def test_silent_connections_holding_every_slot_do_not_keep_a_scrape_out(tmp_path):
    from hqueue.metrics.endpoint import MAX_CLIENTS

    # Given a server with a metrics token, and three times as many connections as it serves
    # at once opened and left silent (each would be held until its 5 s deadline)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0, metrics_token=METRICS_TOKEN).start()
    silent = [socket.create_connection(("127.0.0.1", server.metrics_port)) for _ in range(3 * MAX_CLIENTS)]
    try:
        # When Prometheus scrapes, again and again
        answers = [get(server.metrics_port, METRICS_TOKEN)[0] for _ in range(MAX_CLIENTS + 2)]
        # Then every scrape is answered: a silent connection was closed to make room each time
        assert answers == [200] * (MAX_CLIENTS + 2)

        def closed(connection: socket.socket) -> bool:
            connection.settimeout(0.1)
            try:
                return connection.recv(1) == b""
            except TimeoutError:
                return False
            except OSError:
                return True

        assert sum(map(closed, silent)) >= MAX_CLIENTS
    finally:
        for connection in silent:
            connection.close()
        server.stop()


def test_series_of_deleted_groups_queues_and_subscribers_go_with_them(server):
    """A token that may only consume made, used and deleted groups in a loop: each left four
    series behind for ever (the scrape and the server's memory grew without bound)."""
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin, HQueue("q", url) as queue:
        queue.put([Message("t", b"x")] * 40, partition_id=0)
        for round in range(20):
            with queue.consumer(f"g{round}", member="m") as consumer:
                consumer.ack(consumer.receive(2, wait=1))
            admin.delete_group("q", f"g{round}")
        with queue.consumer("kept", member="m") as consumer:
            consumer.ack(consumer.receive(2, wait=1))
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        assert re.findall(r'^hqueue_group_acked_messages_total\{group="([^"]+)"', text, re.M) == ["kept"]
        # A subscriber's series go when this server no longer pushes to it.
        taker = Take()
        with queue.create_subscriber(Subscription("taker"), [taker]):
            queue.put([Message("t", b"y")] * 3, partition_id=1)
            wait_for(lambda: taker.count == 3, 20, "delivery")
            assert scrape(server)['hqueue_delivered_messages_total{queue="q",subscriber="taker"}'] == 3
        admin.delete_subscriber("q", "taker")
        wait_for(lambda: not any('subscriber="taker"' in k for k in scrape(server)), 20, "the subscriber's series gone")
        # A deleted queue's put and group series go with it.
        admin.disable_queue("q")
        admin.delete_queue("q")
    metrics = scrape(server)
    assert not [k for k in metrics if 'queue="q"' in k and ("put" in k or "group_" in k and "_total" in k)]


def test_group_lag_keeps_a_stuck_message_the_cursor_moved_past(server, monkeypatch):
    # Given a stuck message (b holds it) and more acked after it than the group keeps, so the
    # completion cursor moved past it (groups/acks.py: _jump)
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", 5)
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        queue.put([Message("t", b"stuck")], 0)
        time.sleep(1.1)  # it is older than what comes next
        queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
        assert len(b.receive(1, wait=2)) == 1
        a.ack(drain(a, 10))
        # Then the metric counts it as lag, and the lag's age is its own, as describe does
        key = 'hqueue_group_lag_messages{group="g",partition="0",queue="q"}'
        assert scrape_with(server, key)[key] == 1
        queue.put([Message("t", b"new")], 0)
        metrics = scrape(server)
        assert metrics[key] == 2
        assert metrics['hqueue_group_lag_seconds{group="g",partition="0",queue="q"}'] >= 1.0


def test_a_stuck_messages_age_holds_for_a_group_counted_with_messages_after_it(server, monkeypatch):
    """Counted with 10 messages waiting after the stuck one its cursor moved past, a group's age
    was that of the oldest of those (its count skipped the stuck one), not the stuck one's (a review)."""
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", 5)
    url = f"hqueue://{server.address}"
    with HQueue("q", url) as queue, queue.consumer("g", member="a") as a, queue.consumer("g", member="b") as b:
        queue.put([Message("t", b"stuck")], 0)
        time.sleep(1.5)
        queue.put([Message("t", b"%d" % i) for i in range(20)], 0)
        assert len(b.receive(1, wait=2)) == 1
        a.ack(drain(a, 10))  # the cursor moves past the stuck one; 10 wait after it
        key = 'hqueue_group_lag_%s{group="g",partition="0",queue="q"}'
        metrics = scrape_with(server, key % "messages")
    assert metrics[key % "messages"] == 11 and metrics[key % "seconds"] >= 1.4


@pytest.mark.parametrize("gone", ["truncated", "expired"])
def test_a_stuck_message_the_cursor_moved_past_is_no_lag_once_gone(tmp_path, monkeypatch, gone):
    """A stuck message the completion cursor moved past (groups/acks.py: _jump) stayed lag
    in the gauge for good once it expired (1, then 4 with 3 new waiting), and in
    describe_group once it was truncated, the two disagreeing (an attacker's pass)."""
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", 5)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0).start()
    try:
        url = f"hqueue://{server.address}"
        key = 'hqueue_group_lag_messages{group="g",partition="0",queue="lt"}'
        with HQueueAdmin(url) as admin:
            admin.create_queue("lt", 1, ttl=3 if gone == "expired" else 0)
        with HQueueAdmin(url) as admin, HQueue("lt", url) as queue:
            with queue.consumer("g", member="a") as a, queue.consumer("g", member="b", lease=120) as b:
                queue.put([Message("t", b"stuck")], 0)
                assert len(b.receive(1, wait=2)) == 1  # b holds it
                queue.put([Message("t", b"%d" % i) for i in range(10)], 0)
                a.ack(drain(a, 10))
                assert scrape_with(server, key)[key] == 1
                assert admin.describe_group("lt", "g")["partitions"][0]["lag_messages"] == 1
                if gone == "truncated":
                    admin.truncate_queue("lt")
                else:
                    time.sleep(3.5)

                def lags():
                    return admin.describe_group("lt", "g")["partitions"][0]["lag_messages"], scrape(server).get(key)

                wait_for(lambda: lags() == (0, 0), 15, "no lag once the stuck message is gone")
                queue.put([Message("t", b"new")] * 3, 0)
                wait_for(lambda: lags() == (3, 3), 15, "the 3 new messages as lag, in both")
                a.ack(drain(a, 3))
                wait_for(lambda: lags() == (0, 0), 15, "no lag once they are acked")
    finally:
        server.stop()


def test_messages_waiting_for_the_dead_letter_queue_are_not_retrying(server):
    """With the dead-letter queue disabled, messages past their retries wait for it and
    are not handed out again: describe_group says dead_letter_waiting, and the gauge
    counted them as retrying ("failed messages waiting to go out again")."""
    url = f"hqueue://{server.address}"
    with HQueueAdmin(url) as admin, HQueue("q", url) as queue:
        admin.create_queue("q.dlq", 1)
        admin.disable_queue("q.dlq")
        with queue.consumer("g", member="m", max_retries=0) as consumer:
            queue.put([Message("t", b"x")] * 2, 0)
            consumer.nack(drain(consumer, 2))
            assert consumer.receive(10, wait=0.5) == []
            partition = admin.describe_group("q", "g")["partitions"][0]
            assert (partition["retrying"], partition["dead_letter_waiting"]) == (0, 2)
            key = 'hqueue_group_retrying_messages{group="g",partition="0",queue="q"}'
            assert scrape_with(server, key)[key] == 0


def test_a_member_that_only_heartbeats_is_a_live_member(tmp_path):
    """A member holding leases and heartbeating, but not receiving, was shown as no member
    at all after member_timeout (describe_group, the gauge, the console), though it is not
    gone until it makes no call for that long."""
    limits = GroupLimits(member_timeout=3.0)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, metrics_port=0, group_limits=limits).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 1)
        with HQueueAdmin(url) as admin, HQueue("q", url) as queue:
            with queue.consumer("g", member="holder", lease=60) as holder:
                queue.put([Message("t", b"x")], 0)
                assert len(drain(holder, 1)) == 1
                time.sleep(4.5)  # no receive since; its heartbeats go on
                assert admin.describe_group("q", "g")["members"] == ["holder"]
                key = 'hqueue_group_members{group="g",queue="q"}'
                assert scrape_with(server, key)[key] == 1
                assert admin.describe_group("q", "g")["partitions"][0]["in_flight"] == 1  # (its lease held)
    finally:
        server.stop()
