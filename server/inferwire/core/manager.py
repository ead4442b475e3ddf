"""The model manager: model lifecycle, admission control and health, transport-neutral.

Each configured model has a state machine (UNLOADED -> LOADING -> READY ->
UNLOADING -> UNLOADED, or FAILED after a bad load), a per-model lock that
serialises loads and unloads, a concurrency limit with a bounded wait queue,
and counters. Health changes are pushed to listeners (the grpc.health.v1
publisher) whenever a model's readiness or the overall serving state changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from inferwire.core.adapters import Adapters, AdapterSettings, AdapterSource
from inferwire.core.backend import Backend, GenerationEvents
from inferwire.core.breaker import FAILURE_COOLDOWN_S
from inferwire.core.errors import ConfigurationError, DeadlineExceededError, ModelNotFoundError
from inferwire.core.generation import generation_request, join, stop_at_sequences
from inferwire.core.lifecycle import HealthHooks, Lifecycle, Trigger
from inferwire.core.memory import MemorySettings
from inferwire.core.metrics import MemoryMetrics, MetricsListener, NoMemoryMetrics, NoMetrics
from inferwire.core.model_reports import backend_health_reports, model_health_report
from inferwire.core.models import ManagedModel
from inferwire.core.quotas import TokenCharge
from inferwire.core.readiness import HealthListener, Readiness
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.reserve import Reservation
from inferwire.core.residency import Residency
from inferwire.core.server_load import ServerLoad, server_load
from inferwire.core.specs import ModelSpec, duplicate_name
from inferwire.core.tenants import Tenants, admitted
from inferwire.core.tracing import GENERATE, NO_TRACER, Tracer
from inferwire.core.types import (
    ChatMessage,
    GenerationRequest,
    HealthReport,
    InferenceRequest,
    InferenceResult,
    InferenceStatistics,
    ModelStatus,
    StreamChunk,
    TextDelta,
    Tokenization,
)
from inferwire.core.validation import (
    RequestLimits,
    require_model_name,
    validate_inference_request,
    validate_text_input,
)

__all__ = ["BackendFactory", "ModelManager", "ModelSpec"]

log = logging.getLogger(__name__)


# Builds the backend for a model; the server passes the backend registry's, tests a fake.
BackendFactory = Callable[[ModelSpec], Backend]


class ModelManager:
    """Holds every configured model and runs requests against them."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        backend_factory: BackendFactory,
        limits: RequestLimits,
        health_check_interval_s: float = 2.0,
        failure_cooldown_s: float | None = None,
        metrics: MetricsListener | None = None,
        tracer: Tracer | None = None,
        keep_text: bool = False,
        memory: MemorySettings | None = None,
        memory_metrics: MemoryMetrics | None = None,
        tenants: Tenants | None = None,
        adapters: AdapterSettings | None = None,
    ) -> None:
        """`keep_text`: keep each request's prompt and output text in its record (for
        `server.log_prompts`); `memory`: the budgets models load within (default: none);
        `tenants`: whose requests share the models, and how (default: no quotas);
        `adapters`: where run-time adapters may come from (default: nowhere)."""
        self._tenants = tenants or Tenants()
        self._limits = limits
        self._metrics: MetricsListener = metrics or NoMetrics()
        self._tracer: Tracer = tracer or NO_TRACER
        self._keep_text = keep_text
        self._failure_cooldown_s = (
            max(FAILURE_COOLDOWN_S, 2 * health_check_interval_s)
            if failure_cooldown_s is None
            else failure_cooldown_s
        )
        if (problem := duplicate_name(specs)) is not None:
            raise ConfigurationError(problem)
        self._models: dict[str, ManagedModel] = {}
        self._adapters = Adapters(self._models, adapters or AdapterSettings(), self._managed)
        # Bases first: an adapter model's backend comes from its base's.
        for spec in sorted(specs, key=lambda s: s.adapter_of is not None):
            if spec.adapter_of is None:
                model = self._managed(spec, backend_factory(spec))
            else:
                model = self._adapters.build(spec)
            self._models[spec.name] = model
            self._model_added(spec.name)
        self._readiness = Readiness(
            self._models, self._metrics, health_check_interval_s, self._failure_cooldown_s
        )
        self._watchers: list[asyncio.Task[None]] = []
        residency = Residency(
            memory or MemorySettings(),
            list(self._models.values()),
            memory_metrics or NoMemoryMetrics(),
        )
        health = HealthHooks(self._readiness.publish, self._readiness.refresh)
        self._lifecycle = Lifecycle(residency, health, self._failure_cooldown_s)

    def _managed(
        self, spec: ModelSpec, backend: Backend, base: ManagedModel | None = None
    ) -> ManagedModel:
        reservation = Reservation.of(
            spec.max_concurrency, spec.reserved_concurrency, self._tenants.interactive_configured
        )
        return ManagedModel(
            spec,
            backend,
            self._metrics.load_changed,
            self._tenants.scheduling.max_wait_s,
            self._tenants.clock,
            base,
            reservation,
        )

    def _model_added(self, name: str) -> None:
        self._metrics.model_added(name)
        self._metrics.readiness_changed(name, False)
        self._metrics.load_changed(name, 0, 0)

    # ---- lifecycle ------------------------------------------------------

    def add_health_listener(self, listener: HealthListener) -> None:
        self._readiness.add_listener(listener)

    async def start(self) -> dict[str, str]:
        """Accept work, load the start-up models and begin watching backend health.

        Returns the start-up models that failed to load, each with why; the caller
        decides whether the server stays up without them.
        """
        self._readiness.accepting = True
        await self._readiness.publish()
        startup = [m.spec.name for m in self._models.values() if m.spec.load_on_startup]
        results = await asyncio.gather(
            *(self.load(name, Trigger.STARTUP) for name in startup), return_exceptions=True
        )
        failures: dict[str, str] = {}
        for name, result in zip(startup, results, strict=True):
            if isinstance(result, BaseException):
                failures[name] = self._models[name].load_error or str(result)
                log.error("start-up load failed", extra={"model": name, "error": failures[name]})
        self._watchers = [
            asyncio.create_task(self._readiness.watch_backends(), name="health-watcher"),
            asyncio.create_task(
                self._lifecycle.unload_idle_models(self._models.values()), name="idle-unloads"
            ),
        ]
        return failures

    async def begin_shutdown(self) -> None:
        """Stop reporting SERVING; in-flight requests keep running."""
        self._readiness.accepting = False
        await self._readiness.publish()

    async def close(self) -> None:
        """Stop the health watcher and release every model (see Backend.release)."""
        for watcher in self._watchers:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        # Adapters first: a base with adapters loaded is not unloaded.
        for name in sorted(self._models, key=lambda n: self._models[n].base is None):
            try:
                await self.unload(name, shutting_down=True)
            except Exception:
                log.exception("unload at shutdown failed", extra={"model": name})

    # ---- model management ----------------------------------------------

    def list_models(self) -> list[ModelStatus]:
        return [model.status() for model in self._models.values()]

    def model_status(self, name: str) -> ModelStatus:
        return self._get(name).status()

    def statistics(self, name: str = "") -> list[InferenceStatistics]:
        models = [self._get(name)] if name else list(self._models.values())
        return [m.statistics.report() for m in models]

    async def load(self, name: str, trigger: Trigger = Trigger.EXPLICIT) -> ModelStatus:
        """Load a configured model. Idempotent; serialised with unloads of the same model."""
        return (await self.load_evicting(name, trigger))[0]

    async def load_evicting(
        self, name: str, trigger: Trigger = Trigger.EXPLICIT, adapter: AdapterSource | None = None
    ) -> tuple[ModelStatus, list[str]]:
        """Load a model; its status, and the models evicted to make room for it.

        With `adapter`, first register `name` as an adapter model from that source (see
        core/adapters.py); a registration whose load fails is dropped again."""
        if adapter is not None and (spec := self._adapters.registration(name, adapter)):
            self._lifecycle.residency.add(self._adapters.add(spec))
            self._model_added(name)
        model = self._get(name)
        try:
            evicted = await self._lifecycle.load(model, trigger)
        except BaseException:
            self._forget(model)  # a run-time registration that failed to load goes
            raise
        return model.status(), evicted

    async def unload(self, name: str, shutting_down: bool = False) -> ModelStatus:
        """Unload a model: refuse new requests at once, let in-flight ones finish. Idempotent.

        At server shutdown the backend only releases the model (see Backend.release).
        """
        model = self._get(name)
        await self._lifecycle.unload(model, shutting_down)
        status = model.status()
        if self._forget(model):
            await self._readiness.publish()
        return status

    def _forget(self, model: ManagedModel) -> bool:
        """Drop an unloaded run-time adapter model: it lives until unloaded."""
        if not self._adapters.forget(model):
            return False
        self._lifecycle.residency.remove(model)
        return True

    # ---- inference -------------------------------------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        """Unary generation through the backend's own `infer`."""
        record = self._arrived(request)
        async with self._admitted(request, record) as (model, job, _):
            text, end, logprobs = await join(self._events(model, job, record, unary=True), record)
            record.counted(end.usage.prompt_tokens, end.usage.completion_tokens)
            if record.text is not None:
                record.text.append(text)
            record.end(Outcome.finished(end.finish_reason))
            return InferenceResult(
                request_id=record.request_id,
                model=request.model,
                backend=model.spec.backend,
                text=text,
                finish_reason=end.finish_reason,
                usage=record.usage(),
                timing=record.timing(),
                logprobs=logprobs,
            )

    def infer_stream(
        self, request: InferenceRequest
    ) -> tuple[str, AsyncGenerator[StreamChunk, None]]:
        """Return the request ID in use and its chunks; the last chunk carries the outcome."""
        record = self._arrived(request)
        return record.request_id, self._stream(request, record)

    async def _stream(
        self, request: InferenceRequest, record: RequestRecord
    ) -> AsyncGenerator[StreamChunk, None]:
        async with self._admitted(request, record) as (model, job, charge):
            events = self._events(model, job, record, unary=False)
            kept = record.text
            async with contextlib.aclosing(events):
                async for event in events:
                    if isinstance(event, TextDelta):
                        if event.completion_tokens is not None:
                            record.completion_tokens = event.completion_tokens
                            charge.up_to(event.completion_tokens)  # as they are produced
                        if kept is not None:
                            kept.append(event.text)
                        yield StreamChunk(
                            event.text, logprobs=event.logprobs, tokens=event.completion_tokens
                        )
                    else:
                        record.counted(event.usage.prompt_tokens, event.usage.completion_tokens)
                        record.end(Outcome.finished(event.finish_reason))
                        yield StreamChunk(
                            "",
                            finish_reason=event.finish_reason,
                            usage=record.usage(),
                            timing=record.timing(),
                        )

    async def tokenize(
        self, model_name: str, prompt: str, messages: tuple[ChatMessage, ...]
    ) -> Tokenization:
        """The token ids a model sees for a prompt, or for messages through its chat template.

        Takes no concurrency slot: tokenizing costs little next to generating.
        """
        validate_text_input(model_name, prompt, messages, self._limits)
        model = self._get(model_name)
        model.used(time.monotonic(), time.time())
        await self._lifecycle.ensure_loaded(model, deadline=None)
        model.require_ready()
        rendered = model.backend.render_chat(messages) if messages else ""
        token_ids = await model.backend.tokenize(rendered if messages else prompt)
        return Tokenization(tuple(token_ids), rendered)

    async def detokenize(self, model_name: str, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` for a model (vLLM's /detokenize); takes no slot either."""
        model = self._get(model_name)
        model.used(time.monotonic(), time.time())
        await self._lifecycle.ensure_loaded(model, deadline=None)
        model.require_ready()
        return await model.backend.detokenize(token_ids)

    def _arrived(self, request: InferenceRequest) -> RequestRecord:
        tenant = self._tenants.of(request)  # counted for it even if refused before its quota
        return RequestRecord(
            tenant=tenant.name,
            tenant_label=tenant.label,
            request_id=request.request_id or uuid.uuid4().hex,
            model=request.model,
            deadline=request.deadline,
            configured=request.model in self._models,
            prompt=request.prompt if self._keep_text else "",
            text=[] if self._keep_text else None,
            tracer=self._tracer,
        )

    @staticmethod
    def _events(
        model: ManagedModel, job: GenerationRequest, record: RequestRecord, unary: bool
    ) -> GenerationEvents:
        backend = model.backend
        events = (backend.infer if unary else backend.infer_stream)(job, record)
        stops = job.params.stop
        # Without stop strings the backend's events pass as they are: no extra
        # generator hop on every token.
        return stop_at_sequences(events, stops, record) if stops else events

    @contextlib.asynccontextmanager
    async def _admitted(
        self, request: InferenceRequest, record: RequestRecord
    ) -> AsyncIterator[tuple[ManagedModel, GenerationRequest, TokenCharge]]:
        """Validate, check the tenant's quota, queue for a slot and run one request, unary
        or streamed; whatever happens, end its record once and tell the listeners."""
        model: ManagedModel | None = None
        try:
            validate_inference_request(request, self._limits)
            model = self._get(request.model)
            with admitted(self._tenants, request, record) as admission:
                model.used(time.monotonic(), time.time())
                record.load_s = await self._lifecycle.ensure_loaded(model, request.deadline)
                facts = model.require_ready()
                job = generation_request(model, facts, request, record.request_id)
                async with model.slot(self._tracer, admission.claim) as grant:
                    record.admitted = time.perf_counter()
                    model.request_started(record)
                    if grant.reserved:  # the backend starts it without waiting for others
                        job = dataclasses.replace(job, reserved=True)
                    with self._tracer.span(GENERATE):
                        yield model, job, admission.charge
        except (GeneratorExit, asyncio.CancelledError):
            # The caller went away (cancel or deadline) or stopped reading.
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
                await self._readiness.publish()
            raise
        else:
            if model is not None and model.request_succeeded():
                await self._readiness.publish()
        finally:
            record.end(Outcome.ERROR)  # a generation that ended without a result
            if model is not None:
                model.request_ended(record)
                model.used(time.monotonic(), time.time())
                if not model.busy:
                    self._lifecycle.residency.memory_may_have_freed()
            self._metrics.request_finished(record)
            self._tracer.request_finished(record)

    def _get(self, name: str) -> ManagedModel:
        require_model_name(name)
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError(name) from None

    # ---- health ----------------------------------------------------------

    @property
    def serving(self) -> bool:
        """The server accepts work and every model meant to be loaded now is ready
        (core/readiness.py)."""
        return self._readiness.serving

    def health_statuses(self) -> dict[str, bool]:
        """Readiness keyed by model name, plus '' for the whole server."""
        return self._readiness.statuses()

    async def health_report(
        self, model_name: str = "", include: Callable[[str], bool] | None = None
    ) -> HealthReport:
        """Health of one model, or of every model `include` accepts (default: all)."""
        models = [self._get(model_name)] if model_name else list(self._models.values())
        if include is not None:
            models = [m for m in models if include(m.spec.name)]
        reports = tuple(model_health_report(m) for m in models)
        return HealthReport(self.serving, reports, backend_health_reports(models))

    def server_load(self) -> ServerLoad:
        """The whole server's waiting and running requests, KV-cache usage and adapters
        (core/server_load.py)."""
        return server_load(self._models.values(), self._lifecycle.residency)

    async def check_backend_health(self) -> None:
        """Ask every loaded model's backend for its health once; publish what changed.

        The health watcher calls this every `health_check_interval_s`.
        """
        await self._readiness.check_backends()
