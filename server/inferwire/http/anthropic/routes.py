"""Anthropic's Messages API on the HTTP door: `POST /v1/messages` and `POST
/v1/messages/count_tokens`.

A thin adapter over the same core as Chat Completions: the body becomes the core's
InferenceRequest (anthropic/input.py), its result or stream Anthropic's `message` and its
events (anthropic/output.py). Each route is served as the edge's one call (http/calls.py)
with its row of the edge's table (edge/methods.py: the token in `x-api-key` or as a
bearer), so tokens, tenants, quotas, priorities, metrics, the access line and traces are
the other routes'; its errors are written in Anthropic's shape (anthropic/errors.py).
The `anthropic-version` and `anthropic-beta` headers and the `?beta=true` query its SDKs
and Claude Code send are taken and change nothing.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.core.manager import ModelManager
from inferwire.edge.calls import current_call
from inferwire.http.anthropic.errors import error_event
from inferwire.http.anthropic.input import MessagesBody, counted_messages, read_body, to_request
from inferwire.http.anthropic.output import MessageEvents, MessageShape
from inferwire.http.streams import EventStreamResponse, chunk_events, first_chunk, unless_gone

PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})  # answered in Anthropic's shape


class AnthropicApi:
    """The Messages routes' handlers over one model manager."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    async def messages(self, request: Request, body: Any) -> Response:
        call = current_call()
        fields = read_body(body)
        assert isinstance(fields, MessagesBody)
        asked = to_request(
            fields, call.tenant, request.headers.get("x-request-id"), call.priority_hint
        )
        call.name_fields(asked.field_of)
        shape = MessageShape(asked.inference.model, fields.max_tokens)
        if fields.stream:
            request_id, chunks = self._manager.infer_stream(asked.inference)
            first = await first_chunk(request, chunks)
            events = MessageEvents(shape)
            return EventStreamResponse(
                call,
                events.first(),
                chunk_events(events, first, chunks),
                error_event,
                headers=_ids(request_id),
            )
        result = await unless_gone(request, self._manager.infer(asked.inference))
        return JSONResponse(shape.unary(result), headers=_ids(result.request_id))

    async def count_tokens(self, request: Request, body: Any) -> Response:
        call = current_call()
        asked = to_request(read_body(body, count_only=True), call.tenant, None)
        call.name_fields(asked.field_of)
        model = asked.inference.model
        counted = await self._manager.tokenize(model, "", counted_messages(asked))
        return JSONResponse({"input_tokens": len(counted.token_ids)})


def _ids(request_id: str) -> dict[str, str]:
    """The request's id, as inferwire's routes and as Anthropic's SDKs read it."""
    return {"x-request-id": request_id, "request-id": request_id}
