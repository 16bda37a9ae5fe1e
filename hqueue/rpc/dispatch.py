"""thriftpy2's processor, with each method's classes and handler looked up once.

``TProcessor.process_in`` finds a call's argument and result classes by name
(``getattr(service, api + "_args")``), lists the arguments' names from their
spec, and makes a closure and a generator per call; over a server's life those
are the same for every call of a method. Here they are found at a method's
first call and kept (only for methods the service declares: a made-up name is
answered UNKNOWN_METHOD and never kept).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from thriftpy2.thrift import TApplicationException, TProcessor, TType


class CachedProcessor(TProcessor):
    """A ``TProcessor`` that keeps each method's ``(args class, result class, argument
    names, handler)`` from its first call."""

    def __init__(self, service: Any, handler: object) -> None:
        super().__init__(service, handler)
        self._methods: dict[str, tuple[Any, Any, tuple[str, ...], Callable[..., Any]]] = {}

    def process_in(self, iprot: Any) -> tuple[str, int, Any, Callable[[], Any] | None]:
        api, _, seqid = iprot.read_message_begin()
        method = self._methods.get(api)
        if method is None:
            if api not in self._service.thrift_services:
                iprot.skip(TType.STRUCT)
                iprot.read_message_end()
                return api, seqid, TApplicationException(TApplicationException.UNKNOWN_METHOD), None
            args_class = getattr(self._service, api + "_args")
            names = tuple(item[1] for item in args_class.thrift_spec.values())  # the IDL's order
            method = args_class, getattr(self._service, api + "_result"), names, getattr(self._handler, api)
            self._methods[api] = method
        args_class, result_class, names, handler = method
        args = args_class()
        args.read(iprot)
        iprot.read_message_end()
        values = args.__dict__
        return api, seqid, result_class(), partial(handler, *[values[name] for name in names])
