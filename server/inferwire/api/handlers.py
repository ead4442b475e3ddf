"""Rebuilding a grpc method handler around new behaviour, for the server's interceptors.

The rule every wrapper here keeps: **a grpc.aio call's context is used only while the
call's handler task runs.** When that task ends, grpc.aio releases the core call
(`grpc_call_unref`, and the context's call pointer becomes NULL); `context.peer()`,
`auth_context()`, `write()` or `abort()` after that reads freed memory and kills the
process with SIGSEGV. Python-side state (`code()`, `details()`, `time_remaining()`)
survives, but nothing here relies on it either. Two things keep the rule, in the call
interceptor (api/calls.py):
- It never hands grpc an async generator: it drives a streaming handler's generator
  itself and closes it in the call's task. Had grpc iterated it, a client that cancels
  while grpc awaits a write leaves the generator suspended at its `yield`; the event loop
  closes it later, after the call is gone, and the call's end (the access line, the span)
  would then run against a released call (issue 31).
- What the call needs from the context (peer, metadata, certificate, deadline) is read
  when it starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Behaviour = Callable[..., Any]
Deserializer = Callable[[bytes], Any]
# What an interceptor calls for the handler of the next interceptor (or the servicer).
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Any]]


def split_method(method: str) -> tuple[str, str]:
    """`/package.Service/Method` as (`package.Service`, `Method`)."""
    service, _, name = method.strip("/").partition("/")
    return service, name


def rebuild_handler(
    handler: Any,
    wrap: Callable[[Behaviour], Behaviour],
    request_deserializer: Deserializer | None = None,
) -> Any:
    """The same handler, whichever of the four kinds, with its behaviour wrapped.

    `request_deserializer` replaces the handler's own when given.
    """
    make, behaviour = {
        (False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream),
        (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream),
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        wrap(behaviour),
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class HandlerCache:
    """An interceptor's rebuilt handlers, one per method, kept while the inner handler is the
    same object: grpc.aio runs `intercept_service` on every call, and rebuilding a handler
    (closures, a new RpcMethodHandler) each time costs more than the lookup. Bounded by the
    served methods, since only a method that has a handler gets an entry."""

    def __init__(self) -> None:
        self._rebuilt: dict[str, tuple[Any, Any]] = {}

    def get(self, method: str, handler: Any) -> Any | None:
        found = self._rebuilt.get(method)
        return found[1] if found is not None and found[0] is handler else None

    def put(self, method: str, handler: Any, rebuilt: Any) -> Any:
        self._rebuilt[method] = (handler, rebuilt)
        return rebuilt


class RebuildingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps the behaviour of each handler it is given (`rebuilt`)."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(handler_call_details)
        return None if handler is None else self.rebuilt(handler, handler_call_details)

    def rebuilt(self, handler: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        """The handler to serve the call with, its behaviour wrapped."""
        raise NotImplementedError
