"""Group commit on the embedded store (storage/commits.py): concurrent SYNC_WAL
writes share fsyncs, and none is acknowledged before an fsync that covers it."""

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
    assert store._commit.syncs < store._commit.writes


def test_a_lone_writer_never_waits_for_company(store):
    # Given one thread writing SYNC_WAL batches one after another
    for n in range(200):
        store.write("q", [(rowkey(0, n), b"v")], Durability.SYNC_WAL)
    # Then each ran its own fsync at once
    assert store._commit.syncs == store._commit.writes >= 200


def test_a_fenced_writer_is_refused_and_the_others_are_stored(store):
    old = store.take_partition("q", 0)
    store.take_partition("q", 0)  # a newer owner: the old fence is stale
    with pytest.raises(Fenced):
        store.write("q", [(rowkey(0, 1), b"stale")], Durability.SYNC_WAL, fence=old)
    store.write("q", [(rowkey(1, 1), b"fresh")], Durability.SYNC_WAL)
    assert store.scan("q", rowkey(0, 0), rowkey(0, 9)) == []
    assert len(store.scan("q", rowkey(1, 0), rowkey(1, 9))) == 1


def real_db(tmp_path) -> rocksdict.Rdict:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    return rocksdict.Rdict(str(tmp_path / "db"), options)


def test_writers_that_come_during_an_fsync_share_the_next_and_none_returns_before_its_own(tmp_path):
    # Given a real RocksDB, and a first writer held inside its fsync
    db, order = real_db(tmp_path), []
    in_sync, release = threading.Event(), threading.Event()

    def sync() -> None:
        order.append(("sync", db.get(b"k1") is not None, db.get(b"k2") is not None))
        if not in_sync.is_set():
            in_sync.set()
            release.wait(10)
        db.flush_wal(True)

    commits = GroupCommit(db.write, sync)
    first = threading.Thread(target=commits.commit, args=(lambda batch: batch.put(b"k0", b"v"),))
    first.start()
    assert in_sync.wait(10)
    # When two more writers write meanwhile
    later = [threading.Thread(target=commits.commit, args=(lambda b, k=k: b.put(k, b"v"),)) for k in (b"k1", b"k2")]
    for t in later:
        t.start()
    while commits.writes < 3:
        threading.Event().wait(0.01)
    # Then neither returns while the first fsync runs, and both are covered by one more fsync
    assert all(t.is_alive() for t in later)
    release.set()
    for t in (first, *later):
        t.join(10)
    assert (commits.writes, commits.syncs) == (3, 2)
    assert order == [("sync", False, False), ("sync", True, True)]
    db.close()


def test_a_bad_write_fails_its_writer_alone_and_stores_nothing(tmp_path):
    db = real_db(tmp_path)
    commits = GroupCommit(db.write, lambda: db.flush_wal(True))
    with pytest.raises(Exception):  # noqa: B017 - rocksdict's own error for a key that is not bytes
        commits.commit(lambda batch: batch.put(12.5, b"v"))
    commits.commit(lambda batch: batch.put(b"k1", b"v"))
    assert db.get(b"k1") == b"v" and list(db.keys()) == [b"k1"]
    db.close()


def test_a_failed_fsync_fails_every_write_made_before_it_failed_for_good(tmp_path):
    """After a failed fsync the kernel may have dropped the dirty pages: a later fsync's
    success proves nothing for the writes made until then, so none is ever acknowledged."""
    db, calls = real_db(tmp_path), []
    in_sync, release = threading.Event(), threading.Event()

    def sync() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            in_sync.set()
            release.wait(10)
            raise OSError("EIO")
        db.flush_wal(True)

    commits = GroupCommit(db.write, sync)
    outcomes: dict[str, object] = {}

    def commit(name: str) -> None:
        try:
            commits.commit(lambda batch: batch.put(name.encode(), b"v"))
            outcomes[name] = "acknowledged"
        except StorageError as e:
            outcomes[name] = e
        except OSError as e:
            outcomes[name] = e

    first = threading.Thread(target=commit, args=("first",))
    first.start()
    assert in_sync.wait(10)
    second = threading.Thread(target=commit, args=("second",))  # written while the failing fsync runs
    second.start()
    while commits.writes < 2:
        threading.Event().wait(0.01)
    release.set()
    first.join(10)
    second.join(10)
    commit("third")
    assert isinstance(outcomes["first"], OSError)
    assert isinstance(outcomes["second"], StorageError) and "EIO" in str(outcomes["second"])
    assert outcomes["third"] == "acknowledged"
    assert commits.syncs == 2  # the failed one, then the third's
    db.close()


def test_a_writer_interrupted_in_its_fsync_or_its_wait_holds_up_nobody():
    """Ctrl-C in a process holding the store lands in a writer: an interrupted fsync proves
    nothing, so the writers it was to cover run one of their own; nothing waits for ever."""
    written: list[str] = []
    in_sync, go_on = threading.Event(), threading.Event()
    syncs = []

    def sync() -> None:
        syncs.append(1)
        if len(syncs) == 1:
            in_sync.set()
            go_on.wait(10)
            raise KeyboardInterrupt

    commits = GroupCommit(lambda batch: written.append("w"), sync)
    interrupted: list[BaseException] = []

    def first() -> None:
        try:
            commits.commit(lambda batch: None)
        except KeyboardInterrupt as e:
            interrupted.append(e)

    leader = threading.Thread(target=first)
    leader.start()
    assert in_sync.wait(10)
    follower = threading.Thread(target=commits.commit, args=(lambda batch: None,))
    follower.start()
    while commits.writes < 2:
        threading.Event().wait(0.01)
    go_on.set()
    leader.join(10)
    follower.join(10)
    assert interrupted and not follower.is_alive()
    assert len(syncs) == 2 and written == ["w", "w"]
