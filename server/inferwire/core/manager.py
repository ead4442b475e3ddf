"""The model manager: model lifecycle, admission control and health, transport-neutral.

Each configured model has a state machine (UNLOADED -> LOADING -> READY ->
UNLOADING -> UNLOADED, or FAILED after a bad load), a per-model lock that
serialises loads and unloads, a concurrency limit with a bounded wait queue,
and counters. Health changes are pushed to listeners (the grpc.health.v1
publisher) whenever a model's readiness or the overall serving state changes.
The manager is the core's one entrance: it holds the models and their parts, and a
request's path from arrival to its record's end is core/request_path.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence

from inferwire.core.adapters import Adapters, AdapterSettings, AdapterSource
from inferwire.core.backend import Backend
from inferwire.core.breaker import FAILURE_COOLDOWN_S
from inferwire.core.chat import ChatMessage
from inferwire.core.embeddings import (
    EmbeddingRequest,
    EmbeddingResult,
    RerankRequest,
    RerankResult,
)
from inferwire.core.errors import ConfigurationError
from inferwire.core.facts import PromptCacheStats
from inferwire.core.lifecycle import HealthHooks, Lifecycle, Trigger
from inferwire.core.memory import MemorySettings
from inferwire.core.metrics import MemoryMetrics, MetricsListener, NoMemoryMetrics, NoMetrics
from inferwire.core.model_reports import backend_health_reports, model_health_report
from inferwire.core.models import ManagedModel, find_model
from inferwire.core.readiness import HealthListener, Readiness
from inferwire.core.request_gate import RequestGate
from inferwire.core.request_path import RequestPath
from inferwire.core.requests import InferenceRequest
from inferwire.core.reserve import Reservation
from inferwire.core.residency import Residency
from inferwire.core.results import InferenceResult, StreamChunk, Tokenization
from inferwire.core.retrieval_path import RetrievalPath
from inferwire.core.server_load import ServerLoad, server_load
from inferwire.core.specs import ModelSpec, duplicate_name
from inferwire.core.status import HealthReport, InferenceStatistics, ModelState, ModelStatus
from inferwire.core.tenants import Tenants
from inferwire.core.tracing import NO_TRACER, Tracer
from inferwire.core.validation import RequestLimits

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
        self._metrics: MetricsListener = metrics or NoMetrics()
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
        gate = RequestGate(
            self._models,
            self._tenants,
            self._lifecycle,
            self._readiness.publish,
            self._metrics,
            tracer or NO_TRACER,
        )
        self._requests = RequestPath(gate, limits, keep_text)
        self._retrieval = RetrievalPath(gate, limits)

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

    # ---- inference (core/request_path.py) -----------------------------

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        """Unary generation through the backend's own `infer`."""
        return await self._requests.infer(request)

    def infer_stream(
        self, request: InferenceRequest
    ) -> tuple[str, AsyncGenerator[StreamChunk, None]]:
        """Return the request ID in use and its chunks; the last chunk carries the outcome."""
        return self._requests.infer_stream(request)

    async def tokenize(
        self, model_name: str, prompt: str, messages: tuple[ChatMessage, ...]
    ) -> Tokenization:
        """The token ids a model sees for a prompt, or for messages through its chat
        template; takes no concurrency slot."""
        return await self._requests.tokenize(model_name, prompt, messages)

    async def render(self, request: InferenceRequest) -> Tokenization:
        """The token ids generation would feed the engine for `request`, without running
        it (vLLM's /v1/completions/render and /v1/chat/completions/render)."""
        return await self._requests.render(request)

    async def detokenize(self, model_name: str, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` for a model (vLLM's /detokenize); takes no slot either."""
        return await self._requests.detokenize(model_name, token_ids)

    # ---- embeddings and rerank (core/retrieval_path.py) -------------------

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """One embedding per input, in order, in one of the model's slots."""
        return await self._retrieval.embed(request)

    async def rerank(self, request: RerankRequest) -> RerankResult:
        """The documents most relevant to the query first, in one of the model's slots."""
        return await self._retrieval.rerank(request)

    def _get(self, name: str) -> ManagedModel:
        return find_model(self._models, name)

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
        return server_load(
            self._models.values(), self._lifecycle.residency, self._readiness.accepting
        )

    def prompt_caches(self) -> dict[str, PromptCacheStats]:
        """Each loaded model's prompt cache, where its backend keeps one."""
        caches = {}
        for name, model in self._models.items():
            if model.state is ModelState.READY and (stats := model.backend.prompt_cache()):
                caches[name] = stats
        return caches

    async def check_backend_health(self) -> None:
        """Ask every loaded model's backend for its health once; publish what changed.

        The health watcher calls this every `health_check_interval_s`.
        """
        await self._readiness.check_backends()
