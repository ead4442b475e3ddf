"""Rebuilding a grpc method handler around new behaviour, for the server's interceptors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Behaviour = Callable[..., Any]
Deserializer = Callable[[bytes], Any]
# What an interceptor calls for the handler of the next interceptor (or the servicer).
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Any]]


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
