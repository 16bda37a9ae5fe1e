"""Who may end a consumer-group member's leases: the member's own token, or one
that manages the group (admin, or consumer with the group's name granted).

A ``groupLeave`` gives a member's leases back at once; before, any consumer
token on the queue could call it with another token's member name and have
that member's messages handed out again at once. The same held for every call
made as a member: a nack, an extend with a 1 ms lease or a dead-letter sent
the member's messages on, and a receive or heartbeat tied the member to the
caller's connection (it was not found gone when its own closed).
"""

import pytest

from hqueue import HQueue, HQueueAdmin, Message
from hqueue.auth import AuthPolicy
from hqueue.message import encode_rowkey
from hqueue.rpc.wire import T
from hqueue.server import HQueueServer

from ..processes import drain
from .test_hardening import raw_client

ADMIN, WORKER, INTRUDER, MANAGER = (f"{name}-secret-0123456789" for name in ("admin", "worker", "intruder", "manager"))
AUTH_FILE = f"""
[tokens.ops]
secret = "{ADMIN}"
admin = ["*"]

[tokens.worker]
secret = "{WORKER}"
consumer = ["jobs"]

[tokens.intruder]
secret = "{INTRUDER}"
producer = ["jobs"]
consumer = ["jobs"]

[tokens.manager]
secret = "{MANAGER}"
consumer = ["jobs"]
groups = ["billing"]
"""


@pytest.fixture
def server(tmp_path):
    (tmp_path / "auth.toml").write_text(AUTH_FILE)
    server = HQueueServer(f"local://{tmp_path}/data", port=0, auth=AuthPolicy.load(tmp_path / "auth.toml")).start()
    with HQueueAdmin(f"hqueue://{server.address}", token=ADMIN) as admin:
        admin.create_queue("jobs", 1)
    with HQueue("jobs", f"hqueue://{server.address}", token=ADMIN) as queue:
        queue.put([Message("t", b"%d" % i) for i in range(3)], 0)
    yield server
    server.stop()


def leave(server, token: str, member: str) -> None:
    client = raw_client(server.port)
    try:
        client.authenticate(token)
        client.groupLeave("jobs", "billing", member)
    finally:
        client.close()


def others_get(server) -> int:
    """What another member of the group gets now."""
    with HQueue("jobs", f"hqueue://{server.address}", token=WORKER) as queue:
        with queue.consumer("billing", member="other") as other:
            return len(other.receive(10, wait=0.3))


@pytest.fixture
def holding(server):
    """The worker's member "w-1", holding the queue's three messages."""
    with HQueue("jobs", f"hqueue://{server.address}", token=WORKER) as queue:
        with queue.consumer("billing", member="w-1") as consumer:
            assert len(drain(consumer, 3)) == 3
            yield consumer


def test_another_tokens_member_cannot_be_made_to_leave(server, holding):
    # When a consumer token of the queue, not granted the group's name, leaves as the worker's member
    with pytest.raises(T.TNotAuthorized) as refused:
        leave(server, INTRUDER, "w-1")
    # Then it is refused, naming the token, the group and the role needed
    for named in ("'intruder'", "may not end another token's member 'w-1' in group 'billing'", "groups pattern"):
        assert named in refused.value.message
    # and the worker still holds its three: nobody else gets them
    assert others_get(server) == 0


MEMBER_CALLS = {
    "nack": lambda c, receipts: c.groupNack("jobs", "billing", "w-1", receipts, 0),
    "extend": lambda c, receipts: c.groupExtend("jobs", "billing", "w-1", receipts, 1),
    "dead-letter": lambda c, receipts: c.groupDeadLetter("jobs", "billing", "w-1", receipts),
    "receive": lambda c, receipts: c.groupReceive("jobs", "billing", "w-1", 10, 60_000, 0),
    "heartbeat": lambda c, receipts: c.groupHeartbeat("jobs", "billing", "w-1"),
    "ack and receive": lambda c, receipts: c.groupAckReceive("jobs", "billing", "w-1", receipts, 10, 60_000),
}


@pytest.mark.parametrize("call", MEMBER_CALLS)
def test_no_call_is_made_as_another_tokens_member(server, holding, call):
    receipts = b"".join(encode_rowkey(p.partition_id, p.id) for p in holding.queue.pending("billing"))
    client = raw_client(server.port)
    try:
        client.authenticate(INTRUDER)
        with pytest.raises(T.TNotAuthorized, match="another token's member 'w-1' in group 'billing'"):
            MEMBER_CALLS[call](client, receipts)
    finally:
        client.close()
    assert others_get(server) == 0  # the worker still holds its three
    assert {(p.member, p.attempt) for p in holding.queue.pending("billing")} == {("w-1", 1)}


def test_a_member_between_connections_is_still_its_tokens(server):
    """When a member's last connection closed, its token stopped holding it while the member
    lived on for its grace: another token's heartbeat then held it, dead-lettered its messages
    and locked the member itself out (a review)."""
    victim = raw_client(server.port)
    victim.authenticate(WORKER)
    victim.openGroup("jobs", "billing", None, 0, 5, None)
    victim.groupReceive("jobs", "billing", "w-1", 10, 60_000, 0)
    victim.close()  # (a pool closing an idle connection)
    intruder = raw_client(server.port)
    again = raw_client(server.port)
    try:
        intruder.authenticate(INTRUDER)
        with pytest.raises(T.TNotAuthorized, match="another token's member 'w-1'"):
            intruder.groupHeartbeat("jobs", "billing", "w-1")
        again.authenticate(WORKER)
        again.groupHeartbeat("jobs", "billing", "w-1")  # the member itself goes on
    finally:
        intruder.close()
        again.close()


@pytest.mark.parametrize("token", [WORKER, MANAGER, ADMIN], ids=["its-own-token", "groups-pattern", "admin"])
def test_a_member_is_made_to_leave_by_its_own_token_or_the_groups_manager(server, holding, token):
    leave(server, token, "w-1")  # another connection: the token decides
    assert others_get(server) == 3
