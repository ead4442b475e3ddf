"""Rebuilding a grpc method handler around new behaviour, for the server's interceptors.

The rule every wrapper here keeps: **a grpc.aio call's context is used only while the
call's handler task runs.** When that task ends, grpc.aio releases the core call
(`grpc_call_unref`, and the context's call pointer becomes NULL); `context.peer()`,
`auth_context()`, `write()` or `abort()` after that reads freed memory and kills the
process with SIGSEGV. Python-side state (`code()`, `details()`, `time_remaining()`)
survives, but nothing here relies on it either. Two things keep the rule:
- `calls_within` never hands grpc an async generator: it drives a streaming handler's
  generator itself and closes it in the call's task. Had grpc iterated it, a client that
  cancels while grpc awaits a write leaves the generator suspended at its `yield`; the
  event loop closes it later, after the call is gone, and every scope's exit (the access
  line, the span) would then run against a released call (issue 31).
- What the access line, metrics and tracing need from the call is read when it starts
  (`observe._ObservedRpc`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import grpc

from inferwire.api.peer_gone import write_or_await_cancellation

Behaviour = Callable[..., Any]
Deserializer = Callable[[bytes], Any]
# What an interceptor calls for the handler of the next interceptor (or the servicer).
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Any]]
# Around one call: given its request and context, a context manager that yields the
# request and context to call the behaviour with.
Call = tuple[Any, Any]
Scope = Callable[[Any, Any], AbstractContextManager[Call]]


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


def calls_within(behaviour: Behaviour, scope: Scope) -> Behaviour:
    """`behaviour` with each call run inside `scope(request, context)`.

    The scope sees whatever the call raises, and always exits in the call's own task. A
    streaming handler written as an async generator becomes a coroutine that writes each
    response with the scope's `context.write` (grpc's reader-writer form) and closes the
    generator before it returns, however the call ends (see the module's rule).
    """
    if inspect.isasyncgenfunction(behaviour):

        async def write_each(request: Any, context: Any) -> None:
            with scope(request, context) as (request, context):
                async with contextlib.aclosing(behaviour(request, context)) as responses:
                    async for response in responses:
                        await write_or_await_cancellation(context, response)

        return write_each

    async def call(request: Any, context: Any) -> Any:
        with scope(request, context) as (request, context):
            return await behaviour(request, context)

    return call
