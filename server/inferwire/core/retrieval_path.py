"""An embedding or rerank request's path through the core, beside a generation's
(core/request_path.py), on the same parts: the same shape check first, the same tenant
quotas (its inputs' tokens count as a prompt's), the same on-demand load within the memory
budget, the same READY check (fail-closed), the same concurrency slots and fair queue,
the same record handed to the same listeners (metrics, the access line, the span) and the
same failure breaker. What differs is only what runs in the slot: the backend's `embed` or
`rerank` (core/backend.py) instead of a generation, and what the model must be: a model
of another kind is refused, naming its kind, before it takes a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

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
from inferwire.core.errors import DeadlineExceededError, FieldViolation, InvalidArgumentError
from inferwire.core.facts import ModelFacts
from inferwire.core.lifecycle import Lifecycle
from inferwire.core.metrics import MetricsListener
from inferwire.core.models import ManagedModel, find_model
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.tenants import TenantRequest, Tenants, admitted
from inferwire.core.tracing import Tracer
from inferwire.core.validation import RequestLimits

log = logging.getLogger("inferwire.core.manager")  # readiness changes: the manager's log

ENCODE = "encode"  # the span of the backend's embed or rerank

# What a request needs of its model once it is READY; raises InvalidArgumentError.
ModelCheck = Callable[[ManagedModel, ModelFacts], None]


class RetrievalPath:
    """Runs embedding and rerank requests on the manager's models."""

    def __init__(
        self,
        models: Mapping[str, ManagedModel],
        limits: RequestLimits,
        tenants: Tenants,
        lifecycle: Lifecycle,
        publish_health: Callable[[], Awaitable[None]],
        metrics: MetricsListener,
        tracer: Tracer,
    ) -> None:
        self._models = models
        self._limits = limits
        self._tenants = tenants
        self._lifecycle = lifecycle
        self._publish_health = publish_health
        self._metrics = metrics
        self._tracer = tracer

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
        async with self._admitted(request, record, validate, check) as model:
            job = EncodingJob(
                request_id=record.request_id,
                inputs=request.inputs,
                fields=tuple(f"inputs[{i}]" for i in range(len(request.inputs))),
                normalize=request.normalize,
                truncate=request.truncate,
                deadline=request.deadline,
            )
            with self._tracer.span(ENCODE):
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
        async with self._admitted(request, record, validate, check) as model:
            job = EncodingJob(
                request_id=record.request_id,
                inputs=(request.query, *request.documents),
                fields=("query", *(f"documents[{i}]" for i in range(count))),
                normalize=None,
                truncate=request.truncate,
                deadline=request.deadline,
            )
            with self._tracer.span(ENCODE):
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
        tenant = self._tenants.of(request)  # counted for it even if refused before its quota
        record = RequestRecord(
            tenant=tenant.name,
            tenant_label=tenant.label,
            request_id=request.request_id or uuid.uuid4().hex,
            model=request.model,
            deadline=request.deadline,
            configured=request.model in self._models,
            tracer=self._tracer,
        )
        record.inputs = inputs
        return record

    @contextlib.asynccontextmanager
    async def _admitted(
        self,
        request: TenantRequest,
        record: RequestRecord,
        validate: Callable[[], None],
        check: ModelCheck,
    ) -> AsyncIterator[ManagedModel]:
        """Validate, check the tenant's quota, load the model if needed, check it is READY
        and of the kind the request needs, and hold a slot while the request runs; whatever
        happens, end its record once and tell the listeners (as a generation's)."""
        model: ManagedModel | None = None
        try:
            validate()
            model = find_model(self._models, record.model)
            with admitted(self._tenants, request, record) as admission:
                model.used(time.monotonic(), time.time())
                record.load_s = await self._lifecycle.ensure_loaded(model, record.deadline)
                check(model, model.require_ready())
                async with model.slot(self._tracer, admission.claim):
                    record.admitted = time.perf_counter()
                    model.request_started(record)
                    yield model
        except asyncio.CancelledError:
            record.end(Outcome.CANCELLED)
            raise
        except DeadlineExceededError:
            record.end(Outcome.DEADLINE_EXCEEDED if record.admitted else Outcome.REJECTED)
            raise
        except Exception as error:
            record.end(Outcome.ERROR if record.admitted else Outcome.REJECTED)
            if record.admitted and model is not None and model.request_failed(error):
                log.warning(
                    "model not ready: its requests fail",
                    extra={"model": model.name, "error": str(error)},
                )
                await self._publish_health()
            raise
        else:
            if model is not None and model.request_succeeded():
                await self._publish_health()
        finally:
            record.end(Outcome.ERROR)  # ended without an answer
            if model is not None:
                model.request_ended(record)
                model.used(time.monotonic(), time.time())
                if not model.busy:
                    self._lifecycle.residency.memory_may_have_freed()
            self._metrics.request_finished(record)
            self._tracer.request_finished(record)
