"""HQueueAdmin: create, truncate, disable/enable, drop, list, describe, TTL."""

import time

import pytest

from hqueue import (
    Durability,
    HQueue,
    HQueueAdmin,
    InvalidArgument,
    InvalidQueueName,
    Message,
    MessageID,
    QueueEnabled,
    QueueExists,
    QueueNotFound,
)
from hqueue.storage import base as storage_base


def test_create_list_and_describe(admin, queue_name):
    info = admin.create_queue(queue_name, 32, 86400, {"hbase.hqueue.partitionsPerRegion": "4"})
    assert (info.partitions, info.ttl, info.enabled, info.partitions_per_region) == (32, 86400, True, 4)
    assert [q.name for q in admin.list_queues()] == [queue_name]
    description = admin.describe_queue(queue_name)
    assert description["partitions"] == 32 and description["state"] == "ENABLED"
    assert description["last_ids"] == {pid: None for pid in range(32)}


def test_create_returns_the_definition_as_stored_and_hqueue_created_is_hqueue_s(admin, queue_name):
    """create_queue returned what it was given, without what the store adds (its created);
    a config naming hqueue.created had it replaced, silently (an attacker's probe)."""
    with pytest.raises(InvalidArgument, match="hqueue.created is set by hqueue"):
        admin.create_queue(queue_name, 1, config={"hqueue.created": "forged"})
    assert not admin.queue_exists(queue_name)
    info = admin.create_queue(queue_name, 1, topic_index=True)
    assert info.created and info == admin.list_queues()[0]
    assert admin.describe_queue(queue_name)["config"]["hqueue.created"] == info.created


def test_describe_reports_last_ids_and_a_count_estimate(admin, make_queue):
    queue = make_queue(partitions=2)
    ids = queue.put([Message("t", b"x")] * 3, partition_id=1)
    description = admin.describe_queue(queue.name)
    assert description["last_ids"] == {0: None, 1: ids[-1]}
    estimate = description["message_count_estimate"]
    assert estimate is None or estimate >= 0  # None: the backend cannot count cheaply (HBase)


def test_create_rejects_duplicates_and_bad_arguments(admin, queue_name):
    admin.create_queue(queue_name, 1)
    with pytest.raises(QueueExists):
        admin.create_queue(queue_name, 1)
    for bad in ["", "has space", "-dash", "a" * 201, "é"]:
        with pytest.raises(InvalidQueueName):
            admin.create_queue(bad, 1)
    with pytest.raises(TypeError, match="'name'"):
        admin.create_queue(7, 1)
    for partitions in [0, 32768]:
        with pytest.raises(ValueError, match="'partitions'"):
            admin.create_queue("ok_name", partitions)
    with pytest.raises(ValueError, match="'ttl'"):
        admin.create_queue("ok_name", 1, -1)
    with pytest.raises(ValueError, match="'durability'"):
        admin.create_queue("ok_name", 1, durability="FSYNC_SOMETIMES")
    with pytest.raises(TypeError, match="'config'"):
        admin.create_queue("ok_name", 1, config={"a": 1})
    for config in ({"k": "\udcff"}, {"\udcfe": "v"}):  # bytes that are not UTF-8, read as text
        with pytest.raises(InvalidArgument, match="not valid UTF-8"):
            admin.create_queue("ok_name", 1, config=config)
    # (topic_index="false" made an indexed queue; priorities True or "2" were taken; and
    # topic_index=True silently beat the config's hqueue.topicIndex=false: an attacker's pass)
    for wrong, error in (
        ({"topic_index": "false"}, TypeError),
        ({"priorities": True}, TypeError),
        ({"priorities": "2"}, TypeError),
        ({"topic_index": True, "config": {"hqueue.topicIndex": "false"}}, InvalidArgument),
    ):
        with pytest.raises(error, match=next(iter(wrong))):
            admin.create_queue("ok_name", 2, **wrong)
    assert not admin.queue_exists("ok_name")
    assert admin.list_queues()  # (a definition stored so broke every client's list)


def test_a_definition_stored_before_config_was_checked_is_listed_with_its_bytes_escaped(tmp_path):
    """A config text read from bytes that are not UTF-8 was stored before create_queue
    refused it; no server could then send the definition, and every client's list failed."""
    from hqueue.config import QueueInfo
    from hqueue.server import HQueueServer
    from hqueue.storage.embedded import EmbeddedStorage

    storage = EmbeddedStorage(str(tmp_path / "data"))
    storage.create_queue(QueueInfo("old", 1, config={"k\udcfe": "v\udcff", "fine": "é"}))
    storage.close()
    server = HQueueServer("local://" + str(tmp_path / "data"), port=0).start()
    try:
        with HQueueAdmin(f"hqueue://{server.address}") as admin:
            [info] = admin.list_queues()
            assert info.config == {"k\\xfe": "v\\xff", "fine": "é"}
            with HQueue("old", f"hqueue://{server.address}") as queue:
                queue.put([Message("t", b"x")])
    finally:
        server.stop()


def test_a_queue_name_leaves_room_for_its_dead_letter_queue(admin, queue_name):
    longest = queue_name + "x" * (196 - len(queue_name))
    with pytest.raises(InvalidQueueName, match=r"<name>\.dlq"):
        admin.create_queue(longest + "y", 1)  # 197 characters: 'NAME.dlq' would be 201
    assert not admin.queue_exists(longest + "y")
    admin.create_queue(longest, 1)
    admin.create_queue(longest + ".dlq", 1)  # its dead-letter queue, as dead-lettering makes it: 200
    assert admin.queue_exists(longest + ".dlq")


def test_truncate_deletes_messages_keeps_partitions_and_ids_never_go_back(admin, make_queue, api_url):
    queue = make_queue(partitions=3)
    before = queue.put([Message("t", b"x")] * 100, partition_id=2)
    admin.truncate_queue(queue.name)
    assert list(queue.scan()) == []
    assert admin.describe_queue(queue.name)["partitions"] == 3
    after = queue.put(Message("t", b"y"), partition_id=2)
    assert after[0] > before[-1]
    # and a fresh process (a new handle after the store is closed) keeps the floor too
    queue.close()
    admin.close()
    with HQueueAdmin(api_url) as again, HQueue(queue.name, api_url) as reopened:
        assert reopened.put(Message("t", b"z"), partition_id=0)[0] > before[-1]
        assert again.queue_exists(queue.name)


def test_drop_requires_disabled_like_hbase(admin, make_queue):
    queue = make_queue()
    with pytest.raises(QueueEnabled, match="disabled"):
        admin.delete_queue(queue.name)
    admin.disable_queue(queue.name)
    admin.delete_queue(queue.name)
    assert not admin.queue_exists(queue.name)
    with pytest.raises(QueueNotFound):
        admin.delete_queue(queue.name)


def test_drop_force_and_recreate_starts_empty(admin, make_queue, api_url):
    queue = make_queue(partitions=2)
    queue.put(Message("t", b"x"))
    admin.delete_queue(queue.name, force=True)
    admin.create_queue(queue.name, 5)
    with HQueue(queue.name, api_url) as recreated:
        assert recreated.partitions == 5 and list(recreated.scan()) == []


def test_a_forced_delete_deletes_a_queue_another_client_enables_as_it_runs(admin, make_queue, api_url, monkeypatch):
    """Another client enabled the queue (or made it again) between a forced delete's
    disable and its delete: it raised QueueEnabled, "must be disabled before it can be
    dropped", though forced (an attacker's pass). It disables it again and deletes it."""
    queue = make_queue(partitions=1)
    delete, calls = admin.engine.delete_queue, []

    def enabled_first(name: str) -> None:
        calls.append(name)
        if len(calls) == 1:
            with HQueueAdmin(api_url) as other:
                other.enable_queue(name)
        delete(name)

    monkeypatch.setattr(admin.engine, "delete_queue", enabled_first)
    admin.delete_queue(queue.name, force=True)
    assert len(calls) == 2 and not admin.queue_exists(queue.name)


def test_unknown_queues_are_queue_not_found(admin):
    for call in (admin.truncate_queue, admin.disable_queue, admin.enable_queue, admin.describe_queue):
        with pytest.raises(QueueNotFound):
            call("missing")


def test_expired_messages_are_invisible_and_reclaimed(admin, make_queue, monkeypatch):
    queue = make_queue(partitions=2, ttl=1)
    queue.put([Message("t", b"old")] * 10, partition_id=0)
    time.sleep(1.1)
    new = queue.put(Message("t", b"new"), partition_id=1)[0]
    assert [m.value for m in queue.scan()] == [b"new"]
    storage = getattr(queue.engine, "storage", None)
    if storage is None:
        return  # remote: the server's store reclaims on its own schedule
    # The TTL's clock stops half a second after "new" was put: a reclaim that takes
    # long on a busy machine must not see "new" expire (it lives 1 s) before the scan.
    monkeypatch.setattr(storage_base, "wall_clock_ms", lambda: new.timestamp + 500)
    storage.reclaim_expired(queue.name)
    # reclaimed: even a raw read below the TTL floor finds nothing in partition 0
    assert storage.last_rowkey(queue.name, 0) is None
    assert [m.value for m in queue.scan()] == [b"new"]


def test_metadata_and_messages_survive_reopening(api_url, queue_name):
    with HQueueAdmin(api_url) as admin:
        admin.create_queue(queue_name, 4, 0, durability=Durability.ASYNC_WAL)
        admin.disable_queue(queue_name)
        admin.enable_queue(queue_name)
        with HQueue(queue_name, api_url) as queue:
            ids = queue.put([Message("t", b"%d" % i) for i in range(10)], partition_id=3)
    with HQueueAdmin(api_url) as admin, HQueue(queue_name, api_url) as queue:
        info = admin.describe_queue(queue_name)
        assert (info["durability"], info["state"], info["last_ids"][3]) == ("ASYNC_WAL", "ENABLED", ids[-1])
        assert [m.id for m in queue.scan()] == ids
        assert queue.put(Message("t", b"next"), partition_id=3)[0] > ids[-1]
        assert isinstance(ids[0], MessageID)
