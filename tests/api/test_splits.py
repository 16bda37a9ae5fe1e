"""Splits for parallel readers (C11): one per partition, picklable, read anywhere."""

import multiprocessing
import pickle

from hqueue import HQueue, HQueueAdmin, Message, Split
from hqueue.server import HQueueServer


def read_split(split: Split) -> list[tuple]:
    """Runs in a worker process."""
    return [(split.partition_id, i) for batch in split.read(batch_size=7) for i in batch.ids]


def test_splits_of_an_embedded_queue_cover_it_and_honour_range_and_topics(tmp_path):
    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 4)
    with HQueue("q", data_dir=tmp_path) as queue:
        ids = {pid: queue.put([Message("a" if i % 2 else "b", b"%d" % i) for i in range(20)], partition_id=pid)
               for pid in range(4)}  # fmt: skip
        splits = queue.splits()
        assert [s.partition_id for s in splits] == [0, 1, 2, 3] and {s.location for s in splits} == {None}
        read = {s.partition_id: [i for b in s.read(batch_size=6) for i in b.ids] for s in splits}
        assert read == ids
        (two,) = [s for s in queue.splits(start=ids[2][10], topics=["a"]) if s.partition_id == 2]
        assert [m.value for b in two.read() for m in b] == [b"%d" % i for i in range(11, 20, 2)]


def test_splits_name_their_server_pickle_and_are_read_by_other_processes(tmp_path):
    server = HQueueServer(f"local://{tmp_path}/data", port=0).start()
    try:
        url = f"hqueue://{server.address}"
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", 3)
        with HQueue("q", url) as queue:
            written = {(pid, i) for pid in range(3) for i in queue.put([Message("t", b"x")] * 30, partition_id=pid)}
            splits = queue.splits()
        assert {s.location for s in splits} == {server.address}
        assert pickle.loads(pickle.dumps(splits)) == splits
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            read = [row for rows in pool.map(read_split, splits) for row in rows]
        assert len(read) == 90 and set(read) == written
    finally:
        server.stop()


def test_a_split_of_a_queue_made_again_since_says_so(tmp_path):
    """A split read the queue of its name whatever it was: one deleted and made again after
    the split was made had its messages read as the split's."""
    import pytest

    from hqueue import QueueNotFound

    with HQueueAdmin(data_dir=tmp_path) as admin:
        admin.create_queue("q", 1)
        with HQueue("q", data_dir=tmp_path) as queue:
            queue.put(Message("t", b"old"))
            [split] = pickle.loads(pickle.dumps(queue.splits()))
        assert split.created == admin.list_queues()[0].created
        assert [m.value for b in split.read() for m in b] == [b"old"]
        admin.delete_queue("q", force=True)
        admin.create_queue("q", 1)
        with HQueue("q", data_dir=tmp_path) as queue:
            queue.put(Message("t", b"new"))
        with pytest.raises(QueueNotFound, match="deleted and created again"):
            list(split.read())
