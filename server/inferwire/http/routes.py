"""The HTTP routes: OpenAI's Completions, Chat Completions, Responses, Embeddings and
Models, Anthropic's Messages, Jina's and Cohere's rerank, vLLM's /tokenize, /detokenize
and render routes (`/v1/completions/render`, `/v1/chat/completions/render`), and /health,
/version, /metrics and `HEAD /`.

What each route needs is its row of the edge's one table (edge/methods.py): generation,
models and tokens the `infer` scope (a token, or an anonymous scope); /health, /version
and /metrics stay open with a tokens file, as grpc.health.v1 and reflection do on gRPC:
probes and the gateway's endpoint picker call them. A path that
is no route (404), a method a route does not take (405) and anything that escaped a
handler (500) get OpenAI's error body too; Anthropic's routes answer in Anthropic's shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from inferwire import __version__
from inferwire.config import ResponsesSettings
from inferwire.core.chat import ChatMessage
from inferwire.core.manager import ModelManager
from inferwire.core.status import ModelStatus
from inferwire.edge.calls import Call, current_call
from inferwire.edge.errors import (
    INTERNAL_MESSAGE,
    Code,
    ErrorReply,
    MethodNotAllowedError,
    NotFoundError,
    error_reply,
)
from inferwire.edge.listing import ListedModels
from inferwire.http.anthropic.errors import anthropic_answer
from inferwire.http.anthropic.routes import PATHS as ANTHROPIC_PATHS
from inferwire.http.anthropic.routes import AnthropicApi
from inferwire.http.bodies import BodyModel
from inferwire.http.calls import ErrorAnswer, Handler, HttpCalls
from inferwire.http.completion_output import EventStream, unary_json
from inferwire.http.errors import http_answer
from inferwire.http.metrics import ResponseStoreGauges
from inferwire.http.requests import ParsedRequest, parse, validation_error
from inferwire.http.responses_api.routes import ResponsesApi
from inferwire.http.responses_api.store import MemoryStore, ResponseStore
from inferwire.http.retrieval.routes import RetrievalApi
from inferwire.http.streams import (
    EventStreamResponse,
    chunk_events,
    first_chunk,
    keeping_raw_send,
    unless_gone,
)

_STARTED = int(time.time())


class TokenizeBody(BodyModel):
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeBody(BodyModel):
    model: str
    tokens: list[int] = Field(max_length=1 << 20)


class Routes:
    """The routes over one model manager."""

    def __init__(
        self,
        manager: ModelManager,
        calls: HttpCalls,
        registry: CollectorRegistry,
        responses: ResponseStore | None = None,
    ) -> None:
        """`responses`: the store of responses, which its owner closes (default: in
        memory, with the settings' default bounds)."""
        self._manager, self._calls, self._registry = manager, calls, registry
        bounds = ResponsesSettings()
        store = responses or MemoryStore(bounds.max_entries, bounds.max_bytes)
        registry.register(ResponseStoreGauges(store.usage))
        self._responses = ResponsesApi(manager, store)
        self._anthropic = AnthropicApi(manager)
        self._retrieval = RetrievalApi(manager)
        # /v1/models' answer, kept while its models do not change (as gRPC's ListModels):
        # a model card shows nothing that moves without the model's version.
        self._listed = ListedModels(_models_list)

    def table(self) -> list[tuple[str, str, Handler]]:
        """Every route: its method, path and handler. Its scope, inference and model field
        are its row of the edge's one table (edge/methods.py), under `METHOD path`."""
        return [
            ("POST", "/v1/completions", self._completions),
            ("POST", "/v1/chat/completions", self._chat),
            ("POST", "/v1/responses", self._responses.create),
            ("GET", "/v1/responses/{response_id}", self._responses.retrieve),
            ("DELETE", "/v1/responses/{response_id}", self._responses.delete),
            ("POST", "/v1/messages", self._anthropic.messages),
            ("POST", "/v1/messages/count_tokens", self._anthropic.count_tokens),
            ("POST", "/v1/embeddings", self._retrieval.embeddings),
            ("POST", "/v1/rerank", self._retrieval.rerank_v1),
            ("POST", "/v2/rerank", self._retrieval.rerank_v2),
            ("GET", "/v1/models", self._models),
            ("GET", "/v1/models/{model}", self._model),
            ("POST", "/v1/completions/render", self._render_completion),
            ("POST", "/v1/chat/completions/render", self._render_chat),
            ("POST", "/tokenize", self._tokenize),
            ("POST", "/detokenize", self._detokenize),
            ("GET", "/health", self._health),
            ("GET", "/version", self._version),
            ("GET", "/metrics", self._metrics),
            ("HEAD", "/", self._root),
        ]

    def app(self) -> ASGIApp:
        route = self._calls.route
        routes = [
            Route(path, route(method, path, handler, _answer_of(path)), methods=[method])
            for method, path, handler in self.table()
        ]
        handlers = {HTTPException: _no_such_route, Exception: _escaped}
        app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
        return keeping_raw_send(app)

    # ---- generation -------------------------------------------------------------

    async def _completions(self, request: Request, body: Any) -> Response:
        return await self._generate(request, body, chat=False)

    async def _chat(self, request: Request, body: Any) -> Response:
        return await self._generate(request, body, chat=True)

    async def _generate(self, request: Request, body: Any, chat: bool) -> Response:
        call = current_call()
        request_id = request.headers.get("x-request-id")
        parsed = parse(body, chat, call.tenant, request_id, call.priority_hint)
        call.name_fields(parsed.field_of)
        if parsed.stream:
            return await self._stream(call, request, parsed)
        result = await unless_gone(request, self._manager.infer(parsed.inference))
        logprobs = parsed.inference.params.logprobs
        return JSONResponse(
            unary_json(chat, result, logprobs), headers={"x-request-id": result.request_id}
        )

    async def _stream(self, call: Call, request: Request, parsed: ParsedRequest) -> Response:
        request_id, chunks = self._manager.infer_stream(parsed.inference)
        first = await first_chunk(request, chunks)
        stream = EventStream(
            parsed.chat,
            request_id,
            parsed.inference.model,
            parsed.inference.params.logprobs,
            parsed.include_usage,
        )
        return EventStreamResponse(
            call,
            stream.first(),
            chunk_events(stream, first, chunks),
            stream.error,
            headers={"x-request-id": request_id},
        )

    # ---- models and tokens ----------------------------------------------------------

    async def _models(self, request: Request, body: None) -> Response:
        may_use = current_call().principal.may_use
        visible = (s for s in self._manager.list_models() if may_use(s.name))
        return Response(self._listed.answer(visible), media_type="application/json")

    async def _model(self, request: Request, body: None) -> Response:
        name = request.path_params["model"]  # one the caller may see (http/calls.py)
        return JSONResponse(_model_card(self._manager.model_status(name)))

    async def _tokenize(self, request: Request, body: Any) -> Response:
        asked = _validated(TokenizeBody, body)
        messages = tuple(
            ChatMessage(str(m.get("role", "")), str(m.get("content", "")))
            for m in asked.messages or ()
        )
        result = await self._manager.tokenize(asked.model, asked.prompt or "", messages)
        status = self._manager.model_status(asked.model)
        context = status.capabilities.context_length if status.capabilities else 0
        return JSONResponse(
            {
                "count": len(result.token_ids),
                "max_model_len": context or None,
                "tokens": list(result.token_ids),
                "token_strs": None,
            }
        )

    async def _render_completion(self, request: Request, body: Any) -> Response:
        """vLLM's `/v1/completions/render`: a completion's body, answered with the token
        ids its prompt feeds the engine, one entry per prompt (inferwire takes one)."""
        return JSONResponse([await self._render(request, body, chat=False)])

    async def _render_chat(self, request: Request, body: Any) -> Response:
        """vLLM's `/v1/chat/completions/render`: a chat body, answered with the token ids
        of its messages through the model's chat template (and tools), as generation."""
        return JSONResponse(await self._render(request, body, chat=True))

    async def _render(self, request: Request, body: Any, chat: bool) -> dict[str, Any]:
        call = current_call()
        request_id = request.headers.get("x-request-id")
        parsed = parse(body, chat, call.tenant, request_id, call.priority_hint)
        call.name_fields(parsed.field_of)
        rendered = await self._manager.render(parsed.inference)
        return {"model": parsed.inference.model, "token_ids": list(rendered.token_ids)}

    async def _detokenize(self, request: Request, body: Any) -> Response:
        asked = _validated(DetokenizeBody, body)
        return JSONResponse({"prompt": await self._manager.detokenize(asked.model, asked.tokens)})

    # ---- the server --------------------------------------------------------------------

    async def _health(self, request: Request, body: None) -> Response:
        return Response(status_code=200 if self._manager.serving else 503)

    async def _version(self, request: Request, body: None) -> Response:
        return JSONResponse({"version": __version__})

    async def _metrics(self, request: Request, body: None) -> Response:
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)

    async def _root(self, request: Request, body: None) -> Response:
        """`HEAD /`: the server is there (Claude Code probes it before its first request)."""
        return Response(status_code=200)


def _answer_of(path: str) -> ErrorAnswer:
    """How a route writes its errors: Anthropic's routes in Anthropic's shape."""
    return anthropic_answer if path in ANTHROPIC_PATHS else http_answer


async def _no_such_route(request: Request, exc: HTTPException) -> Response:
    """Starlette's routing refusals (404, 405) as OpenAI's error body: no call serves them,
    so they are answered through the one table here."""
    where = f"{request.method} {request.url.path}"[:256]
    refusal = (
        MethodNotAllowedError(f"{where}: the route does not take {request.method}", None)
        if exc.status_code == 405
        else NotFoundError(f"{where}: no such route", None)
    )
    status, body, _ = http_answer(error_reply(refusal))
    return JSONResponse(body, status_code=status, headers=exc.headers)


async def _escaped(request: Request, exc: Exception) -> Response:
    """What escaped a handler (a bug; uvicorn logs its stack): 500, as OpenAI's body."""
    status, body, _ = http_answer(ErrorReply(Code.INTERNAL, INTERNAL_MESSAGE))
    return JSONResponse(body, status_code=status)


def _models_list(statuses: Iterable[ModelStatus]) -> bytes:
    return bytes(JSONResponse({"object": "list", "data": [_model_card(s) for s in statuses]}).body)


def _model_card(status: ModelStatus) -> dict[str, Any]:
    capabilities = status.capabilities
    return {
        "id": status.name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "inferwire",
        "root": status.base_model or status.name,
        "parent": status.base_model or None,
        "max_model_len": capabilities.context_length or None if capabilities else None,
    }


def _validated(model: Callable[..., Any], body: Any) -> Any:
    try:
        return model.model_validate(body)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise validation_error(exc) from None
