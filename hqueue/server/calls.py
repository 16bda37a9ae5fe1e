"""What every Thrift call of an hqueue server goes through, and how the calls are put together.

* :func:`served`: a call is authorized, counted, and lets only the
  exceptions the IDL declares out (anything else becomes TIOError and
  never takes the server down).
* :class:`CallGuard`: the server's token policy, the calls under way (what
  shutdown drains) and whether puts are refused (draining).
* :class:`Calls`: the base of each group of calls (handler.py: queues,
  puts, scans, timers; group_calls.py; subscription_calls.py).
* :class:`ThriftService`: one HQueueService made of those groups.
* :func:`handler`: the handler of a declared operation (``rpc/operations.py``).
* :func:`thrift_error`: the IDL exception a call answers with for an error
  (also what the connection loop answers a call it refuses unread with).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from ..auth import LOCAL, MANAGE, OPEN, AuthPolicy, Principal
from ..config import MAX_QUEUE_NAME
from ..coordination import Coordinator
from ..engine import Engine
from ..errors import HQueueError, InvalidQueueName, NotAuthorized
from ..metrics import ServerMetrics
from ..rpc import wire
from ..rpc.connections import NEEDS_TOKEN, RateLimitedLog, current_connection
from ..rpc.operations import Operation

logger = logging.getLogger(__name__)
#: Calls that failed for a reason no check names (a bug): one traceback per method per 10 s.
_failures = RateLimitedLog(10.0, logger)

#: The longest text an error sent to a client carries (it may repeat what the client sent).
MAX_ERROR_TEXT = 4096


@functools.cache
def _declared(method: str) -> tuple[type, ...]:
    """The exception classes the IDL declares for ``method``."""
    spec = getattr(wire.T.HQueueService, method + "_result").thrift_spec
    return tuple(field[2] for key, field in spec.items() if key != 0 and len(field) > 2 and isinstance(field[2], type))


#: What a refused call was, as a user would say it: "token 'r' may not disable queue 'q'".
#: (A call missing here is named by its IDL name.)
ACTIONS = {
    **dict.fromkeys(["putPacked", "putMessage", "putMessages", "putMessageWithPid", "putMessagesWithPid"], "put to"),
    "scheduleTimers": "put timers on", "cancelTimer": "cancel timers on",
    **dict.fromkeys(["pendingTimers", "countTimers", "nextTimer", "findTimer"], "read the pending timers of"),
    "messageScannerOpen": "scan", "createQueue": "create", "truncateQueue": "truncate", "disableQueue": "disable",
    "enableQueue": "enable", "dropQueue": "delete",
    "openGroup": "consume", "groupReceive": "consume", "groupAck": "ack messages of",
    "groupAckReceive": "consume", "groupNack": "nack messages of",
    "groupExtend": "extend leases of",
    "groupDeadLetter": "dead-letter messages of", "groupLeave": "leave a consumer group of",
    "listGroups": "list the consumer groups of", "describeGroup": "describe a consumer group of",
    "groupPending": "list the pending messages of", "deleteGroup": "delete", "setGroupPosition": "replay",
    "listSubscribers": "list the subscribers of", "describeSubscriber": "describe a subscriber of",
    "getCoordination": "subscribe to", "addSubscriber": "add", "deleteSubscriber": "delete",
    "setCheckpoint": "move the checkpoint of", "subscriberLeave": "detach", "subscriberHeartbeat": "run",
    "approveSubscriberAddress": "register the address of",
}  # fmt: skip


def served(role: str | None, queue_arg: int | None = 0, named: tuple[int, str] | None = None, inline: bool = False):
    """A Thrift call: authorized, counted, and with only IDL exceptions out.

    ``role`` is what the connection's token must hold on the queue given as
    argument ``queue_arg`` (``"member"``: any role; ``"connected"``: an
    authenticated connection, no queue; ``"manage"``: admin, or consumer and
    the name of the group or subscriber granted, see :mod:`hqueue.auth`);
    None for ``authenticate`` itself. ``named``: for ``"manage"``, the
    argument that names it and what it names (``"group"``, ``"subscriber"``).

    An exception the IDL does not declare for a call would make thriftpy2
    drop the connection; it is sent as TIOError instead.

    ``inline``: the call may run on the server's event loop (rpc/loop.py): it
    calls :func:`~hqueue.rpc.loop.may_block` before anything that waits.
    """

    def wrap(method):
        action = ACTIONS.get(method.__name__, method.__name__)

        @functools.wraps(method)
        def call(self, *args):
            guard = self.guard
            guard.enter()
            try:
                if role is not None:
                    queue = args[queue_arg] if queue_arg is not None else None
                    guard.authorize(role, action, queue, (named[1], args[named[0]]) if named else None)
                return method(self, *args)
            except Exception as e:
                if not isinstance(e, (HQueueError, ValueError, TypeError)):  # (a bug: its arguments stay out,
                    _failures.exception(method.__name__, "%s failed", method.__name__)  # a token among them)
                raise thrift_error(method.__name__, e) from e
            finally:
                guard.leave()

        call.inline = inline  # type: ignore[attr-defined]
        return call

    return wrap


def thrift_error(method: str, e: Exception) -> Exception:
    """The IDL exception ``method`` answers with for ``e``: one it declares
    (TIOError for what it does not, and for unexpected errors)."""
    if isinstance(e, (HQueueError, ValueError, TypeError)):
        error = wire.to_thrift_error(e)
    else:
        error = wire.T.TIOError(message=f"internal error: {type(e).__name__}: {e}")
    if not isinstance(error, _declared(method)):  # as TIOError, its kind said first (read back: wire)
        said = getattr(error, "message", str(error))
        kind = type(e).__name__
        error = wire.T.TIOError(message=said if said.startswith(f"{kind}: ") else f"{kind}: {said}")
    for field, text in vars(error).items():  # what a client sent, repeated back, stays short
        if isinstance(text, str) and len(text) > MAX_ERROR_TEXT:
            setattr(error, field, text[:MAX_ERROR_TEXT] + f"… ({len(text)} characters)")
    return error


def handler(operation: Operation):
    """The served call of a declared operation: its arguments from the wire, the
    service's method, the answer to the wire. One line in a group of calls:
    ``listGroups = handler(LIST_GROUPS)``."""

    def call(self, *wire_args):
        service = getattr(self, operation.service)
        answer = getattr(service, operation.method)(*operation.from_wire(wire_args))
        return operation.result.out(answer)

    call.__name__ = call.__qualname__ = operation.thrift
    return served(operation.role, operation.queue_at, operation.named_at)(call)


class CallGuard:
    """Authorization and the count of calls under way, shared by every group of calls."""

    def __init__(self, auth: AuthPolicy | None) -> None:
        self.auth = auth
        #: Calls under way (read by shutdown to drain), and whether puts are refused.
        self.active = 0
        self.draining = False
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.active += 1

    def leave(self) -> None:
        with self._lock:
            self.active -= 1

    def principal(self) -> Principal:
        connection = current_connection()
        if connection is not None and connection.principal is not None:
            return connection.principal
        if self.auth is None:
            return OPEN
        if connection is not None and connection.local:
            return LOCAL  # the socket file's permissions let it in: it may reach the store's files too
        raise NotAuthorized(NEEDS_TOKEN)

    def authorize(self, role: str, action: str, queue: Any, named: tuple[str, Any] | None = None) -> None:
        """Raise NotAuthorized unless the connection's token may do ``action``
        (``named``: the kind and name of the group or subscriber it acts on)."""
        principal = self.principal()
        if role == "connected":
            return
        if not isinstance(queue, str):
            raise TypeError(f"'queue' must be a string, got {type(queue).__name__}")
        if len(queue) > MAX_QUEUE_NAME:  # before any error repeats it (a 19 MiB name made a 40 MiB reply)
            raise InvalidQueueName(f"a queue name has at most {MAX_QUEUE_NAME} characters; this one has {len(queue)}")
        if role == MANAGE:
            if named is None:
                raise TypeError(f"{action}: a 'manage' call must name its group or subscriber")
            kind, name = named
            if not isinstance(name, str):
                raise TypeError(f"the {kind} name must be a string, got {type(name).__name__}")
            principal.require_manage(queue, kind, name, action)
        elif role == "member":
            if not principal.may_see(queue):
                raise NotAuthorized(f"token {principal.name!r} has no role on queue {queue!r}")
        else:
            principal.require(role, queue, action)


class Calls:
    """A group of HQueueService calls over the engine."""

    def __init__(self, engine: Engine, coordinator: Coordinator, guard: CallGuard, metrics: ServerMetrics) -> None:
        self.engine, self.coordinator, self.guard, self.metrics = engine, coordinator, guard, metrics


class ThriftService:
    """One Thrift service made of groups of calls: thriftpy2 looks each call up by
    name here, and finds the group that has it."""

    def __init__(self, *groups: Calls) -> None:
        self._calls: dict[str, Any] = {}
        for group in groups:
            for name in dir(type(group)):
                if not name.startswith("_") and callable(getattr(type(group), name)):
                    if name in self._calls:
                        raise TypeError(f"two groups of calls both have {name!r}")
                    self._calls[name] = getattr(group, name)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_calls"][name]
        except KeyError:
            raise AttributeError(name) from None
