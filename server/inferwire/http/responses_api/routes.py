"""OpenAI's Responses API on the HTTP door: `POST /v1/responses`, `GET` and `DELETE
/v1/responses/{response_id}`.

A thin adapter over the same core as Chat Completions: the body becomes the core's
InferenceRequest (responses_api/input.py), its result or stream the `response` object
and its events (responses_api/output.py). Each route is served as the edge's one call
(http/calls.py), so tokens, tenants, quotas, priorities, metrics, the access line and
traces are the other routes'. A response made with `store: true` is kept in the store
(responses_api/store/) under the tenant the call runs as, before its answer (or its
stream's last event) goes out: an answered response is stored. `previous_response_id`,
GET and DELETE find only that tenant's, and anything else (never made, `store: false`,
evicted, deleted, another tenant's, a model the caller's token may not use) is the same
404 naming the id. A store that cannot be reached is a 503 naming it, for these routes
and for a request to store; a request with `store: false` and no `previous_response_id`
never touches it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.core.chat import ChatMessage
from inferwire.core.manager import ModelManager
from inferwire.edge.calls import Call, current_call
from inferwire.edge.errors import NotFoundError
from inferwire.http.responses_api.input import ResponsesRequest, read_body, to_request
from inferwire.http.responses_api.output import ResponseEvents, ResponseShape
from inferwire.http.responses_api.store import ResponseStore, StoredResponse
from inferwire.http.streams import EventStreamResponse, chunk_events, first_chunk, unless_gone


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class ResponsesApi:
    """The Responses routes' handlers over one model manager and one store."""

    def __init__(self, manager: ModelManager, store: ResponseStore) -> None:
        self._manager, self._store = manager, store

    async def create(self, request: Request, body: Any) -> Response:
        call = current_call()
        tenant, request_id = call.tenant, request.headers.get("x-request-id")
        fields = read_body(body)
        previous = None
        if fields.previous_response_id is not None:
            previous = await self._find(call, fields.previous_response_id, "previous_response_id")
        asked = to_request(fields, previous, tenant, request_id, call.priority_hint)
        call.name_fields(asked.field_of)
        shape = ResponseShape(asked.inference.model, asked.echo())
        # The response to store (when asked to), made when its answer is whole.
        answered: list[StoredResponse] = []

        def keep(response: dict[str, Any], turn: ChatMessage) -> bytes:
            content = _json(response)
            if fields.store:
                conversation = (*asked.conversation, turn)
                answered.append(
                    StoredResponse(shape.id, shape.model, tenant, content, conversation)
                )
            return content

        if fields.stream:
            return await self._stream(call, request, asked, shape, keep, answered)
        result = await unless_gone(request, self._manager.infer(asked.inference))
        content = keep(*shape.unary(result))
        for response in answered:
            await self._store.put(response)
        return Response(
            content, media_type="application/json", headers={"x-request-id": result.request_id}
        )

    async def retrieve(self, request: Request, body: None) -> Response:
        response_id = request.path_params["response_id"]
        stored = await self._find(current_call(), response_id, "response_id")
        return Response(stored.body, media_type="application/json")

    async def delete(self, request: Request, body: None) -> Response:
        call, response_id = current_call(), request.path_params["response_id"]
        await self._find(call, response_id, "response_id")
        await self._store.delete(response_id, call.tenant)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def _stream(
        self,
        call: Call,
        request: Request,
        asked: ResponsesRequest,
        shape: ResponseShape,
        keep: Callable[[dict[str, Any], ChatMessage], bytes],
        answered: list[StoredResponse],
    ) -> Response:
        request_id, chunks = self._manager.infer_stream(asked.inference)
        first = await first_chunk(request, chunks)
        events = ResponseEvents(shape, keep)
        return EventStreamResponse(
            call,
            events.first(),
            self._storing(chunk_events(events, first, chunks), answered),
            events.error,
            headers={"x-request-id": request_id},
        )

    async def _storing(
        self, events: AsyncGenerator[bytes, None], answered: list[StoredResponse]
    ) -> AsyncGenerator[bytes, None]:
        """`events`, the last (whose making filled `answered`) sent once the response is
        stored; a store that fails makes it an `error` event and `response.failed`."""
        async with contextlib.aclosing(events):
            async for event in events:
                while answered:
                    await self._store.put(answered.pop())
                yield event

    async def _find(self, call: Call, response_id: str, param: str) -> StoredResponse:
        """The call's tenant's stored response `response_id`, or 404 (whatever the reason)."""
        stored = await self._store.get(response_id, call.tenant)
        if stored is None or not call.principal.may_use(stored.model):
            raise NotFoundError(
                f"no response {response_id[:64]!r} is stored: it was never made, was made "
                "with store: false, or was deleted or evicted",
                param,
            )
        call.model = stored.model  # the access line's
        return stored
