"""OpenAI's embeddings body, and Jina's, Cohere's (v1, v2) and vLLM's rerank bodies, as the
core's EmbeddingRequest and RerankRequest.

Embeddings (`POST /v1/embeddings`), as OpenAI's: `input` a string, a list of strings, a
list of token ids (one input) or a list of them; `encoding_format` `float` (the default) or
`base64` (little-endian float32, as OpenAI's SDKs decode it); `dimensions` taken only when it
is the model's own length (the core refuses any other, naming it: no inferwire model
shortens its embeddings); `user` ignored. TEI's `truncate` and `normalize` and inferwire's
`request_id` and `priority` are taken too.

Rerank (`POST /v1/rerank`, `POST /v2/rerank`): `query`, `documents` (strings, or objects
with `text`), `top_n`, `return_documents` (default true on v1, as Jina's and vLLM's; false
on v2, as Cohere's), `truncate`; Cohere's `max_tokens_per_doc` is refused (use
`truncate`: a document is cut at the model's window).

The core's field names are renamed to the body's (`inputs[2]` -> `input[2]`, or `input`
when it was one string), so an error's `param` is a field the caller sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from inferwire.core.embeddings import EmbeddingInput, EmbeddingRequest, RerankRequest
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import Priority
from inferwire.http.bodies import BodyModel
from inferwire.http.requests import (
    log_ignored,
    priority_of,
    request_id_violation,
    validation_error,
)


class EmbeddingsBody(BodyModel):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate: bool = False  # TEI's
    normalize: bool | None = None  # TEI's and vLLM's
    request_id: str | None = None
    priority: str | int | None = None


class DocumentObject(BodyModel):
    text: str


class RerankBody(BodyModel):
    model: str
    query: str
    documents: list[str | DocumentObject]
    top_n: int | None = None
    return_documents: bool | None = None
    max_tokens_per_doc: int | None = None  # Cohere v2's: refused (see the module)
    truncate: bool = False
    request_id: str | None = None
    priority: str | int | None = None


@dataclass(frozen=True)
class ParsedEmbeddings:
    """An embeddings body as the core's request, and how its answer is written."""

    request: EmbeddingRequest
    base64: bool
    one_string: bool  # `input` was one string: the core's `inputs[0]` is the body's `input`

    def field_of(self, core_field: str) -> str:
        """The body's field that the core's field `core_field` came from."""
        if core_field.startswith("inputs"):
            if self.one_string and core_field == "inputs[0]":
                return "input"
            return "input" + core_field.removeprefix("inputs")
        return core_field


@dataclass(frozen=True)
class ParsedRerank:
    """A rerank body as the core's request, and whether its answer holds the documents."""

    request: RerankRequest
    return_documents: bool
    objects: bool  # documents given as {text} objects: `documents[i]` is `documents[i].text`

    def field_of(self, core_field: str) -> str:
        if self.objects and core_field.startswith("documents["):
            return core_field + ".text"
        return core_field


def embeddings_request(
    body: Any, tenant: str, request_id: str | None, priority_hint: Priority | None
) -> ParsedEmbeddings:
    """The request in `body` (decoded JSON); raises InvalidArgumentError naming the field.
    `request_id`: the caller's `X-Request-Id`, which wins over the body's."""
    parsed = _validated(EmbeddingsBody, body)
    assert isinstance(parsed, EmbeddingsBody)
    log_ignored(parsed)
    _refuse_bad_id(parsed.request_id)
    given = parsed.input
    request = EmbeddingRequest(
        request_id=request_id or parsed.request_id or "",
        model=parsed.model,
        inputs=_inputs(given),
        normalize=parsed.normalize,
        truncate=parsed.truncate,
        dimensions=parsed.dimensions,
        tenant=tenant,
        priority=priority_of(parsed.priority),
        priority_hint=priority_hint,
    )
    return ParsedEmbeddings(request, parsed.encoding_format == "base64", isinstance(given, str))


def rerank_request(
    body: Any,
    tenant: str,
    request_id: str | None,
    priority_hint: Priority | None,
    version: int,
) -> ParsedRerank:
    """The request in `body` (decoded JSON) for rerank API `version` (1 or 2)."""
    parsed = _validated(RerankBody, body)
    assert isinstance(parsed, RerankBody)
    log_ignored(parsed)
    _refuse_bad_id(parsed.request_id)
    if parsed.max_tokens_per_doc is not None:
        why = "is not supported; set truncate to cut a document at the model's window"
        raise InvalidArgumentError([FieldViolation("max_tokens_per_doc", why)])
    objects = any(isinstance(d, DocumentObject) for d in parsed.documents)
    documents = tuple(d.text if isinstance(d, DocumentObject) else d for d in parsed.documents)
    request = RerankRequest(
        request_id=request_id or parsed.request_id or "",
        model=parsed.model,
        query=parsed.query,
        documents=documents,
        top_n=parsed.top_n,
        truncate=parsed.truncate,
        tenant=tenant,
        priority=priority_of(parsed.priority),
        priority_hint=priority_hint,
    )
    returned = parsed.return_documents
    return ParsedRerank(request, version == 1 if returned is None else returned, objects)


def _inputs(given: str | list[str] | list[int] | list[list[int]]) -> tuple[EmbeddingInput, ...]:
    """OpenAI's `input` as the core's inputs: a list of ints is one input's token ids."""
    if isinstance(given, str):
        return (given,)
    items: list[str | int | list[int]] = list(given)
    ids = [item for item in items if isinstance(item, int)]
    if items and len(ids) == len(items):
        return (tuple(ids),)
    inputs: list[EmbeddingInput] = []
    for item in items:  # strings, or token-id lists: pydantic took no mix of those and ints
        if isinstance(item, str):
            inputs.append(item)
        elif isinstance(item, list):
            inputs.append(tuple(item))
    return tuple(inputs)


def _validated(shape: type[BodyModel], body: Any) -> BodyModel:
    try:
        return shape.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _refuse_bad_id(request_id: str | None) -> None:
    if (violation := request_id_violation(request_id)) is not None:
        raise InvalidArgumentError([violation])
