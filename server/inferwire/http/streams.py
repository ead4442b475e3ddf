"""Answers that end when the client goes: Server-Sent Events, and whole answers.

A client that closes its connection cancels its request: `EventStreamResponse` watches
for the disconnect while it sends and cancels the sending task, which closes the core's
stream (so the engine stops within one token, as a cancelled `InferStream` does);
`unless_gone` does the same for a whole answer the core is still generating. Either way
the call's access line says `cancelled`. An error after the first event has gone out is
one last event with OpenAI's error body, and the stream ends (as vLLM does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from inferwire.core.results import StreamChunk
from inferwire.edge.calls import Call
from inferwire.edge.errors import Code
from inferwire.http.bodies import ClientGone
from inferwire.http.calls import finish_http
from inferwire.http.errors import HTTP_STATUS, http_answer

T = TypeVar("T")
# The server's own ASGI `send`, kept in the scope by `keeping_raw_send`. Starlette's two
# middlewares wrap `send` only to note that a response started; a stream's every event
# would pass through both wrappers (a tenth of the event loop's time per event, profiled),
# so its body parts go to uvicorn directly once the start went through them.
RAW_SEND = "inferwire.raw_send"
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies (nginx) pass each event on at once
]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (and `work` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientGone
    return task.result()


async def first_chunk(request: Request, chunks: AsyncGenerator[StreamChunk, None]) -> StreamChunk:
    """The core's stream's first chunk, awaited before the status goes out, so that a
    request the core refuses (invalid, unknown model, queue full) gets its status, not a
    200."""
    try:
        return await unless_gone(request, anext(chunks))
    except BaseException:
        await chunks.aclose()
        raise


class ChunkEvents(Protocol):
    """What writes a stream's chunks as events: each chunk's, then the last one's."""

    def delta(self, chunk: StreamChunk) -> bytes: ...

    def end(self, chunk: StreamChunk) -> bytes: ...


async def chunk_events(
    stream: ChunkEvents, first: StreamChunk, chunks: AsyncGenerator[StreamChunk, None]
) -> AsyncGenerator[bytes, None]:
    """The stream's events from its first chunk on; closing it closes the core's stream.
    The last chunk is the one with the usage (with n choices, each choice's end is a chunk
    with its finish reason before it: a delta here)."""
    delta, end = stream.delta, stream.end
    try:
        chunk = first
        while chunk.usage is None:
            yield delta(chunk)
            chunk = await anext(chunks)
        yield end(chunk)
    finally:
        await chunks.aclose()


class EventStreamResponse(Response):
    """A stream of events (each a `data: ...\\n\\n` bytes chunk) until `events` ends."""

    streams = True  # calls.py: its call ends with it

    def __init__(
        self,
        call: Call,
        first: bytes,
        events: AsyncGenerator[bytes, None],
        error_event: Callable[[dict[str, Any]], bytes],
        headers: dict[str, str] | None = None,
    ) -> None:
        # Not Response.__init__: its empty body would set `content-length: 0`.
        self.status_code, self.background = 200, None
        self.init_headers(headers)
        self._call, self._first, self._events, self._error_event = call, first, events, error_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send, scope.get(RAW_SEND, send)))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((sending, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not sending.done():  # the client left: generation stops with the stream
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
                finish_http(self._call, HTTP_STATUS[Code.CANCELLED], Code.CANCELLED)
        if sending.done() and not sending.cancelled() and (error := sending.exception()):
            raise error

    async def _send_all(self, send: Send, send_body: Send) -> None:
        """Send the stream: its start through Starlette's middleware (which notes that the
        response started), every body part straight to uvicorn (`send_body`, see RAW_SEND)."""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*self.raw_headers, *_HEADERS],
            }
        )
        send = send_body
        code, status, why = Code.OK, 200, ""
        try:
            if self._first:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            async with contextlib.aclosing(self._events) as events:
                async for event in events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
        except Exception as error:  # after the first event: one last event says why
            reply = self._call.error_reply(error)
            (status, body, _), code, why = http_answer(reply), reply.code, reply.message
            event = self._error_event(body)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        # The status line went out as 200; the line says what the stream ended with.
        finish_http(self._call, status, code, why)


def keeping_raw_send(app: ASGIApp) -> ASGIApp:
    """`app` with the server's own `send` kept in each HTTP request's scope (RAW_SEND)."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await app(scope, receive, send)

    return asgi
