"""Embedding and rerank requests as they reach the core, as a backend runs them, and what
they answer; the rules their fields must satisfy, written once for both doors.

An `EmbeddingRequest` asks for one vector per input (a text, or token ids the HTTP door
takes as OpenAI's `input` allows); a `RerankRequest` asks how relevant each document is to
a query. The core checks their shape (`embedding_violations`, `rerank_violations`), then
its path (core/retrieval_path.py) admits them like a generation and hands the backend an
`EncodingJob`: the inputs, each named by the request field it came from, so a backend's
refusal of one input (too long, a token id outside the vocabulary) names it. A backend
that embeds reranks by default with the cosine of the query's and each document's
embeddings (`cosine_scores`, as vLLM's score API does for embedding models); a
cross-encoder backend scores the pairs itself.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import Priority
from inferwire.core.results import Timing, Usage
from inferwire.core.tracing import Tracer
from inferwire.core.validation import (
    MAX_REQUEST_ID_CHARS,
    NUL,
    NUL_PROBLEM,
    RequestLimits,
    model_name_problem,
)

# An input: its text, or the token ids it is (OpenAI's `input` as token arrays).
EmbeddingInput = str | tuple[int, ...]
# One embedding: float32 values (`array('f')`), as the wire carries them.
Vector: TypeAlias = "array[float]"

MAX_INPUTS = 2048  # inputs of one request, whatever the model allows (OpenAI's limit)
MAX_DOCUMENTS = 1000  # documents of one rerank request


@dataclass(frozen=True)
class EmbeddingRequest:
    """One embedding request, its inputs in order."""

    request_id: str
    model: str
    inputs: tuple[EmbeddingInput, ...]
    normalize: bool | None = None  # None: the model's default
    truncate: bool = False  # cut an input longer than the window instead of refusing it
    dimensions: int | None = None  # the length asked for (OpenAI's): only the model's own
    deadline: float | None = None  # time.monotonic() by which the caller needs the result
    tenant: str = ""
    priority: Priority | None = None
    priority_hint: Priority | None = None


@dataclass(frozen=True)
class RerankRequest:
    """One rerank request: a query and the documents to score against it."""

    request_id: str
    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None  # only the top_n most relevant; None: every document
    truncate: bool = False
    deadline: float | None = None
    tenant: str = ""
    priority: Priority | None = None
    priority_hint: Priority | None = None


@dataclass(frozen=True)
class EncodingJob:
    """What a backend runs for either kind of request: inputs, each with the request field
    it came from (`inputs[2]`, `query`, `documents[0]`) for its refusals."""

    request_id: str
    inputs: tuple[EmbeddingInput, ...]
    fields: tuple[str, ...]
    normalize: bool | None  # None: the model's default
    truncate: bool
    deadline: float | None = None


@dataclass(frozen=True)
class Scored:
    """One document's relevance to the query: its index in the request, its score."""

    index: int
    relevance_score: float


@dataclass(frozen=True)
class EmbeddingResult:
    request_id: str
    model: str
    embeddings: tuple[Vector, ...]
    usage: Usage  # prompt_tokens: every input's tokens, as the model saw them
    timing: Timing


@dataclass(frozen=True)
class RerankResult:
    request_id: str
    model: str
    results: tuple[Scored, ...]  # most relevant first; top_n of them when asked
    usage: Usage
    timing: Timing


class EncodingProgress(Protocol):
    """What a backend tells the core about an encoding job besides its answer (the
    request's record implements it)."""

    tracer: Tracer

    def counted(
        self, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        """Its inputs are `prompt_tokens` tokens, as the model sees them."""

    def batched(self, inputs: int) -> None:
        """Its inputs ran in an engine batch of `inputs` inputs (its own and others')."""


def validate_embedding_request(request: EmbeddingRequest, limits: RequestLimits) -> None:
    """Raise InvalidArgumentError listing every invalid field of the request."""
    violations = list(_common(request.model, request.request_id))
    if not request.inputs:
        violations.append(FieldViolation("inputs", "must hold at least one input"))
    elif len(request.inputs) > MAX_INPUTS:
        violations.append(_too_many("inputs", len(request.inputs), MAX_INPUTS))
    for index, given in enumerate(request.inputs[:MAX_INPUTS]):
        violations += _input_violations(f"inputs[{index}]", given, limits)
    if request.dimensions is not None and request.dimensions < 1:
        violations.append(FieldViolation("dimensions", "must be at least 1"))
    if violations:
        raise InvalidArgumentError(violations[:16])


def validate_rerank_request(request: RerankRequest, limits: RequestLimits) -> None:
    """Raise InvalidArgumentError listing every invalid field of the request."""
    violations = list(_common(request.model, request.request_id))
    violations += _input_violations("query", request.query, limits)
    if not request.documents:
        violations.append(FieldViolation("documents", "must hold at least one document"))
    elif len(request.documents) > MAX_DOCUMENTS:
        violations.append(_too_many("documents", len(request.documents), MAX_DOCUMENTS))
    for index, document in enumerate(request.documents[:MAX_DOCUMENTS]):
        violations += _input_violations(f"documents[{index}]", document, limits)
    if request.top_n is not None and request.top_n < 1:
        violations.append(FieldViolation("top_n", "must be at least 1"))
    if violations:
        raise InvalidArgumentError(violations[:16])


def input_limit_violations(
    model: str, count: int, field: str, max_inputs: int
) -> list[FieldViolation]:
    """A request's inputs against the model's own limit (`max_inputs`; 0: none)."""
    if max_inputs and count > max_inputs:
        why = f"has {count} entries; model {model!r} takes at most {max_inputs} in one request"
        return [FieldViolation(field, why)]
    return []


def _common(model: str, request_id: str) -> Iterator[FieldViolation]:
    if (problem := model_name_problem(model)) is not None:
        yield FieldViolation("model", problem)
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        yield FieldViolation("request_id", f"must be at most {MAX_REQUEST_ID_CHARS} characters")


def _too_many(field: str, count: int, limit: int) -> FieldViolation:
    return FieldViolation(field, f"has {count} entries; at most {limit} are allowed")


def _input_violations(
    field: str, given: EmbeddingInput, limits: RequestLimits
) -> Iterator[FieldViolation]:
    if isinstance(given, str):
        if not given:
            yield FieldViolation(field, "must be a non-empty string")
        elif (size := len(given.encode(errors="surrogatepass"))) > limits.max_prompt_bytes:
            yield FieldViolation(
                field, f"is {size} bytes; the limit is {limits.max_prompt_bytes} bytes"
            )
        elif NUL in given:
            yield FieldViolation(field, NUL_PROBLEM)
    elif not given:
        yield FieldViolation(field, "must hold at least one token id")
    elif any(token < 0 for token in given):
        yield FieldViolation(field, "token ids are never negative")


def normalized(values: Sequence[float]) -> Vector:
    """`values` scaled to length 1 (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(v * v for v in values))
    return array("f", (v / norm for v in values) if norm else values)


def cosine_scores(query: Sequence[float], documents: Sequence[Sequence[float]]) -> list[float]:
    """The cosine of the query's embedding and each document's."""
    query_norm = math.sqrt(math.fsum(q * q for q in query)) or 1.0
    scores = []
    for document in documents:
        norm = math.sqrt(math.fsum(d * d for d in document)) or 1.0
        dot = math.fsum(q * d for q, d in zip(query, document, strict=True))
        scores.append(dot / (query_norm * norm))
    return scores


def ranked(scores: Sequence[float], top_n: int | None) -> tuple[Scored, ...]:
    """The documents most relevant first (the earlier one first at a tie), top_n of them."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return tuple(Scored(i, scores[i]) for i in order[: top_n or len(order)])


def kind_refusal(model: str, kind: str, asked: str) -> InvalidArgumentError:
    """A model of the other kind, asked to `asked` (`embed`, `rerank`, `generate text`)."""
    hint = {
        "a generation model": "call Infer or InferStream (POST /v1/completions, "
        "/v1/chat/completions)",
        "an embedding model": "call Embed or Rerank (POST /v1/embeddings, /v1/rerank)",
    }.get(kind, "")
    why = f"model {model!r} is {kind}: it does not {asked}" + (f"; {hint}" if hint else "")
    return InvalidArgumentError([FieldViolation("model", why)])
