"""A request that is not valid protobuf gets INVALID_ARGUMENT, on every method.

grpc.aio deserializes a request before any servicer code runs; a payload that does not
parse raises there, and grpc answers UNKNOWN ("Unexpected <class 'DecodeError'>"), with
an ERROR log line. This interceptor gives every method a deserializer that cannot fail:
it hands the handler an `UndecodableRequest` instead, and the handler's guard answers
INVALID_ARGUMENT with a message that names the expected message type. It wraps every
service alike (ours, grpc.health.v1, reflection), so no method is left out.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from inferwire.api.handlers import Deserializer, HandlerCache, rebuild_handler


@dataclass(frozen=True)
class UndecodableRequest:
    """What a handler receives instead of a request that did not parse."""

    reason: str


def _tolerant(deserializer: Deserializer | None) -> Deserializer | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except (DecodeError, ValueError) as error:
            return UndecodableRequest(str(error) or type(error).__name__)

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], method: str, why: str) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request could not be decoded as the protobuf message {method} takes: {why}",
    )


def _guard_unary_request(handler: Callable[..., Any], method: str) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(handler):

        async def stream_guard(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, UndecodableRequest):
                await _refuse(context, method, request.reason)
            async for response in handler(request, context):
                yield response

        return stream_guard

    async def guard(request: Any, context: Any) -> Any:
        if isinstance(request, UndecodableRequest):
            await _refuse(context, method, request.reason)
        return await handler(request, context)

    return guard


def _guard_request_stream(handler: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def checked(requests: AsyncIterable[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, UndecodableRequest):
                await _refuse(context, method, request.reason)
            yield request

    if not inspect.isasyncgenfunction(handler):  # it writes with context.write

        async def call_guard(requests: AsyncIterable[Any], context: Any) -> Any:
            return await handler(checked(requests, context), context)

        return call_guard

    async def stream_guard(requests: AsyncIterable[Any], context: Any) -> AsyncIterator[Any]:
        async for response in handler(checked(requests, context), context):
            yield response

    return stream_guard


class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers undecodable requests with INVALID_ARGUMENT on every method."""

    def __init__(self) -> None:
        self._rebuilt = HandlerCache()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming and not handler.response_streaming:
            return handler  # client-streaming to unary: no such method is served
        method = handler_call_details.method
        cached: grpc.RpcMethodHandler[Any, Any] | None = self._rebuilt.get(method, handler)
        if cached is not None:
            return cached
        guard = _guard_request_stream if handler.request_streaming else _guard_unary_request
        rebuilt: grpc.RpcMethodHandler[Any, Any] = rebuild_handler(
            handler,
            lambda behaviour: guard(behaviour, method),
            request_deserializer=_tolerant(handler.request_deserializer),
        )
        return self._rebuilt.put(method, handler, rebuilt)
