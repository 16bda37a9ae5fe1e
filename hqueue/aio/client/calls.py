"""The asyncio client side of a declared operation (``rpc/operations.py``)."""

from __future__ import annotations

from typing import Any

from ...rpc.operations import Operation


def aremote(operation: Operation):
    """The awaitable client method of a declared operation, for a class with ``_engine``
    (an AsyncRemoteEngine) and, for operations every owner answers, ``_each_owner(queue,
    method, *args)``: :func:`hqueue.client.calls.remote`, awaited."""

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        bound = operation.bind(args, kwargs)
        wire_args = operation.to_wire(bound)
        queue = bound.get("queue")
        engine = self._engine
        if operation.merge is not None:  # every partition owner answers for its own, by one deadline
            answers = await self._each_owner(queue, operation.thrift, *wire_args, absent=operation.absent)
            return operation.merge([operation.result.back(a) for a in answers], **bound)
        return operation.result.back(await engine._call(operation.thrift, *wire_args, queue=queue))

    call.__name__ = call.__qualname__ = operation.method
    call.__doc__ = f"{operation.service}.{operation.method} over hqueue servers ({operation.thrift}), awaitable."
    return call
