"""Group commit on the embedded store (storage/commits.py): concurrent SYNC_WAL
writes share one RocksDB write, and a group is stored whole or not at all."""

from __future__ import annotations

import threading

import pytest
import rocksdict

from hqueue.config import Durability, QueueInfo
from hqueue.errors import Fenced, StorageError
from hqueue.message import MessageID, encode_rowkey
from hqueue.storage.commits import GroupCommit
from hqueue.storage.embedded import EmbeddedStorage


@pytest.fixture
def store(tmp_path):
    storage = EmbeddedStorage(str(tmp_path / "data"))
    storage.create_queue(QueueInfo("q", 16))
    yield storage
    storage.close()


def rowkey(pid: int, n: int) -> bytes:
    return encode_rowkey(pid, MessageID(1_700_000_000_000 + n, 0)) + b"t"


def test_concurrent_sync_writes_from_many_threads_share_groups_and_all_are_stored(store):
    # Given 16 writers, each with its own partition (and its fence), writing SYNC_WAL batches
    fences = [store.take_partition("q", pid) for pid in range(16)]
    start = threading.Barrier(16)

    def write(pid: int) -> None:
        start.wait()
        for n in range(50):
            key = rowkey(pid, n)
            store.write("q", [(key, b"v%d" % n)], Durability.SYNC_WAL, fence=fences[pid], high=key[:16])

    writers = [threading.Thread(target=write, args=(pid,)) for pid in range(16)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    # Then every write is stored, and they went out in fewer RocksDB writes than there were writes
    for pid in range(16):
        assert len(store.scan("q", rowkey(pid, 0), rowkey(pid, 50), limit=100)) == 50
    assert store._commit.writes >= 800  # the fences' own writes go the same way
    assert store._commit.groups < store._commit.writes
    assert store._commit.gathers > 0


def test_a_lone_writer_never_waits_for_company(store):
    # Given one thread writing SYNC_WAL batches one after another
    for n in range(200):
        store.write("q", [(rowkey(0, n), b"v")], Durability.SYNC_WAL)
    # Then each went at once, alone: no leader waited for others
    assert store._commit.gathers == 0
    assert store._commit.groups == store._commit.writes >= 200


def test_a_fenced_writer_is_refused_and_the_others_are_stored(store):
    old = store.take_partition("q", 0)
    store.take_partition("q", 0)  # a newer owner: the old fence is stale
    with pytest.raises(Fenced):
        store.write("q", [(rowkey(0, 1), b"stale")], Durability.SYNC_WAL, fence=old)
    store.write("q", [(rowkey(1, 1), b"fresh")], Durability.SYNC_WAL)
    assert store.scan("q", rowkey(0, 0), rowkey(0, 9)) == []
    assert len(store.scan("q", rowkey(1, 0), rowkey(1, 9))) == 1


def test_a_group_with_a_bad_write_fails_every_writer_in_it_and_stores_none(tmp_path):
    # Given a real RocksDB, and a first group held in its write until two more writers queue
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(str(tmp_path / "db"), options)
    sync = rocksdict.WriteOptions()
    sync.sync = True
    entered, release = threading.Event(), threading.Event()

    def write(batch: rocksdict.WriteBatch) -> None:
        if not entered.is_set():
            entered.set()
            release.wait(10)
        db.write(batch, sync)

    commits = GroupCommit(write)
    outcomes: dict[str, object] = {}

    def commit(name: str, key: object) -> None:
        try:
            commits.commit(lambda batch: batch.put(key, b"v"))
            outcomes[name] = "stored"
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            outcomes[name] = e

    first = threading.Thread(target=commit, args=("first", b"k0"))
    first.start()
    assert entered.wait(10)
    # When the next group holds a good write and a bad one (a key that is not bytes)
    later = [threading.Thread(target=commit, args=(n, k)) for n, k in (("good", b"k1"), ("bad", 12.5))]
    for t in later:
        t.start()
    while len(commits._queue) < 2:
        threading.Event().wait(0.01)
    release.set()
    for t in (first, *later):
        t.join(10)
    # Then the first group is stored, and both writers of the second fail, with nothing of it stored
    assert outcomes["first"] == "stored"
    assert not isinstance(outcomes["good"], str) and not isinstance(outcomes["bad"], str)
    assert isinstance(outcomes["good"], StorageError) or isinstance(outcomes["bad"], StorageError)
    assert db.get(b"k0") == b"v" and db.get(b"k1") is None
    assert (commits.groups, commits.writes) == (2, 3)
    db.close()


def test_one_writer_whose_calls_rotate_over_threads_seldom_waits(store):
    # Given writes one after another, each from the next of 4 threads (a client's calls
    # landing on a server's connection threads in turn)
    turns = [threading.Event() for _ in range(4)]

    def write(t: int) -> None:
        for n in range(t, 400, 4):
            turns[t].wait(10)
            turns[t].clear()
            store.write("q", [(rowkey(0, n), b"v")], Durability.SYNC_WAL)
            turns[(t + 1) % 4].set()

    writers = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for w in writers:
        w.start()
    turns[0].set()
    for w in writers:
        w.join()
    # Then the waits that found nobody grew rare: nowhere near one a write
    assert store._commit.groups == store._commit.writes >= 400
    assert store._commit.gathers < 400 / 8, store._commit.gathers


def test_a_writer_interrupted_while_it_waits_is_never_written_and_holds_up_nobody(monkeypatch):
    """Ctrl-C in a process holding the store lands in a waiting writer: its fill must leave
    the queue (no leader may write it once its caller holds no lock of the partition), and
    an interrupted leader must hand on, or every later SYNC_WAL write would wait for ever."""
    filled: list[str] = []
    in_write, go_on = threading.Event(), threading.Event()

    def write(batch) -> None:
        in_write.set()
        go_on.wait(10)

    commits = GroupCommit(write)

    def fill(name: str):
        return lambda batch: filled.append(name)

    # A follower: interrupted while a leader writes
    leader = threading.Thread(target=commits.commit, args=(fill("leader"),))
    leader.start()
    assert in_write.wait(10)
    wait = commits._cond.wait

    def interrupted(timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(commits._cond, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        commits.commit(fill("follower"))
    monkeypatch.setattr(commits._cond, "wait", wait)
    go_on.set()
    leader.join(10)
    # A leader: interrupted while it waits for company
    commits._crowded = True
    monkeypatch.setattr(commits._cond, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        commits.commit(fill("gathering"))
    monkeypatch.setattr(commits._cond, "wait", wait)
    # Then later writes go through at once, and neither interrupted fill was ever written
    done = threading.Thread(target=commits.commit, args=(fill("after"),))
    done.start()
    done.join(10)
    assert not done.is_alive()
    assert filled == ["leader", "after"]


def test_a_thread_that_defers_its_syncs_writes_at_once_and_settles_them_with_one_fsync(store):
    """A server's event loop: its SYNC_WAL writes return before their fsync, and one fsync
    at the end of its turn makes them all durable; other threads' writes are unchanged."""
    seen: dict[str, object] = {}

    def loop() -> None:
        store.defer_syncs()
        groups = store._commit.groups
        for n in range(10):
            store.write("q", [(rowkey(0, n), b"v")], Durability.SYNC_WAL)
        seen["written"] = (store._commit.groups - groups, store.deferred())
        seen["readable"] = len(store.scan("q", rowkey(0, 0), rowkey(0, 10), limit=20))
        store.settle()
        seen["settled"] = (store._commit.groups - groups, store.deferred())
        store.make_durable()  # on this thread: at its next settle
        seen["asked"] = store.deferred()
        store.settle()

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(10)
    assert seen == {"written": (0, True), "readable": 10, "settled": (1, False), "asked": True}
    groups = store._commit.groups
    store.write("q", [(rowkey(1, 0), b"v")], Durability.SYNC_WAL)  # another thread: synced before it returns
    assert (store._commit.groups - groups, store.deferred()) == (1, False)
    store.make_durable()  # off a deferring thread: an fsync now
    assert store._commit.groups - groups == 2
