"""Remote operations, each declared once: the service method it runs, the IDL
call that carries it, who may call it, and how each argument and the result
go on the wire.

The remote client's method (``client/calls.py``: ``remote(op)``) and the
server's handler (``server/calls.py``: ``handler(op)``) are both made from
the declaration, so adding an operation that one service serves is: its
service code, one declaration here, one IDL entry, and one line on each
side. Calls that route by partition or by receipt (puts, receive, ack) are
written by hand beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..auth import MANAGE
from ..errors import GroupNotFound, InvalidArgument
from . import wire

T = wire.T


def same(value: Any) -> Any:
    return value


def _topics_out(topics: Any) -> Any:
    return sorted(topics) if topics is not None else None


def _topics_in(topics: Any) -> Any:
    return frozenset(topics) if topics else None  # (empty: unset, as UNSET_IF_EMPTY)


@dataclass(frozen=True)
class Codec:
    """How one value goes on the wire (``out``: Python to Thrift) and back (``back``)."""

    out: Callable[[Any], Any] = same
    back: Callable[[Any], Any] = same


PLAIN = Codec()
#: An optional argument whose empty or zero value means unset: Apache Thrift's compilers ignore
#: ``optional`` in argument lists, so their C++ and Go clients send "" or 0 for one left out.
UNSET_IF_EMPTY = Codec(same, lambda value: value or None)


def _dead_letter_after_out(value: Any) -> Any:
    """A count that must be 1 or more, or None, going out: 0 is refused here as in process
    (on the wire it would read as unset)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidArgument(f"'dead_letter_after' must be an int >= 1 or None, got {value!r}")
    return value


#: As UNSET_IF_EMPTY, for a count: hqueue's client refuses 0 rather than send it as unset.
COUNT_OR_UNSET = Codec(_dead_letter_after_out, UNSET_IF_EMPTY.back)
TOPICS = Codec(_topics_out, _topics_in)
#: An optional flag: unset (an older client's) is False.
FLAG = Codec(lambda value: True if value else None, bool)
ID = Codec(wire.to_tid, wire.from_tid)
PARTITION_OR_ALL = Codec(lambda pid: -1 if pid is None else pid, lambda pid: None if pid == -1 else pid)
NAMES = Codec(same, list)
NOTHING = Codec(lambda _: None, lambda _: None)
PUSH_KEY = Codec(
    lambda push: None if push is None else wire.to_tpush_key(push),
    lambda t: None if t is None else wire.from_tpush_key(t),
)


@dataclass(frozen=True)
class Arg:
    """One argument of the service method (in Python order)."""

    name: str
    codec: Codec = PLAIN
    default: Any = ...


@dataclass(frozen=True)
class Operation:
    """One remote operation.

    Attributes:
        service: The engine's service that runs it (``groups``, ``subscriptions``).
        method: The service's method.
        thrift: The IDL call.
        role: What the caller's token must hold on the queue (``connected``: no queue;
            ``manage``: admin, or consumer and the group's or subscriber's name, see
            :mod:`hqueue.auth`).
        args: The method's arguments, in Python order.
        wire_order: The IDL's argument order, where it is not the Python one
            (HQueue's seed calls put the subscriber first).
        result: How the answer goes on the wire.
        merge: None: any server answers. Otherwise each partition owner answers
            for its partitions, and ``merge(answers, **args)`` joins the answers.
        absent: With ``merge``: the errors of an owner that had nothing to do (its
            answer is left out of the merge; the merge says what none answering means).
    """

    service: str
    method: str
    thrift: str
    role: str
    args: tuple[Arg, ...]
    wire_order: tuple[str, ...] | None = None
    result: Codec = NOTHING
    merge: Callable[..., Any] | None = None
    absent: tuple[type[Exception], ...] = ()

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A Python call's arguments by name, with the declared defaults."""
        if len(args) > len(self.args):
            raise TypeError(f"{self.method}() takes {len(self.args)} arguments, got {len(args)}")
        names = [a.name for a in self.args]
        bound = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{self.method}() got an unexpected keyword argument {name!r}")
            if name in bound:
                raise TypeError(f"{self.method}() got multiple values for argument {name!r}")
            bound[name] = value
        for arg in self.args:
            if arg.name not in bound:
                if arg.default is ...:
                    raise TypeError(f"{self.method}() needs {arg.name!r}")
                bound[arg.name] = arg.default
        return bound

    def to_wire(self, bound: dict[str, Any]) -> list[Any]:
        """The IDL call's arguments, in its order."""
        codecs = {a.name: a.codec for a in self.args}
        return [codecs[name].out(bound[name]) for name in self.wire_order or [a.name for a in self.args]]

    def from_wire(self, wire_args: tuple[Any, ...]) -> list[Any]:
        """The service method's arguments, in Python order, from the IDL call's."""
        order = self.wire_order or [a.name for a in self.args]
        by_name = dict(zip(order, wire_args, strict=True))
        return [a.codec.back(by_name[a.name]) for a in self.args]

    @property
    def queue_at(self) -> int | None:
        """Where the queue is among the IDL call's arguments (None: no queue)."""
        order = list(self.wire_order or [a.name for a in self.args])
        return order.index("queue") if "queue" in order else None

    @property
    def named_at(self) -> tuple[int, str] | None:
        """Where the group or subscriber name is among the IDL call's arguments, and
        which of the two it names (None: neither)."""
        order = list(self.wire_order or [a.name for a in self.args])
        for arg, kind in (("group", "group"), ("name", "subscriber")):
            if arg in order:
                return order.index(arg), kind
        return None


# -- push subscriptions (SPEC C7) -------------------------------------------------------------------


def _starts_out(starts: dict[int, Any] | None) -> Any:
    if starts is None:
        return None
    return [
        T.TPartitionStart(partitionID=pid, startID=wire.to_tid(start) if start else None)
        for pid, start in sorted(starts.items())
    ]


def _starts_in(given: Any) -> Any:
    if given is None:
        return None
    return {p.partitionID: wire.from_tid(p.startID) if p.startID else None for p in given}


def _subscriber_out(d: dict[str, Any]) -> Any:
    return T.TSubscriberInfo(
        name=d["name"],
        queue=d["queue"],
        topics=_topics_out(d["topics"]),
        partitions=sorted(d["partitions"]) if d["partitions"] is not None else None,
        checkpoints={p: wire.to_tid(i) for p, i in d["checkpoints"].items()},
        address=d["address"] or "",
        lagMessages=d["lag_messages"],
        lagMillis=d["lag_millis"],
    )


def _subscriber_in(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "queue": t.queue,
        "address": t.address or None,
        "topics": _topics_in(t.topics),
        "partitions": frozenset(t.partitions) if t.partitions is not None else None,
        "checkpoints": {p: wire.from_tid(i) for p, i in (t.checkpoints or {}).items()},
        "lag_messages": dict(t.lagMessages or {}),
        "lag_millis": dict(t.lagMillis or {}),
    }


QUEUE, NAME = Arg("queue"), Arg("name")
STARTS = Arg("starts", Codec(_starts_out, _starts_in))
SUBSCRIPTIONS = "subscriptions"

ADD_SUBSCRIBER = Operation(
    SUBSCRIPTIONS, "add", "addSubscriber", MANAGE,
    (QUEUE, NAME, Arg("topics", TOPICS), STARTS, Arg("dead_letter_after", COUNT_OR_UNSET, default=None),
     Arg("create_only", FLAG, default=False)),
)  # fmt: skip
DELETE_SUBSCRIBER = Operation(SUBSCRIPTIONS, "delete", "deleteSubscriber", MANAGE, (QUEUE, NAME), ("name", "queue"))
LIST_SUBSCRIBERS = Operation(SUBSCRIPTIONS, "names", "listSubscribers", "consumer", (QUEUE,), result=NAMES)
DESCRIBE_SUBSCRIBER = Operation(
    SUBSCRIPTIONS, "describe", "describeSubscriber", "consumer", (QUEUE, NAME), ("name", "queue"),
    result=Codec(_subscriber_out, _subscriber_in),
)  # fmt: skip
SET_CHECKPOINT = Operation(
    SUBSCRIPTIONS, "set_checkpoint", "setCheckpoint", MANAGE,
    (QUEUE, NAME, Arg("partition_id", PARTITION_OR_ALL), Arg("start", ID)),
)  # fmt: skip
# The consumer role only: how subscribers announce themselves (an older server named ZooKeeper's hosts).
GET_COORDINATION = Operation(SUBSCRIPTIONS, "coordination", "getCoordination", "consumer", (QUEUE,), result=PLAIN)
SUBSCRIBER_LEAVE = Operation(
    SUBSCRIPTIONS, "leave", "subscriberLeave", MANAGE, (QUEUE, NAME, Arg("push", PUSH_KEY, None))
)


# -- consumer groups (SPEC X3) -----------------------------------------------------------------------


def _group_out(d: dict[str, Any]) -> Any:
    partitions = {
        pid: T.TGroupPartition(
            done=wire.to_tid(p["done"]), scan=wire.to_tid(p["scan"]), inFlight=p["in_flight"],
            retrying=p["retrying"], ackedAhead=p["acked_ahead"], retries=p["retries"],
            lagMessages=p["lag_messages"], lagMillis=p["lag_millis"], deadLetterWaiting=p["dead_letter_waiting"],
            heldBack=p["held_back"], deadLettered=p["dead_lettered"],
        )
        for pid, p in d["partitions"].items()
    }  # fmt: skip
    return T.TGroupInfo(
        queue=d["queue"], group=d["group"], topics=_topics_out(d["topics"]), startMillis=d["start"],
        maxRetries=d["max_retries"], members=d["members"], partitions=partitions, deadLetters=d["dead_letters"],
        keyAffinity=d["key_affinity"],
    )  # fmt: skip


def _group_in(t: Any) -> dict[str, Any]:
    partitions = {
        pid: {
            "done": wire.from_tid(p.done), "scan": wire.from_tid(p.scan), "in_flight": p.inFlight,
            "retrying": p.retrying, "acked_ahead": p.ackedAhead, "retries": p.retries,
            "lag_messages": p.lagMessages, "lag_millis": p.lagMillis,
            "dead_letter_waiting": p.deadLetterWaiting or 0, "held_back": p.heldBack or 0,
            "dead_lettered": p.deadLettered or 0,
        }
        for pid, p in (t.partitions or {}).items()
    }  # fmt: skip
    return {
        "queue": t.queue, "group": t.group, "topics": _topics_in(t.topics), "start": t.startMillis,
        "max_retries": t.maxRetries, "dead_letters": t.deadLetters, "members": list(t.members or []),
        "key_affinity": t.keyAffinity,
        "partitions": partitions,
    }  # fmt: skip


def _merge_groups(answers: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
    """Each owner's part of a description: every partition once, members as any owner sees them."""
    merged = dict(answers[-1]) if answers else {}
    merged["members"] = sorted({m for a in answers for m in a["members"]})
    merged["partitions"] = dict(sorted(p for a in answers for p in a["partitions"].items()))
    return merged


def _seconds_out(value: float | None) -> int:
    return -1 if value is None else int(value * 1000)


def _pending_out(found: list[dict[str, Any]]) -> list[Any]:
    return [
        T.TPending(
            partitionID=p["partition"], id=wire.to_tid(p["id"]), member=p["member"] or "", attempt=p["attempt"],
            leaseLeftMillis=_seconds_out(p["lease_left"]), retryInMillis=_seconds_out(p["retry_in"]),
        )
        for p in found
    ]  # fmt: skip


def _pending_in(found: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "partition": t.partitionID, "id": wire.from_tid(t.id), "member": t.member or None, "attempt": t.attempt,
            "lease_left": None if t.leaseLeftMillis < 0 else t.leaseLeftMillis / 1000,
            "retry_in": None if t.retryInMillis < 0 else t.retryInMillis / 1000,
        }
        for t in found
    ]  # fmt: skip


def _merge_pending(answers: list[list[dict[str, Any]]], limit: int = 1000, **_: Any) -> list[dict[str, Any]]:
    """Each owner's messages in flight, in (partition, ID) order."""
    found = sorted((p for a in answers for p in a), key=lambda p: (p["partition"], p["id"]))
    return found[:limit]


GROUPS = "groups"
GROUP = Arg("group")

OPEN_GROUP = Operation(
    GROUPS, "open", "openGroup", "consumer",
    (QUEUE, GROUP, Arg("topics", TOPICS), Arg("start"), Arg("max_retries"),
     Arg("key_affinity", UNSET_IF_EMPTY, default=None)),
)  # fmt: skip
LIST_GROUPS = Operation(GROUPS, "names", "listGroups", "consumer", (QUEUE,), result=NAMES)
DESCRIBE_GROUP = Operation(
    GROUPS, "describe", "describeGroup", "consumer", (QUEUE, GROUP),
    result=Codec(_group_out, _group_in), merge=_merge_groups,
)  # fmt: skip
GROUP_PENDING = Operation(
    GROUPS, "pending", "groupPending", "consumer", (QUEUE, GROUP, Arg("limit", default=1000)),
    result=Codec(_pending_out, _pending_in), merge=_merge_pending,
)  # fmt: skip


def _deleted(answers: list[None], queue: str, group: str) -> None:
    """Each owner forgot what it held of the group (one server alone left the others writing
    its progress back). The first removes its key, so the later ones may not find it."""
    if not answers:
        raise GroupNotFound(queue, group)


DELETE_GROUP = Operation(
    GROUPS, "delete", "deleteGroup", MANAGE, (QUEUE, GROUP), merge=_deleted, absent=(GroupNotFound,)
)  # fmt: skip
