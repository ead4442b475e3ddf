"""The rule of api/handlers.py: a call's context is used only while its handler task runs.

grpc.aio releases the core call when the handler's task ends; code that touches the
context later (an async generator closed afterwards by the event loop) reads freed
memory. The call interceptor drives a streaming generator itself, so a cancellation that
lands while a response is being written closes the generator, and ends the call (its
series, its access line), inside the task. tests/reliability/test_call_lifetimes.py
provokes the crash this prevents.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from inferwire.api.calls import CallInterceptor
from inferwire.api.metrics import GrpcMetrics
from inferwire.config import AuthSettings, GatewaySettings
from inferwire.edge.authentication import Authenticator
from inferwire.edge.calls import Reception
from inferwire.edge.tenancy import Tenancy
from inferwire.metrics.series import ServerMetrics

METHOD = "/test.Service/Stream"


@dataclass
class Details:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


class FakeContext:
    """A servicer context whose writes are recorded; `block_at` blocks that write until the
    call is cancelled, as a peer that stopped reading does."""

    def __init__(self, block_at: int = 0) -> None:
        self.written: list[Any] = []
        self.writing = asyncio.Event()
        self.block_at = block_at

    async def write(self, message: Any) -> None:
        self.written.append(message)
        if len(self.written) == self.block_at:
            self.writing.set()
            await asyncio.Event().wait()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> float | None:
        return None

    def code(self) -> Any:
        return None

    def details(self) -> str:
        return ""


def served(responses: Any) -> tuple[Any, ServerMetrics]:
    """`responses` as the call interceptor serves it, and the metrics it counts into."""
    metrics = ServerMetrics()
    reception = Reception(Authenticator(AuthSettings()), Tenancy(GatewaySettings()), None)
    interceptor = CallInterceptor(reception, GrpcMetrics(metrics), frozenset())
    handler = grpc.unary_stream_rpc_method_handler(responses)
    return interceptor.rebuilt(handler, Details(METHOD)).unary_stream, metrics


def handled(metrics: ServerMetrics, code: str) -> float | None:
    return metrics.registry.get_sample_value(
        "grpc_server_handled_total",
        {
            "grpc_type": "server_stream",
            "grpc_service": "test.Service",
            "grpc_method": "Stream",
            "grpc_code": code,
        },
    )


async def test_a_cancel_during_a_write_closes_the_generator_and_ends_the_call_in_the_task():
    events: list[str] = []

    async def responses(request: Any, context: Any) -> AsyncIterator[str]:
        try:
            for n in range(10):
                yield f"message {n}"
        finally:
            events.append("generator closed")

    handler, metrics = served(responses)
    assert asyncio.iscoroutinefunction(handler)  # grpc's reader-writer form, not a generator
    context = FakeContext(block_at=2)
    task = asyncio.create_task(handler("request", context))
    await context.writing.wait()
    task.cancel()  # what grpc.aio does when the client cancels
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Both happened before the task ended: nothing is left for the event loop to close later.
    assert events == ["generator closed"]
    assert handled(metrics, "Canceled") == 1
    assert context.written == ["message 0", "message 1"]


async def test_a_generator_that_ends_writes_every_response_and_counts_each():
    async def responses(request: Any, context: Any) -> AsyncIterator[str]:
        for n in range(3):
            yield f"{request} {n}"

    handler, metrics = served(responses)
    context = FakeContext()
    await handler("hi", context)
    assert context.written == ["hi 0", "hi 1", "hi 2"]
    assert handled(metrics, "OK") == 1
    sent = metrics.registry.get_sample_value(
        "grpc_server_msg_sent_total",
        {"grpc_type": "server_stream", "grpc_service": "test.Service", "grpc_method": "Stream"},
    )
    assert sent == 3
