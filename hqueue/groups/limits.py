"""What a consumer group takes from its members, and what a member may ask (SPEC X3):
the server's limits (:class:`GroupLimits`), their defaults, and the checks of a
member's arguments. Nothing here holds state (state.py) or reads the store."""

from __future__ import annotations

from dataclasses import dataclass

from ..backoff import doubled
from ..checks import check_name
from ..errors import InvalidArgument

DEFAULT_LEASE = 30.0
DEFAULT_MAX_RETRIES = 16
#: Messages handed out and not acked, per (group, partition), before the partition waits
#: (Kafka's share groups lock at most 2,000 records per partition).
DEFAULT_MAX_SPAN = 2_000
#: The longest lease (and nack delay) a member gets, whatever it asks (a gone member's
#: leases end sooner: see ``member_timeout``): Kafka's share groups lock a record at most
#: 60 s; a member still working renews its lease (``extend``), as the Processor does.
DEFAULT_MAX_LEASE = 60.0
#: Messages one member may hold (leased, not acked) per group on one server (NATS's MaxAckPending).
DEFAULT_MAX_MEMBER_IN_FLIGHT = 1_000
#: Consumer groups per queue: each holds state and metrics series on every partition, and a
#: consumer token may make them (5,000 on 16 partitions took a server about 180 MiB).
DEFAULT_MAX_GROUPS = 1_000
#: The longest lease or nack delay a member may ask for (it gets at most ``max_lease``).
ASKED_LEASE_LIMIT = 86400 * 7
#: A member that has not called receive for this long is left out of the partitions' assignment;
#: one that has made no call at all (receive, heartbeat) for this long is gone: its leases end.
MEMBER_TIMEOUT = 10.0
#: The shortest member timeout a server takes: members heartbeat every HEARTBEAT_INTERVAL.
MIN_MEMBER_TIMEOUT, HEARTBEAT_INTERVAL = 3.0, 1.0
#: A batch a member asked for ahead (prefetch) whose leases have run this share of their
#: time when a receive comes for it goes back unseen: none is handed out with less than 3/4.
PREFETCH_STALE_SHARE = 0.25
#: Seconds a closing member waits for the answer to the batch it asked ahead before it
#: leaves anyway (a paused server: its whole timeout left the leave none).
PREFETCH_CLOSE_WAIT = 1.0
#: The backoff of a nack without a delay: 1 s, doubling per retry, at most 10 minutes.
BACKOFF_BASE, BACKOFF_MAX = 1.0, 600.0


#: The longest a receive waits for its first message (s).
MAX_WAIT = 300


def check_lease(lease: object) -> float:
    """A lease a member asks for: seconds in (0, ASKED_LEASE_LIMIT]."""
    if not isinstance(lease, (int, float)) or isinstance(lease, bool) or not 0 < lease <= ASKED_LEASE_LIMIT:
        raise InvalidArgument(f"'lease' must be seconds in (0, {ASKED_LEASE_LIMIT}], got {lease!r}")
    return lease


#: The longest member name (each lease, pending row and description repeats it).
MAX_MEMBER_NAME = 200


def check_member(member: object) -> str:
    """A member's name: a non-empty string of at most MAX_MEMBER_NAME characters (a 1 MiB
    name made a 1,000 MiB pending list of 1,000 leases)."""
    if not isinstance(member, str) or not member:
        raise InvalidArgument("'member' must be a non-empty string")
    if len(member) > MAX_MEMBER_NAME:
        raise InvalidArgument(f"a member name has at most {MAX_MEMBER_NAME} characters; this one has {len(member)}")
    return member


def check_wait(wait: object) -> float:
    """How long a receive may wait for its first message: seconds in [0, MAX_WAIT]."""
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= MAX_WAIT:
        raise InvalidArgument(f"'wait' must be seconds in [0, {MAX_WAIT}], got {wait!r}")
    return wait


#: The most messages one receive takes.
MAX_RECEIVE = 10_000


def check_max_messages(max_messages: object) -> int:
    """How many messages a receive may take: an int in 1..MAX_RECEIVE."""
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidArgument(f"'max_messages' must be an int in 1..{MAX_RECEIVE}, got {max_messages!r}")
    return max_messages


def check_delay(delay: object) -> float | None:
    """A nack's delay: None (the backoff) or seconds in [0, ASKED_LEASE_LIMIT]."""
    if delay is not None and (
        not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay <= ASKED_LEASE_LIMIT
    ):
        raise InvalidArgument(f"'delay' must be seconds in [0, {ASKED_LEASE_LIMIT}] or None, got {delay!r}")
    return delay


def check_group_name(name: object) -> str:
    return check_name("group", name)


#: The most failures a group's message may have beyond its first (what the wire's i32 carries:
#: every store takes the same).
MAX_RETRIES = 2**31 - 1


def check_max_retries(max_retries: object) -> int:
    """Failures a group's message may have beyond its first delivery: an int in 0..MAX_RETRIES."""
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or not 0 <= max_retries <= MAX_RETRIES:
        raise InvalidArgument(f"'max_retries' must be an int in 0..{MAX_RETRIES}, got {max_retries!r}")
    return max_retries


#: The most pending messages one call lists.
MAX_PENDING = 10_000


def check_pending_limit(limit: object, most: int = MAX_PENDING) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= most:
        raise InvalidArgument(f"'limit' must be an int in 1..{most}, got {limit!r}")
    return limit


@dataclass(frozen=True)
class GroupLimits:
    """What one member may take of a group, so that no member starves the others.

    Attributes:
        max_lease: The longest lease a member gets (seconds): a longer one asked
            for is shortened to it, and so is a nack's delay. A message held by
            a member that never acks goes back to the group after at most this.
        max_member_in_flight: Messages one member may hold (leased and not
            acked) per group on one server; a receive returns at most what the
            member may still take.
        max_span: Messages in flight (leased, waiting to be retried, or held
            back behind their key) per (group, partition) before the partition
            hands out no more.
        member_timeout: Seconds without a call (receive or heartbeat) after which
            a member is gone: its leases end at once (as if they ran out), as they
            do when its last connection to the server closes.
        max_groups: Consumer groups one queue may have; a new one past it is
            refused (``LimitExceeded``), existing ones open as before.
    """

    max_lease: float = DEFAULT_MAX_LEASE
    max_member_in_flight: int = DEFAULT_MAX_MEMBER_IN_FLIGHT
    max_span: int = DEFAULT_MAX_SPAN
    member_timeout: float = MEMBER_TIMEOUT
    max_groups: int = DEFAULT_MAX_GROUPS

    def lease(self, asked: object) -> float:
        """The lease a member that asks for ``asked`` seconds gets: checked, at most ``max_lease``."""
        return min(check_lease(asked), self.max_lease)

    def __post_init__(self) -> None:
        lease = self.max_lease
        if not isinstance(lease, (int, float)) or isinstance(lease, bool) or not 0 < lease <= ASKED_LEASE_LIMIT:
            raise InvalidArgument(f"'max_lease' must be seconds in (0, {ASKED_LEASE_LIMIT}], got {lease!r}")
        timeout = self.member_timeout
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not MIN_MEMBER_TIMEOUT <= timeout:
            raise InvalidArgument(f"'member_timeout' must be seconds >= {MIN_MEMBER_TIMEOUT}, got {timeout!r}")
        for name in ("max_span", "max_member_in_flight", "max_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 10_000_000:
                raise InvalidArgument(f"{name!r} must be an int in 1..10000000, got {value!r}")


def backoff(retries: int) -> float:
    """Seconds before a nacked message comes back, after ``retries`` failures."""
    return doubled(BACKOFF_BASE, retries - 1, BACKOFF_MAX)
