"""Consumer groups against a model: random interleavings of put / receive / ack / nack /
lease expiry (/ reopening the store) with 1-3 members, mixed message sizes, a small reply
room (groups.handout.Handout), small limits and dead-lettering: each message is handed out
to one member at a time, never after its ack, never outside the group's topics, each key
in order (key affinity), and at the end every message is acked or dead-lettered exactly
once. (Written by a review of the receive's byte bound; the review also ran it on the
remote and HBase stores. Each of three faults put into the code made it fail.)"""

from __future__ import annotations

import random
import time

import pytest

from hqueue import HQueue, HQueueAdmin, Message, QueueNotFound
from hqueue.api import groups_of
from hqueue.groups.handout import Handout
from hqueue.groups.limits import GroupLimits
from hqueue.groups.service import GroupService

SHORT = 0.3


class Model:
    def __init__(self, rng, affinity, partitions, max_retries):
        self.rng, self.affinity, self.partitions, self.max_retries = rng, affinity, partitions, max_retries
        self.values = {}  # rowkey -> (pid, topic, value)
        self.acked = set()
        self.holder = {}  # rowkey -> (member, deadline, delivery)
        self.failures = {}
        self.log = []
        self.n = 0
        self.topics = None

    def new_messages(self, queue):
        for _ in range(self.rng.randint(1, 3)):
            kind = self.rng.random()
            size = (
                self.rng.randint(5, 50)
                if kind < 0.5
                else self.rng.randint(2_000, 20_000)
                if kind < 0.85
                else self.rng.randint(40_000, 150_000)
            )
            pid = self.rng.randrange(self.partitions)
            topic = self.rng.choice(["a", "b", "c"])
            value = b"%06d" % self.n + b"x" * size
            self.n += 1
            queue.put(Message(topic, value), pid)
            self.log.append(("put", value[:6], pid, topic, size))
            if self.topics is not None and topic not in self.topics:
                self.log[-1] = ("put-filtered", value[:6], pid, topic, size)

    def delivered(self, member, got, lease):
        now = time.monotonic()
        for d in got:
            rk = d.rowkey
            tag = d.value[:6]
            assert self.topics is None or str(d.topic) in self.topics, f"{tag} of topic {d.topic} passed the filter"
            assert rk not in self.acked, f"{tag} delivered to {member} after its ack\n{self.log[-30:]}"
            held = self.holder.get(rk)
            if held is not None:
                assert held[1] - 0.05 <= now, f"{tag} delivered to {member} while {held[0]} holds it\n{self.log[-30:]}"
            if self.affinity is not None:
                key = (d.partition_id, d.topic if self.affinity == "topic" else None)
                for other, (pid, topic, _v) in self.values.items():
                    if other >= rk or other in self.acked:
                        continue
                    if (pid, topic if self.affinity == "topic" else None) != key:
                        continue
                    h = self.holder.get(other)
                    assert h is not None and h[0] == member and h[1] > now, (
                        f"{tag} (key {key}) to {member} before earlier {self.values[other][2][:6]} held by {h and h[0]}"
                        f"\n{self.log[-30:]}"
                    )
            self.holder[rk] = (member, now + lease, d)
            self.values.setdefault(rk, (d.partition_id, str(d.topic), d.value))
        self.log.append(("recv", member, [d.value[:6] for d in got], lease))

    def held_by(self, member):
        now = time.monotonic()
        return [h[2] for h in self.holder.values() if h[0] == member and h[1] > now + 1.0]


def run(queue, members, rng, affinity, partitions, max_retries, steps, restart=None, topics=None):
    model = Model(rng, affinity, partitions, max_retries)
    model.topics = topics
    names = list(members)
    for _ in range(steps):
        op = rng.random()
        name = rng.choice(names)
        member = members[name]
        if op < 0.25:
            model.new_messages(queue)
        elif op < 0.55:
            n = rng.choice([1, 2, 3, 7, 10_000])
            lease = SHORT if rng.random() < 0.1 else 30.0
            got = member.receive(n, wait=0, lease=lease)
            assert len(got) <= n
            model.delivered(name, got, lease)
        elif op < 0.75:
            held = model.held_by(name)
            part = rng.sample(held, rng.randint(0, len(held)))
            if part:
                assert member.ack(part) == len(part), model.log[-20:]
                for d in part:
                    model.acked.add(d.rowkey)
                    model.holder.pop(d.rowkey)
                model.log.append(("ack", name, [d.value[:6] for d in part]))
        elif op < 0.9:
            held = model.held_by(name)
            part = rng.sample(held, rng.randint(0, min(3, len(held))))
            if part:
                assert member.nack(part, delay=0) == len(part), model.log[-20:]
                for d in part:
                    model.holder.pop(d.rowkey)
                model.log.append(("nack", name, [d.value[:6] for d in part]))
        elif op < 0.95:
            time.sleep(SHORT + 0.05)
            model.log.append(("sleep",))
        elif restart is not None:
            queue, members = restart(queue, members)
            model.holder.clear()
            model.log.append(("restart",))
    # Drain: everything comes, each once
    for name, member in members.items():
        held = model.held_by(name)
        if held:
            assert member.ack(held) == len(held)
            for d in held:
                model.acked.add(d.rowkey)
                model.holder.pop(d.rowkey)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = True
        for name, member in members.items():
            got = member.receive(10_000, wait=0, lease=30.0)
            model.delivered(name, got, 30.0)
            if got:
                done = False
                assert member.ack(got) == len(got)
                for d in got:
                    model.acked.add(d.rowkey)
                    model.holder.pop(d.rowkey)
        if done:
            if not [h for h in model.holder.values()]:
                break
            # short leases still out, or nacked ones in backoff
            time.sleep(0.1)
            model.holder = {k: v for k, v in model.holder.items() if v[1] > time.monotonic()}
    try:
        with HQueue(queue.name + ".dlq", queue.url) as dlq:
            dead = [m.value[:6] for m in dlq.scan()]
    except QueueNotFound:
        dead = []
    want = sorted(v[2][:6] for v in _all_puts(model))
    acked = sorted(model.values[rk][2][:6] for rk in model.acked)
    assert len(set(dead)) == len(dead), "dead-lettered twice"
    assert not set(dead) & set(acked), "acked and dead-lettered"
    assert sorted(acked + dead) == want, f"missing {sorted(set(want) - set(acked) - set(dead))[:10]}\n{model.log[-40:]}"
    for member in members.values():
        assert member.receive(10_000, wait=0) == []
    return queue, members


def _all_puts(model):
    return [(None, None, e[1]) for e in model.log if e[0] == "put"]


STORES = ["local", "memory"]


@pytest.fixture(params=STORES)
def make_queue(request, tmp_path):
    """make_queue(partitions, **kw) -> an open HQueue on a new queue of an embedded or memory store."""
    url = f"local://{tmp_path}/data" if request.param == "local" else f"memory://model-{tmp_path.name}"
    opened: list[HQueue] = []

    def make(partitions: int, **kwargs) -> HQueue:
        with HQueueAdmin(url) as admin:
            admin.create_queue("q", partitions, 0, **kwargs)
        queue = HQueue("q", url)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("affinity", [None, "partition", "topic"])
def test_model(make_queue, seed, affinity, monkeypatch):
    rng = random.Random(seed * 7 + [None, "partition", "topic"].index(affinity))
    monkeypatch.setattr(Handout.__init__, "__defaults__", (rng.choice([1, 30_000, 100_000, 300_000]),))
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", rng.choice([2, 5, 10_000]))
    partitions = rng.choice([1, 1, 2])
    queue = make_queue(partitions=partitions, max_message_bytes=1 << 20)
    groups = groups_of(queue.engine)
    if isinstance(groups, GroupService):
        groups.limits = GroupLimits(max_member_in_flight=rng.choice([3, 8, 1000]), max_span=rng.choice([4, 10, 2000]))
    max_retries = 100 if affinity else rng.choice([1, 3, 100])
    members = {}
    for i in range(rng.choice([1, 2, 3])):
        members[f"m{i}"] = queue.consumer("g", key_affinity=affinity, member=f"m{i}", max_retries=max_retries)
    try:
        run(queue, members, rng, affinity, partitions, max_retries, steps=100)
    finally:
        for m in members.values():
            m.close()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("affinity", [None, "partition", "topic"])
def test_model_with_restarts(tmp_path, seed, affinity, monkeypatch):
    """Embedded store, reopened now and then: acks above the cursor come back as state.acked."""
    rng = random.Random(1000 + seed)
    monkeypatch.setattr(Handout.__init__, "__defaults__", (rng.choice([1, 30_000, 100_000]),))
    # the completion cursor jumps past unfinished messages after this many acks ahead of it
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", rng.choice([2, 5, 10_000]))
    url = "local://" + str(tmp_path / "data")
    partitions = rng.choice([1, 2])
    with HQueueAdmin(url) as admin:
        admin.create_queue("q", partitions, 0, max_message_bytes=1 << 20)
    max_retries = 100 if affinity else rng.choice([1, 3, 100])
    limits = GroupLimits(max_member_in_flight=rng.choice([3, 8, 1000]), max_span=rng.choice([4, 10, 2000]))
    count = rng.choice([1, 2, 3])

    def open_all():
        queue = HQueue("q", url)
        groups = groups_of(queue.engine)
        if isinstance(groups, GroupService):
            groups.limits = limits
        return queue, {
            f"m{i}": queue.consumer("g", key_affinity=affinity, member=f"m{i}", max_retries=max_retries)
            for i in range(count)
        }

    def restart(queue, members):
        for m in members.values():
            m.close()
        queue.close()
        return open_all()

    queue, members = open_all()
    try:
        queue, members = run(queue, members, rng, affinity, partitions, max_retries, steps=100, restart=restart)
    finally:
        for m in members.values():
            m.close()
        queue.close()


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("affinity", [None, "topic"])
def test_model_with_topic_filter(make_queue, seed, affinity, monkeypatch):
    rng = random.Random(5000 + seed)
    monkeypatch.setattr(Handout.__init__, "__defaults__", (rng.choice([1, 30_000, 100_000]),))
    monkeypatch.setattr("hqueue.groups.acks.MAX_ACKED_AHEAD", rng.choice([2, 5, 10_000]))
    partitions = rng.choice([1, 2])
    topic_index = rng.random() < 0.5
    queue = make_queue(partitions=partitions, max_message_bytes=1 << 20, topic_index=topic_index)
    groups = groups_of(queue.engine)
    if isinstance(groups, GroupService):
        groups.limits = GroupLimits(max_member_in_flight=rng.choice([3, 8, 1000]), max_span=rng.choice([4, 10, 2000]))
    topics = {"a", "c"}
    members = {
        f"m{i}": queue.consumer("g", sorted(topics), key_affinity=affinity, member=f"m{i}", max_retries=100)
        for i in range(rng.choice([1, 2, 3]))
    }
    try:
        run(queue, members, rng, affinity, partitions, 100, steps=100, topics=topics)
    finally:
        for m in members.values():
            m.close()
