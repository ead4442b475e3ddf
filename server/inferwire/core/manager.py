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
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from inferwire.core.backend import Backend, GenerationEvents, GenerationRecord
from inferwire.core.errors import (
    BackendUnavailableError,
    InferwireError,
    ModelNotFoundError,
    ModelNotReadyError,
    QueueFullError,
)
from inferwire.core.generation import generation_request, join, stop_at_sequences
from inferwire.core.metrics import MetricsListener, NoMetrics, RequestMetrics
from inferwire.core.tracing import GENERATE, QUEUE, NoTracer, Tracer
from inferwire.core.types import (
    BackendHealthReport,
    ChatMessage,
    GenerationRequest,
    HealthReport,
    InferenceRequest,
    InferenceResult,
    ModelHealthReport,
    ModelState,
    ModelStatus,
    RequestAccount,
    StreamChunk,
    TextDelta,
    Timing,
    Tokenization,
)
from inferwire.core.validation import (
    RequestLimits,
    require_model_name,
    validate_inference_request,
    validate_text_input,
)

log = logging.getLogger(__name__)

HealthListener = Callable[[dict[str, bool]], Awaitable[None]]


@dataclass(frozen=True)
class ModelSpec:
    """A model as declared in the configuration."""

    name: str
    backend: str
    load_on_startup: bool
    max_concurrency: int
    max_queue: int
    options: dict[str, Any] = field(default_factory=dict)


# Consecutive requests failing in the backend (UNAVAILABLE, INTERNAL) that take a model's
# readiness away, and the least time it stays away; a request that succeeds, or a healthy
# health check after that time, gives it back.
FAILURES_BEFORE_NOT_READY = 3
FAILURE_COOLDOWN_S = 5.0

# Builds the backend for a model; the server passes the backend registry's, tests a fake.
BackendFactory = Callable[["ModelSpec"], Backend]


class _ManagedModel:
    def __init__(self, spec: ModelSpec, backend: Backend) -> None:
        self.spec = spec
        self.backend = backend
        self.state = ModelState.UNLOADED
        self.detail = ""
        self.load_error = ""  # why the last load failed, in the backend's words
        self.backend_healthy = False
        self.lifecycle_lock = asyncio.Lock()
        self.slots = asyncio.Semaphore(spec.max_concurrency)
        self.running = 0
        self.queued = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.requests_total = 0
        self.generated_tokens_total = 0
        self.backend_failures = 0  # consecutive requests that failed in the backend
        self.failing_since: float | None = None  # when those failures took readiness away

    @property
    def ready(self) -> bool:
        return (
            self.state is ModelState.READY and self.backend_healthy and self.failing_since is None
        )

    def status(self) -> ModelStatus:
        capabilities = self.backend.capabilities() if self.state is ModelState.READY else None
        detail = self.detail
        if self.state is ModelState.READY and not self.ready:
            # READY is the lifecycle (loaded); the detail says it cannot serve right now.
            detail = f"not serving: {detail}"
        return ModelStatus(self.spec.name, self.spec.backend, self.state, detail, capabilities)


@dataclass
class _Run:
    """One admitted request: its model, what its backend runs, and what happened to it."""

    model: _ManagedModel
    job: GenerationRequest
    arrived: float
    started: float = 0.0
    outcome: str = "error"
    record: GenerationRecord = field(default_factory=GenerationRecord)

    def timing(self) -> Timing:
        now = time.perf_counter()
        first = self.record.first_token_at or now
        return Timing(
            queue_ms=(self.started - self.arrived) * 1e3,
            time_to_first_token_ms=(first - self.arrived) * 1e3,
            total_ms=(now - self.arrived) * 1e3,
        )

    def metrics(self, outcome: str) -> RequestMetrics:
        record, now = self.record, time.perf_counter()
        first_token_s = per_token_s = None
        if record.first_token_at is not None:
            first_token_s = record.first_token_at - self.arrived
            if record.completion_tokens > 1:
                per_token_s = (now - record.first_token_at) / (record.completion_tokens - 1)
        return RequestMetrics(
            self.model.spec.name,
            outcome,
            record.prompt_tokens,
            record.completion_tokens,
            first_token_s,
            per_token_s,
        )


class ModelManager:
    """Holds every configured model and runs requests against them."""

    def __init__(
        self,
        specs: list[ModelSpec],
        backend_factory: BackendFactory,
        limits: RequestLimits,
        health_check_interval_s: float = 2.0,
        failure_cooldown_s: float | None = None,
        metrics: MetricsListener | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._limits = limits
        self._metrics: MetricsListener = metrics or NoMetrics()
        self._tracer: Tracer = tracer or NoTracer()
        self._health_check_interval_s = health_check_interval_s
        self._failure_cooldown_s = (
            max(FAILURE_COOLDOWN_S, 2 * health_check_interval_s)
            if failure_cooldown_s is None
            else failure_cooldown_s
        )
        self._models: dict[str, _ManagedModel] = {}
        for spec in specs:
            if spec.name in self._models:
                raise ValueError(f"model {spec.name!r} is configured twice")
            self._models[spec.name] = _ManagedModel(spec, backend_factory(spec))
            self._metrics.readiness_changed(spec.name, False)
            self._metrics.load_changed(spec.name, 0, 0)
        self._listeners: list[HealthListener] = []
        self._accepting = False
        self._watcher: asyncio.Task[None] | None = None

    # ---- lifecycle ------------------------------------------------------

    def add_health_listener(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> dict[str, str]:
        """Accept work, load the start-up models and begin watching backend health.

        Returns the start-up models that failed to load, each with why; the caller
        decides whether the server stays up without them.
        """
        self._accepting = True
        await self._publish_health()
        startup = [m.spec.name for m in self._models.values() if m.spec.load_on_startup]
        results = await asyncio.gather(
            *(self.load(name) for name in startup), return_exceptions=True
        )
        failures: dict[str, str] = {}
        for name, result in zip(startup, results, strict=True):
            if isinstance(result, BaseException):
                failures[name] = self._models[name].load_error or str(result)
                log.error("start-up load failed", extra={"model": name, "error": failures[name]})
        self._watcher = asyncio.create_task(self._watch_backend_health(), name="health-watcher")
        return failures

    async def begin_shutdown(self) -> None:
        """Stop reporting SERVING; in-flight requests keep running."""
        self._accepting = False
        await self._publish_health()

    async def close(self) -> None:
        """Stop the health watcher and release every model (see Backend.release)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for name in self._models:
            try:
                await self.unload(name, shutting_down=True)
            except Exception:
                log.exception("unload at shutdown failed", extra={"model": name})

    # ---- model management ----------------------------------------------

    def list_models(self) -> list[ModelStatus]:
        return [model.status() for model in self._models.values()]

    def model_status(self, name: str) -> ModelStatus:
        return self._get(name).status()

    async def load(self, name: str) -> ModelStatus:
        """Load a configured model. Idempotent; serialised with unloads of the same model."""
        model = self._get(name)
        async with model.lifecycle_lock:
            if model.state is ModelState.READY:
                # The backend may have lost the model (a Triton restart): have it checked.
                try:
                    await model.backend.reconcile()
                finally:
                    await self._refresh_health([model])
                return model.status()
            model.state, model.detail, model.load_error = ModelState.LOADING, "", ""
            await self._publish_health()
            started = time.perf_counter()
            try:
                await model.backend.load()
                health = await model.backend.health()
            except Exception as exc:
                model.load_error = str(exc)
                model.state, model.detail = ModelState.FAILED, f"load failed: {exc}"
                model.backend_healthy = False
                await self._publish_health()
                # Engine errors (a corrupt file, out of memory) are the operator's to fix,
                # like configuration errors: report them all as a failed precondition.
                log.error(
                    "model load failed",
                    extra={"model": name, "error": str(exc)},
                    exc_info=not isinstance(exc, InferwireError),
                )
                if isinstance(exc, ModelNotFoundError | BackendUnavailableError):
                    raise  # absent from the backend, or the backend is down: say so
                raise ModelNotReadyError(f"model {name!r} failed to load: {exc}") from exc
            model.state, model.detail = ModelState.READY, health.detail
            model.backend_healthy = health.healthy
            await self._publish_health()
            log.info(
                "model ready",
                extra={"model": name, "load_ms": round((time.perf_counter() - started) * 1e3, 1)},
            )
            return model.status()

    async def unload(self, name: str, shutting_down: bool = False) -> ModelStatus:
        """Unload a model: refuse new requests at once, let in-flight ones finish. Idempotent.

        At server shutdown the backend only releases the model: a model on a shared
        server (Triton) stays loaded for the other gateways that use it.
        """
        model = self._get(name)
        async with model.lifecycle_lock:
            if model.state in (ModelState.UNLOADED, ModelState.FAILED):
                model.state = ModelState.UNLOADED
                return model.status()
            model.state, model.detail = ModelState.UNLOADING, ""
            await self._publish_health()
            await model.idle.wait()
            try:
                await (model.backend.release() if shutting_down else model.backend.unload())
            finally:
                model.state, model.backend_healthy = ModelState.UNLOADED, False
                await self._publish_health()
            log.info("model unloaded", extra={"model": name})
            return model.status()

    # ---- inference -------------------------------------------------------

    async def infer(
        self, request: InferenceRequest, account: RequestAccount | None = None
    ) -> InferenceResult:
        """Unary generation through the backend's own `infer`; `account` records what it did."""
        request = self._with_request_id(request, account)
        async with self._admit(request, account or RequestAccount()) as run:
            text, end, logprobs = await join(self._events(run, unary=True))
            run.outcome = end.finish_reason.value
            return InferenceResult(
                request_id=request.request_id,
                model=request.model,
                backend=run.model.spec.backend,
                text=text,
                finish_reason=end.finish_reason,
                usage=end.usage,
                timing=run.timing(),
                logprobs=logprobs,
            )

    def infer_stream(
        self, request: InferenceRequest, account: RequestAccount | None = None
    ) -> tuple[str, AsyncGenerator[StreamChunk, None]]:
        """Return the request ID in use and its chunks; the last chunk carries the outcome."""
        request = self._with_request_id(request, account)
        return request.request_id, self._stream(request, account or RequestAccount())

    async def _stream(
        self, request: InferenceRequest, account: RequestAccount
    ) -> AsyncGenerator[StreamChunk, None]:
        async with self._admit(request, account) as run:
            events = self._events(run, unary=False)
            async with contextlib.aclosing(events):
                async for event in events:
                    if isinstance(event, TextDelta):
                        yield StreamChunk(event.text, logprobs=event.logprobs)
                    else:
                        run.outcome = event.finish_reason.value
                        yield StreamChunk(
                            "",
                            finish_reason=event.finish_reason,
                            usage=event.usage,
                            timing=run.timing(),
                        )

    async def tokenize(
        self, model_name: str, prompt: str, messages: tuple[ChatMessage, ...]
    ) -> Tokenization:
        """The token ids a model sees for a prompt, or for messages through its chat template.

        Takes no concurrency slot: tokenizing costs little next to generating.
        """
        validate_text_input(model_name, prompt, messages, self._limits)
        model = self._get(model_name)
        self._require_ready(model)
        rendered = model.backend.render_chat(messages) if messages else ""
        token_ids = await model.backend.tokenize(rendered if messages else prompt)
        return Tokenization(tuple(token_ids), rendered)

    @staticmethod
    def _events(run: _Run, unary: bool) -> GenerationEvents:
        backend = run.model.backend
        run_backend = backend.infer if unary else backend.infer_stream
        events = run_backend(run.job, run.record)
        stops = run.job.params.stop
        # Without stop strings the backend's events pass as they are: no extra
        # generator hop on every token.
        return stop_at_sequences(events, stops, run.record) if stops else events

    @staticmethod
    def _with_request_id(
        request: InferenceRequest, account: RequestAccount | None
    ) -> InferenceRequest:
        if not request.request_id:
            request = replace(request, request_id=uuid.uuid4().hex)
        if account is not None:
            account.request_id, account.model = request.request_id, request.model
        return request

    @contextlib.asynccontextmanager
    async def _admit(
        self, request: InferenceRequest, account: RequestAccount
    ) -> AsyncIterator[_Run]:
        """Validate, queue for a slot, and account for one request, unary or streamed."""
        arrived = time.perf_counter()
        run: _Run | None = None
        try:
            validate_inference_request(request, self._limits)
            model = self._get(request.model)
            self._require_ready(model)
            run = _Run(
                model,
                generation_request(model.spec.name, model.backend, request),
                arrived,
                record=GenerationRecord(tracer=self._tracer),
            )
            async with self._slot(model):
                run.started = time.perf_counter()
                try:
                    with self._tracer.span(GENERATE):
                        yield run
                except (GeneratorExit, asyncio.CancelledError):
                    # The caller went away (cancel or deadline) or stopped reading.
                    run.outcome = "cancelled"
                    raise
                except Exception as error:
                    await self._count_backend_failure(model, error)
                    raise
                else:
                    await self._count_backend_success(model)
                finally:
                    record = run.record
                    model.generated_tokens_total += record.completion_tokens
                    account.outcome = run.outcome
                    account.prompt_tokens = record.prompt_tokens
                    account.completion_tokens = record.completion_tokens
                    account.tokens_after_cancel = record.tokens_after_cancel
                    account.queue_ms = (run.started - arrived) * 1e3
        finally:
            if request.model in self._models:  # a made-up name never becomes a label
                self._metrics.request_finished(
                    run.metrics(account.outcome)
                    if run is not None
                    else RequestMetrics(request.model, account.outcome)
                )

    @contextlib.asynccontextmanager
    async def _slot(self, model: _ManagedModel) -> AsyncIterator[None]:
        """Run under the model's concurrency limit, waiting in its bounded queue if needed."""
        if model.slots.locked() and model.queued >= model.spec.max_queue:
            raise QueueFullError(
                f"model {model.spec.name!r} is at capacity: {model.spec.max_concurrency} running "
                f"and {model.queued} queued (max_queue {model.spec.max_queue}); retry later"
            )
        model.requests_total += 1
        model.queued += 1
        self._report_load(model)
        model.idle.clear()
        try:
            try:
                with self._tracer.span(QUEUE):
                    await model.slots.acquire()
            finally:
                model.queued -= 1
                self._report_load(model)
            try:
                model.running += 1
                self._report_load(model)
                # The model may have started unloading while this request waited.
                self._require_ready(model)
                yield
            finally:
                model.running -= 1
                self._report_load(model)
                model.slots.release()
        finally:
            if model.running == 0 and model.queued == 0:
                model.idle.set()

    def _report_load(self, model: _ManagedModel) -> None:
        self._metrics.load_changed(model.spec.name, model.queued, model.running)

    @staticmethod
    def _require_ready(model: _ManagedModel) -> None:
        if model.state is not ModelState.READY:
            hint = {
                ModelState.UNLOADED: "call LoadModel first",
                ModelState.LOADING: "it is still loading",
                ModelState.UNLOADING: "it is being unloaded",
                ModelState.FAILED: f"its last load failed: {model.load_error}",
            }[model.state]
            raise ModelNotReadyError(
                f"model {model.spec.name!r} is {model.state.value}, not READY: {hint}"
            )

    def _get(self, name: str) -> _ManagedModel:
        require_model_name(name)
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError(name) from None

    # ---- health ----------------------------------------------------------

    @property
    def serving(self) -> bool:
        """The server accepts work and every start-up model is ready."""
        return self._accepting and all(
            m.ready for m in self._models.values() if m.spec.load_on_startup
        )

    def health_statuses(self) -> dict[str, bool]:
        """Readiness keyed by model name, plus '' for the whole server."""
        statuses = {"": self.serving}
        statuses.update({name: self._accepting and m.ready for name, m in self._models.items()})
        return statuses

    async def health_report(
        self, model_name: str = "", include: Callable[[str], bool] | None = None
    ) -> HealthReport:
        """Health of one model, or of every model `include` accepts (default: all)."""
        models = [self._get(model_name)] if model_name else list(self._models.values())
        if include is not None:
            models = [m for m in models if include(m.spec.name)]
        reports = tuple(
            ModelHealthReport(
                name=m.spec.name,
                backend=m.spec.backend,
                state=m.state,
                ready=m.ready,
                detail=m.detail,
                inflight=m.running,
                queued=m.queued,
                requests_total=m.requests_total,
                generated_tokens_total=m.generated_tokens_total,
            )
            for m in models
        )
        backends: dict[str, list[_ManagedModel]] = {}
        for m in models:
            backends.setdefault(m.spec.backend, []).append(m)
        backend_reports = []
        for name, members in backends.items():
            loaded = [m for m in members if m.state is ModelState.READY]
            unhealthy = [m.spec.name for m in loaded if not m.backend_healthy]
            detail = (
                f"unhealthy models: {', '.join(unhealthy)}"
                if unhealthy
                else f"{len(loaded)} of {len(members)} models loaded"
            )
            backend_reports.append(BackendHealthReport(name, not unhealthy, detail))
        return HealthReport(self.serving, reports, tuple(backend_reports))

    async def _publish_health(self) -> None:
        statuses = self.health_statuses()
        for name, model in self._models.items():
            self._metrics.readiness_changed(name, model.ready)
        for listener in self._listeners:
            await listener(statuses)

    async def _watch_backend_health(self) -> None:
        while True:
            await asyncio.sleep(self._health_check_interval_s)
            await self.check_backend_health()

    async def check_backend_health(self) -> None:
        """Ask every loaded model's backend for its health once; publish what changed.

        The health watcher calls this every `health_check_interval_s`.
        """
        await self._refresh_health(
            [m for m in self._models.values() if m.state is ModelState.READY]
        )

    async def _refresh_health(self, models: list[_ManagedModel]) -> None:
        changed = False
        # Checked concurrently, so one slow backend cannot delay the others' reports.
        results = await asyncio.gather(
            *(m.backend.health() for m in models), return_exceptions=True
        )
        now = time.monotonic()
        for model, health in zip(models, results, strict=True):
            if isinstance(health, BaseException):
                health_ok, detail = False, f"health check failed: {health}"
            else:
                health_ok, detail = health.healthy, health.detail
            if model.state is not ModelState.READY:
                continue
            if (
                health_ok
                and model.failing_since is not None
                and now - model.failing_since >= self._failure_cooldown_s
            ):
                # Half-open: a healthy check after the cool-down lets requests try again.
                model.failing_since, model.backend_failures = None, 0
                changed = True
            if health_ok != model.backend_healthy or detail != model.detail:
                if health_ok != model.backend_healthy:
                    log.warning(
                        "model health changed",
                        extra={"model": model.spec.name, "healthy": health_ok, "detail": detail},
                    )
                model.backend_healthy, model.detail = health_ok, detail
                changed = True
        if changed:
            await self._publish_health()

    async def _count_backend_failure(self, model: _ManagedModel, error: Exception) -> None:
        """A backend that keeps failing requests is not ready, whatever its health check says."""
        if isinstance(error, InferwireError) and not isinstance(error, BackendUnavailableError):
            return  # the request's fault (or a limit), not the backend's
        model.backend_failures += 1
        if model.backend_failures >= FAILURES_BEFORE_NOT_READY and model.failing_since is None:
            model.failing_since = time.monotonic()
            model.detail = f"the last {model.backend_failures} requests failed ({error})"
            log.warning(
                "model not ready: its requests fail",
                extra={"model": model.spec.name, "error": str(error)},
            )
            await self._publish_health()

    async def _count_backend_success(self, model: _ManagedModel) -> None:
        model.backend_failures = 0
        if model.failing_since is not None:
            model.failing_since = None
            await self._publish_health()
