"""The rule of api/handlers.py: a call's context is used only while its handler task runs.

grpc.aio releases the core call when the handler's task ends; code that touches the
context later (an async generator closed afterwards by the event loop) reads freed
memory. `calls_within` drives a streaming generator itself, so a cancellation that lands
while a response is being written closes the generator, and exits every scope, inside
the task. tests/reliability/test_call_lifetimes.py provokes the crash this prevents.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from inferwire.api.handlers import Call, calls_within


class BlockingWriteContext:
    """A servicer context whose second write blocks until the call is cancelled."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.writing = asyncio.Event()

    async def write(self, message: Any) -> None:
        self.written.append(message)
        if len(self.written) == 2:
            self.writing.set()
            await asyncio.Event().wait()  # the peer stopped reading; only a cancel ends it


async def test_a_cancel_during_a_write_closes_the_generator_and_the_scope_in_the_task():
    events: list[str] = []

    async def responses(request: Any, context: Any) -> AsyncIterator[str]:
        try:
            for n in range(10):
                yield f"message {n}"
        finally:
            events.append("generator closed")

    @contextlib.contextmanager
    def scope(request: Any, context: Any) -> Iterator[Call]:
        try:
            yield request, context
        finally:
            events.append("scope exited")

    handler = calls_within(responses, scope)
    assert asyncio.iscoroutinefunction(handler)  # grpc's reader-writer form, not a generator
    context = BlockingWriteContext()
    task = asyncio.create_task(handler("request", context))
    await context.writing.wait()
    task.cancel()  # what grpc.aio does when the client cancels
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Both ran before the task ended: nothing is left for the event loop to close later.
    assert events == ["generator closed", "scope exited"]
    assert context.written == ["message 0", "message 1"]


async def test_a_generator_that_ends_writes_every_response_through_the_scope_s_context():
    async def responses(request: Any, context: Any) -> AsyncIterator[str]:
        for n in range(3):
            yield f"{request} {n}"

    seen: list[Any] = []

    class CountingContext:
        async def write(self, message: Any) -> None:
            seen.append(message)

    @contextlib.contextmanager
    def scope(request: Any, context: Any) -> Iterator[Call]:
        yield request.upper(), CountingContext()

    await calls_within(responses, scope)("hi", object())
    assert seen == ["HI 0", "HI 1", "HI 2"]
