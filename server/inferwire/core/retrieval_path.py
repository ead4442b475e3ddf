"""An embedding or rerank request's path through the core, beside a generation's
(core/request_path.py) and through the same gate (core/request_gate.py): the same shape
check first, the same tenant quotas (its inputs' tokens count as a prompt's), the same
on-demand load within the memory budget, the same READY check (fail-closed), the same
concurrency slots and fair queue, the same record handed to the same listeners and the
same failure breaker. What differs is only what runs in the slot: the backend's `embed` or
`rerank` (core/backend.py) instead of a generation, and what the model must be: a model
of another kind is refused, naming its kind, before it takes a slot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from inferwire.core.embeddings import (
    EmbeddingRequest,
    EmbeddingResult,
    EncodingJob,
    RerankRequest,
    RerankResult,
    input_limit_violations,
    kind_refusal,
    ranked,
    validate_embedding_request,
    validate_rerank_request,
)
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.facts import ModelFacts
from inferwire.core.models import ManagedModel
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.request_gate import RequestGate
from inferwire.core.validation import RequestLimits

ENCODE = "encode"  # the span of the backend's embed or rerank

# What a request needs of its model once it is READY; raises InvalidArgumentError.
ModelCheck = Callable[[ManagedModel, ModelFacts], None]


class RetrievalPath:
    """Runs embedding and rerank requests on the manager's models."""

    def __init__(self, gate: RequestGate, limits: RequestLimits) -> None:
        self._gate = gate
        self._limits = limits

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """One embedding per input, in order."""
        record = self._arrived(request, len(request.inputs))

        def check(model: ManagedModel, facts: ModelFacts) -> None:
            capabilities = facts.capabilities
            if not capabilities.embeddings:
                raise kind_refusal(model.name, capabilities.kind, "make embeddings")
            violations = input_limit_violations(
                model.name, len(request.inputs), "inputs", facts.limits.max_inputs
            )
            dimensions = capabilities.embedding_dimensions
            if request.dimensions is not None and request.dimensions != dimensions:
                violations.append(
                    FieldViolation(
                        "dimensions",
                        f"model {model.name!r} makes embeddings of {dimensions} dimensions "
                        "and cannot shorten them; leave dimensions out",
                    )
                )
            if violations:
                raise InvalidArgumentError(violations)

        validate = functools.partial(validate_embedding_request, request, self._limits)
        async with self._gate.admitted(request, record, validate, check) as held:
            model = held.model
            job = EncodingJob(
                request_id=record.request_id,
                inputs=request.inputs,
                fields=tuple(f"inputs[{i}]" for i in range(len(request.inputs))),
                normalize=request.normalize,
                truncate=request.truncate,
                deadline=request.deadline,
            )
            with self._gate.tracer.span(ENCODE):
                vectors = await model.backend.embed(job, record)
            if len(vectors) != len(request.inputs):  # a backend's bug: INTERNAL
                raise RuntimeError(f"{len(vectors)} embeddings for {len(request.inputs)} inputs")
            record.end(Outcome.ANSWERED)
            return EmbeddingResult(
                record.request_id, request.model, tuple(vectors), record.usage(), record.timing()
            )

    async def rerank(self, request: RerankRequest) -> RerankResult:
        """The documents most relevant to the query first, each with its score."""
        count = len(request.documents)
        record = self._arrived(request, 1 + count)

        def check(model: ManagedModel, facts: ModelFacts) -> None:
            if not facts.capabilities.rerank:
                raise kind_refusal(model.name, facts.capabilities.kind, "rerank documents")
            limit = facts.limits.max_inputs
            # The query is one more input of the model's batch.
            if violations := input_limit_violations(
                model.name, count, "documents", limit - 1 if limit else 0
            ):
                raise InvalidArgumentError(violations)

        validate = functools.partial(validate_rerank_request, request, self._limits)
        async with self._gate.admitted(request, record, validate, check) as held:
            model = held.model
            job = EncodingJob(
                request_id=record.request_id,
                inputs=(request.query, *request.documents),
                fields=("query", *(f"documents[{i}]" for i in range(count))),
                normalize=None,
                truncate=request.truncate,
                deadline=request.deadline,
            )
            with self._gate.tracer.span(ENCODE):
                scores = await model.backend.rerank(job, record)
            if len(scores) != count:  # a backend's bug: INTERNAL
                raise RuntimeError(f"{len(scores)} scores for {count} documents")
            record.end(Outcome.ANSWERED)
            return RerankResult(
                record.request_id,
                request.model,
                ranked(scores, request.top_n),
                record.usage(),
                record.timing(),
            )

    def _arrived(self, request: EmbeddingRequest | RerankRequest, inputs: int) -> RequestRecord:
        record = self._gate.arrived(request)
        record.inputs = inputs
        return record
