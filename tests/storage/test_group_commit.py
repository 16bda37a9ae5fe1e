"""SYNC_WAL writes on the embedded store. Group commit (storage/commits.py): concurrent
writes share one RocksDB write, and a group is stored whole or not at all. The WAL's
fsync (storage/walsync.py): ``os.fdatasync``, which lets the GIL go, on the file that
holds the write, before the write returns."""

from __future__ import annotations

import errno
import os
import threading

import pytest
import rocksdict

from hqueue.config import Durability, QueueInfo
from hqueue.errors import Fenced, StorageError
from hqueue.message import MessageID, encode_rowkey
from hqueue.storage import walsync
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


def test_a_lone_writer_never_waits_for_company(store):
    # Given one thread writing SYNC_WAL batches one after another
    for n in range(200):
        store.write("q", [(rowkey(0, n), b"v")], Durability.SYNC_WAL)
    # Then each went at once, alone
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


def test_a_writer_interrupted_while_it_waits_is_never_written_and_holds_up_nobody(monkeypatch):
    """Ctrl-C in a process holding the store lands in a waiting writer: its fill must leave
    the queue (no leader may write it once its caller holds no lock of the partition), and
    the writes after it must go on."""
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
    # Then later writes go through at once, and the interrupted fill was never written
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


def synced_files(monkeypatch) -> list[tuple[str, bytes]]:
    """Each fdatasync the store makes, as (the file's path, its bytes then)."""
    seen: list[tuple[str, bytes]] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        with open(path, "rb") as f:
            seen.append((path, f.read()))
        real(fd)

    monkeypatch.setattr(walsync.os, "fdatasync", fdatasync)
    return seen


def test_a_sync_wal_write_is_in_the_wal_file_fdatasynced_before_it_returns(store, monkeypatch):
    seen = synced_files(monkeypatch)
    store.write("q", [(rowkey(0, 1), b"payload-one-of-a-kind")], Durability.SYNC_WAL)
    logs = [path for path, data in seen if b"payload-one-of-a-kind" in data]
    assert logs and all(path.endswith(".log") and os.path.dirname(path) == store.path for path in logs)


def test_async_writes_are_not_synced_and_a_sync_wal_write_syncs_them_too(store, monkeypatch):
    seen = synced_files(monkeypatch)
    store.write("q", [(rowkey(0, 1), b"async-one")], Durability.ASYNC_WAL)
    assert seen == []
    store.write("q", [(rowkey(0, 2), b"sync-two")], Durability.SYNC_WAL)
    assert any(b"async-one" in data and b"sync-two" in data for _, data in seen)


def test_a_new_wal_file_is_synced_with_its_directory_and_an_old_one_is_let_go(store, monkeypatch):
    seen = synced_files(monkeypatch)
    store.write("q", [(rowkey(0, 1), b"before")], Durability.SYNC_WAL)
    first = {path for path, _ in seen}
    directory_syncs = store._wal.directory_syncs
    store._db.flush()  # the memtable flushed: RocksDB goes on in a new WAL file
    store.write("q", [(rowkey(0, 2), b"after-the-switch")], Durability.SYNC_WAL)
    # Then the write's new file is synced, and the directory that names it
    newest = [path for path, data in seen if b"after-the-switch" in data]
    assert newest and not set(newest) & first
    assert store._wal.directory_syncs == directory_syncs + 1
    # and a file RocksDB deleted is no longer held open
    kept = {os.readlink(f"/proc/self/fd/{fd}") for fd in store._wal._files.values()}
    assert all(os.path.exists(path) for path in kept)


def test_a_failed_fdatasync_fails_the_write_and_the_store_reopens_before_its_next_use(store, monkeypatch):
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(walsync.os, "fdatasync", failing)
    with pytest.raises(StorageError, match="syncing its WAL failed"):
        store.write("q", [(rowkey(0, 1), b"v")], Durability.SYNC_WAL)
    assert store._failed
    monkeypatch.undo()
    monkeypatch.setattr("hqueue.storage.healing.REOPEN_INTERVAL", 0.0)
    store.write("q", [(rowkey(0, 2), b"v2")], Durability.SYNC_WAL)  # reopened first
    assert not store._failed
    assert [value for _, value in store.scan("q", rowkey(0, 0), rowkey(0, 9))][-1] == b"v2"


def test_no_write_is_acknowledged_after_a_failed_fdatasync_until_the_store_reopens(store, monkeypatch):
    """A descriptor opened after a failed sync is never told of it: a writer that was queued
    behind the failure (past the reopen check) must not be vouched for by a later sync
    (a review found it acknowledged)."""
    calls: list[int] = []

    def failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(walsync.os, "fdatasync", failing_once)
    with pytest.raises(StorageError):
        store.write("q", [(rowkey(0, 1), b"lost")], Durability.SYNC_WAL)
    # A writer queued meanwhile (it passed the reopen check before the failure)
    with pytest.raises(StorageError, match="reopens"):
        store._commit.commit(lambda batch: batch.put(rowkey(0, 2), b"queued"))
    # and the WAL's own syncs refuse until the store is opened again
    with pytest.raises(OSError, match="failed before"):
        store._wal.sync()
    assert len(calls) == 1


def test_a_store_whose_wal_files_are_not_where_it_looks_fails_its_syncs(store, monkeypatch):
    monkeypatch.setattr(store._wal, "path", store.path + "/elsewhere")
    os.makedirs(store._wal.path)
    with pytest.raises(StorageError, match="no WAL file"):
        store.write("q", [(rowkey(0, 1), b"v")], Durability.SYNC_WAL)


def test_other_threads_run_while_a_write_waits_for_its_fsync(store, monkeypatch):
    """The fsync is os.fdatasync's, which lets the GIL go (rocksdict's sync=True held it, and
    every other thread of a server stopped for each fsync: bench/fsync_stall.py)."""
    inside, other_ran = threading.Event(), threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        inside.set()
        assert other_ran.wait(10)
        real(fd)

    monkeypatch.setattr(walsync.os, "fdatasync", fdatasync)
    writer = threading.Thread(target=store.write, args=("q", [(rowkey(0, 1), b"v")], Durability.SYNC_WAL))
    writer.start()
    assert inside.wait(10)
    store.write("q", [(rowkey(1, 1), b"meanwhile")], Durability.ASYNC_WAL)  # the store is not held meanwhile
    other_ran.set()
    writer.join(10)
    assert not writer.is_alive()
    assert len(store.scan("q", rowkey(0, 0), rowkey(0, 9))) == 1


def test_a_thread_that_defers_its_syncs_keeps_the_gil_through_its_fsync(store, monkeypatch):
    """A server's event loop: letting the GIL go for its fsync, it would wait for a busy
    worker to give it back (up to the 5 ms switch interval) while every connection waits
    for it, so its settle is rocksdict's synced write (docs/server.md)."""
    seen = synced_files(monkeypatch)
    done: list[int] = []

    def loop() -> None:
        store.defer_syncs()
        store.write("q", [(rowkey(0, 1), b"v")], Durability.SYNC_WAL)
        store.settle()
        done.append(store._commit.groups)

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(10)
    assert done and seen == []


def stamped(directory, seconds_ago: float) -> None:
    """Give ``directory`` the change stamp a coarse filesystem gives it: ``seconds_ago``."""
    stamp = os.stat(directory).st_mtime - seconds_ago
    os.utime(directory, (stamp, stamp))


def test_a_wal_file_made_within_the_same_coarse_stamp_as_the_last_listing_is_synced(tmp_path):
    """On a filesystem that stamps to the second, a new WAL file can leave the directory's
    stamp as it was: a listing made while the stamp was young is not kept (a review found a
    new WAL never synced with a 0.1 s margin)."""
    (tmp_path / "000004.log").write_bytes(b"old")
    stamped(tmp_path, 1.0)  # changed a second ago, to the filesystem's second
    wal = walsync.WalSync(str(tmp_path))
    wal.sync()
    stamp = os.stat(tmp_path).st_mtime_ns
    (tmp_path / "000010.log").write_bytes(b"new")
    os.utime(tmp_path, ns=(stamp, stamp))  # the same second: the same stamp
    wal.sync()
    assert sorted(wal._files) == ["000004.log", "000010.log"]
    assert wal.directory_syncs == 2


def test_a_listing_is_kept_while_the_directory_is_unchanged_and_dropped_when_the_clock_is_stepped(
    tmp_path, monkeypatch
):
    (tmp_path / "000004.log").write_bytes(b"old")
    stamped(tmp_path, 60.0)
    wal = walsync.WalSync(str(tmp_path))
    wal.sync()
    listings: list[str] = []
    listdir = os.listdir
    monkeypatch.setattr(walsync.os, "listdir", lambda path: listings.append(path) or listdir(path))
    wal.sync()
    assert listings == []  # settled and unchanged: kept
    stamp = os.stat(tmp_path).st_mtime_ns
    (tmp_path / "000010.log").write_bytes(b"new")
    os.utime(tmp_path, ns=(stamp, stamp))  # a change bearing the old stamp after a clock step
    wall = walsync.time.time_ns
    monkeypatch.setattr(walsync.time, "time_ns", lambda: wall() - 3_600 * 10**9)  # stepped back an hour
    wal.sync()
    assert listings and "000010.log" in wal._files


def test_a_write_made_before_the_store_was_opened_again_is_not_vouched_for_after(store):
    """Another thread's failed fsync and the reopen after it can come between a group's
    write and its sync: the reopened store's fresh descriptors were never told of the
    failure, so a sync for a write made before the reopen fails."""
    opened = store._wal.opened
    store._wal.reset()  # what EmbeddedStorage._open does
    with pytest.raises(OSError, match="opened again since the write"):
        store._wal.sync(opened)


def test_an_event_loop_s_writes_before_a_failed_fsync_are_not_acknowledged_after_a_reopen(store, monkeypatch):
    """The loop writes, a worker's fsync fails, a call reopens the store, and the loop's
    settle() syncs the reopened store's WAL: its writes went to the one whose fsync failed,
    so settle() fails (a review found them acknowledged)."""
    errors: list[str] = []  # (not the errors: their frames hold the store's handles open)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    def worker() -> None:
        try:
            store.write("q", [(rowkey(1, 1), b"w2")], Durability.SYNC_WAL)
        except StorageError as e:
            errors.append(str(e))

    def loop() -> None:
        store.defer_syncs()
        store.write("q", [(rowkey(0, 1), b"w1")], Durability.SYNC_WAL)  # its fsync at settle()
        monkeypatch.setattr(walsync.os, "fdatasync", failing)
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
        monkeypatch.undo()
        monkeypatch.setattr("hqueue.storage.healing.REOPEN_INTERVAL", 0.0)
        store.get_meta("x")  # the loop's next call: the store reopens
        try:
            store.settle()
        except StorageError as e:
            errors.append(str(e))

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(20)
    assert len(errors) == 2 and "not acknowledged" in errors[1], errors
