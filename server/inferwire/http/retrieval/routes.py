"""Embeddings and rerank on the HTTP door: OpenAI's `POST /v1/embeddings`, Jina's and
Cohere's v1 rerank (`POST /v1/rerank`, as vLLM and llama.cpp serve it) and Cohere's v2
(`POST /v2/rerank`).

A thin adapter over the core's embedding and rerank path (core/retrieval_path.py), the
same one gRPC's Embed and Rerank take: each route is the edge's one call with its row of
the edge's table (edge/methods.py), so tokens, tenants, quotas, priorities, on-demand
loads, metrics, the access line and traces are every other route's. The bodies are read by
retrieval/input.py; the answers are written here.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.core.embeddings import EmbeddingResult, RerankResult, Vector
from inferwire.core.manager import ModelManager
from inferwire.edge.calls import current_call
from inferwire.http.retrieval.input import embeddings_request, rerank_request
from inferwire.http.streams import unless_gone

_LITTLE_ENDIAN = sys.byteorder == "little"


class RetrievalApi:
    """The embeddings and rerank routes' handlers over one model manager."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    async def embeddings(self, request: Request, body: Any) -> Response:
        call = current_call()
        asked = embeddings_request(
            body, call.tenant, request.headers.get("x-request-id"), call.priority_hint
        )
        call.name_fields(asked.field_of)
        result = await unless_gone(request, self._manager.embed(asked.request))
        return JSONResponse(
            embeddings_json(result, asked.base64), headers={"x-request-id": result.request_id}
        )

    async def rerank_v1(self, request: Request, body: Any) -> Response:
        return await self._rerank(request, body, version=1)

    async def rerank_v2(self, request: Request, body: Any) -> Response:
        return await self._rerank(request, body, version=2)

    async def _rerank(self, request: Request, body: Any, version: int) -> Response:
        call = current_call()
        asked = rerank_request(
            body, call.tenant, request.headers.get("x-request-id"), call.priority_hint, version
        )
        call.name_fields(asked.field_of)
        result = await unless_gone(request, self._manager.rerank(asked.request))
        documents = asked.request.documents if asked.return_documents else None
        return JSONResponse(
            rerank_json(result, documents, version), headers={"x-request-id": result.request_id}
        )


def embeddings_json(result: EmbeddingResult, as_base64: bool) -> dict[str, Any]:
    """OpenAI's embeddings answer: a list of `embedding` objects, in the inputs' order."""
    tokens = result.usage.prompt_tokens
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": _base64(vector) if as_base64 else vector.tolist(),
            }
            for index, vector in enumerate(result.embeddings)
        ],
        "model": result.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def rerank_json(
    result: RerankResult, documents: tuple[str, ...] | None, version: int
) -> dict[str, Any]:
    """Jina's and vLLM's rerank answer (`id`, `model`, `usage`, `results`), with Cohere's
    `meta` (its SDKs read it): each result's `index` and `relevance_score`, and with
    `return_documents` its `document`."""
    results = []
    for scored in result.results:
        entry: dict[str, Any] = {
            "index": scored.index,
            "relevance_score": scored.relevance_score,
        }
        if documents is not None:
            entry["document"] = {"text": documents[scored.index]}
        results.append(entry)
    tokens = result.usage.prompt_tokens
    return {
        "id": result.request_id,
        "model": result.model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "meta": {
            "api_version": {"version": str(version)},
            "billed_units": {"input_tokens": tokens, "search_units": 1},
        },
    }


def _base64(vector: Vector) -> str:
    """Little-endian float32, base64: what OpenAI's SDKs decode (`numpy.frombuffer`)."""
    if not _LITTLE_ENDIAN:
        vector = _swapped(vector)
    return base64.b64encode(vector.tobytes()).decode("ascii")


def _swapped(vector: Vector) -> Vector:
    copy = vector[:]
    copy.byteswap()
    return copy
