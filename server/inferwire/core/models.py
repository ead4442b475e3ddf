"""One configured model as the manager holds it: its state, its slots and queue, its counters.

The manager (core/manager.py) decides when a model loads, unloads and serves; a
`ManagedModel` keeps what that takes, and admits requests under the model's
concurrency limit through its bounded wait queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferwire.core.backend import Backend
from inferwire.core.errors import (
    BackendUnavailableError,
    InferwireError,
    ModelNotReadyError,
    QueueFullError,
)
from inferwire.core.memory import ByteSize, Footprint
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.scheduling import Claim, FairQueue
from inferwire.core.tracing import QUEUE, Tracer
from inferwire.core.types import (
    BackendHealth,
    BackendHealthReport,
    Durations,
    InferenceStatistics,
    ModelHealthReport,
    ModelState,
    ModelStatus,
)
from inferwire.core.validation import model_name_problem

log = logging.getLogger("inferwire.core.manager")  # health changes: the manager's log

# Consecutive requests failing in the backend (UNAVAILABLE, INTERNAL) that take a model's
# readiness away, and the least time it stays away; a request that succeeds, or a healthy
# health check after that time, gives it back.
FAILURES_BEFORE_NOT_READY = 3
FAILURE_COOLDOWN_S = 5.0


class ModelSpec(BaseModel):
    """A model as declared in the configuration: one entry of the `models:` list.

    The configuration (`inferwire.config.ModelConfig`) is this class plus the check of
    `options` against the backend's own options type; the manager takes it as it is.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """The name clients use; also the grpc.health.v1 service `model/<name>`. Up to 128
    letters, digits, '.', '_' and '-', starting with a letter or digit."""
    backend: str = "onnxruntime-genai"
    """Backend that serves the model: onnxruntime-genai (embedded) or triton."""
    adapter_of: str | None = None
    """Makes this an adapter model: a LoRA adapter served on the named base model, which
    must be configured (not itself an adapter). Its `options` are the adapter's: the
    base's backend says which (docs/adapters.md); `backend` is the base's."""
    load_on_startup: bool = False
    """Load when the server starts; the server reports SERVING only once it is READY."""
    max_concurrency: int = Field(default=8, ge=1)
    """Requests the model runs at once."""
    max_queue: int = Field(default=64, ge=0)
    """Requests that may wait for a slot; beyond that, RESOURCE_EXHAUSTED."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings, validated by the backend; unknown keys are an error."""
    pinned: bool = False
    """Never evicted to make room for another model (explicit unloads still work)."""
    on_demand: bool = False
    """Infer, InferStream and Tokenize load the model when it is not resident."""
    idle_unload_s: float | None = Field(default=None, gt=0)
    """Unload the model after this long without a request (scale it to zero)."""
    memory_bytes: ByteSize | None = None
    """The model's declared footprint on its device (KiB/MiB/GiB or bytes); unset: the
    backend's estimate."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if (problem := model_name_problem(name)) is not None:
            raise ValueError(problem)
        return name


def duplicate_name(specs: Iterable[ModelSpec]) -> str | None:
    """Why `specs` cannot be served together (a name declared twice), or None."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            return f"model {spec.name!r} is declared twice"
        seen.add(spec.name)
    return None


# Reports a model's queued and running requests (the manager's metrics listener).
LoadReporter = Callable[[str, int, int], None]

_ANYONE = Claim()  # a request that names no tenant
_STATISTICS = ("succeeded", "failed", "queued", "computed")
_FINISHED = (Outcome.STOP, Outcome.STOP_SEQUENCE, Outcome.LENGTH)

_NOT_READY_HINT = {
    ModelState.UNLOADED: "call LoadModel first",
    ModelState.LOADING: "it is still loading",
    ModelState.UNLOADING: "it is being unloaded",
}


class ManagedModel:
    def __init__(
        self,
        spec: ModelSpec,
        backend: Backend,
        report_load: LoadReporter,
        max_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`max_wait_s`: when a waiting batch request ages up (core/scheduling.py)."""
        self.spec = spec
        self.backend = backend
        self.state = ModelState.UNLOADED
        self.detail = ""
        self.load_error = ""  # why the last load failed, in the backend's words
        self.backend_healthy = False
        self.lifecycle_lock = asyncio.Lock()
        self.slots = FairQueue(spec.max_concurrency, max_wait_s, clock)
        self.running = 0
        self.queued = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.requests_total = 0
        self.generated_tokens_total = 0
        self.backend_failures = 0  # consecutive requests that failed in the backend
        self.failing_since: float | None = None  # when those failures took readiness away
        # Residency (core/residency.py): what the model holds against its budget while it
        # is LOADING, READY or UNLOADING, and when it was loaded and last used.
        self.charged: Footprint | None = None
        self.memory_detail = ""  # the footprint's estimate and measured delta, once loaded
        self.loaded_at = 0.0  # time.monotonic()
        self.last_used: float | None = None  # time.monotonic()
        self.last_used_wall: float | None = None  # time.time(), for ListModels
        self.failed_at: float | None = None  # when its last load failed (time.monotonic())
        self.load_waiters = 0  # requests waiting for it to load on demand
        self.base: ManagedModel | None = None  # an adapter model's base
        self.adapters: list[ManagedModel] = []  # a base model's adapter models
        self._report_load = report_load
        # Ended requests by kind (see `request_ended`): [count, total seconds].
        self._durations = {kind: [0, 0.0] for kind in _STATISTICS}
        self._last_ended_unix_ms = 0
        self._status: tuple[tuple[Any, ...], ModelStatus] | None = None  # see `status`

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ready(self) -> bool:
        return (
            self.state is ModelState.READY and self.backend_healthy and self.failing_since is None
        )

    @property
    def serves(self) -> bool:
        """A request for it would succeed: it is ready, or an on-demand model that is not
        loaded and whose last load did not fail (model/<name> health)."""
        if self.state is ModelState.READY or not self.spec.on_demand:
            return self.ready
        return self.state is not ModelState.FAILED

    @property
    def busy(self) -> bool:
        """Requests run, queue or wait for it to load: it is not evicted."""
        return self.running > 0 or self.queued > 0 or self.load_waiters > 0

    def loaded_adapters(self) -> list[str]:
        """This base's adapter models that hold (or are taking) the base's model."""
        gone = (ModelState.UNLOADED, ModelState.FAILED)
        return [a.name for a in self.adapters if a.state not in gone]

    def used(self, now: float, wall: float) -> None:
        self.last_used, self.last_used_wall = now, wall

    def status(self) -> ModelStatus:
        """What ListModels says of the model. The same object until something it says
        changes, so the gRPC layer keeps the message it made of it (api/converters.py)."""
        key = (
            self.state,
            self.detail,
            self.ready,
            self.memory_detail,
            self.charged.amount if self.charged is not None else 0,
            self.last_used_wall,
            # Capabilities describe the loaded model (the Backend contract): they change
            # only with a load, which sets loaded_at.
            self.loaded_at,
        )
        if self._status is None or self._status[0] != key:
            self._status = (key, self._make_status())
        return self._status[1]

    def _make_status(self) -> ModelStatus:
        capabilities = self.backend.capabilities() if self.state is ModelState.READY else None
        detail = self.detail
        if self.state is ModelState.READY and not self.ready:
            # READY is the lifecycle (loaded); the detail says it cannot serve right now.
            detail = f"not serving: {detail}"
        if self.state is ModelState.READY and self.memory_detail:
            detail = f"{detail}; {self.memory_detail}" if detail else self.memory_detail
        return ModelStatus(
            self.spec.name,
            self.spec.backend,
            self.state,
            detail,
            capabilities,
            pinned=self.spec.pinned,
            on_demand=self.spec.on_demand,
            resident_bytes=self.charged.amount if self.charged is not None else 0,
            last_used=self.last_used_wall,
            base_model=self.spec.adapter_of or "",
        )

    def health_report(self) -> ModelHealthReport:
        return ModelHealthReport(
            name=self.spec.name,
            backend=self.spec.backend,
            state=self.state,
            ready=self.ready,
            detail=self.detail,
            inflight=self.running,
            queued=self.queued,
            requests_total=self.requests_total,
            generated_tokens_total=self.generated_tokens_total,
        )

    def request_ended(self, record: RequestRecord) -> None:
        """Count an ended request of this model in its statistics and token total."""
        self.generated_tokens_total += record.completion_tokens
        elapsed = (record.ended or time.perf_counter()) - record.arrived
        finished = record.outcome in _FINISHED
        kinds = [("succeeded" if finished else "failed", elapsed)]
        if record.admitted is not None:
            kinds += [("queued", record.queue_s), ("computed", elapsed - record.queue_s)]
        for kind, seconds in kinds:
            entry = self._durations[kind]
            entry[0] += 1
            entry[1] += seconds
        self._last_ended_unix_ms = int(time.time() * 1e3)

    def statistics(self) -> InferenceStatistics:
        durations = {kind: Durations(int(c), float(s)) for kind, (c, s) in self._durations.items()}
        return InferenceStatistics(
            name=self.spec.name, **durations, last_inference_unix_ms=self._last_ended_unix_ms
        )

    def require_ready(self) -> None:
        """Fail closed: refuse work unless the model is loaded."""
        if self.state is not ModelState.READY:
            hint = _NOT_READY_HINT.get(self.state, f"its last load failed: {self.load_error}")
            raise ModelNotReadyError(
                f"model {self.spec.name!r} is {self.state.value}, not READY: {hint}"
            )

    @contextlib.asynccontextmanager
    async def slot(self, tracer: Tracer, claim: Claim | None = None) -> AsyncIterator[None]:
        """Run under the model's concurrency limit, waiting in its bounded queue if needed:
        priority first, then fairly between tenants (`claim`)."""
        if self.slots.saturated and self.queued >= self.spec.max_queue:
            raise QueueFullError(
                f"model {self.spec.name!r} is at capacity: {self.spec.max_concurrency} running "
                f"and {self.queued} queued (max_queue {self.spec.max_queue}); retry later"
            )
        self.requests_total += 1
        self.idle.clear()
        try:
            with tracer.span(QUEUE):
                if not self.slots.try_acquire(claim or _ANYONE):
                    await self._wait_for_slot(claim or _ANYONE)
            try:
                self.running += 1
                self._changed_load()
                self.require_ready()  # it may have started unloading while this one waited
                yield
            finally:
                self.running -= 1
                self._changed_load()
                self.slots.release()
        finally:
            if self.running == 0 and self.queued == 0:
                self.idle.set()

    async def _wait_for_slot(self, claim: Claim) -> None:
        """Wait in the queue, counted in `queued` (a request that gets a slot at once is
        never counted there)."""
        self.queued += 1
        self._changed_load()
        try:
            await self.slots.acquire(claim)
        finally:
            self.queued -= 1
            self._changed_load()

    def _changed_load(self) -> None:
        self._report_load(self.spec.name, self.queued, self.running)

    def checked(self, health: BackendHealth | BaseException, now: float, cooldown_s: float) -> bool:
        """Take in a health check's answer (or its failure); True when what the model
        reports changed."""
        if isinstance(health, BaseException):
            healthy, detail = False, f"health check failed: {health}"
        else:
            healthy, detail = health.healthy, health.detail
        if self.state is not ModelState.READY:
            return False
        changed = False
        if healthy and self.failing_since is not None and now - self.failing_since >= cooldown_s:
            # Half-open: a healthy check after the cool-down lets requests try again.
            self.failing_since, self.backend_failures = None, 0
            changed = True
        if healthy != self.backend_healthy or detail != self.detail:
            if healthy != self.backend_healthy:
                log.warning(
                    "model health changed",
                    extra={"model": self.name, "healthy": healthy, "detail": detail},
                )
            self.backend_healthy, self.detail = healthy, detail
            changed = True
        return changed

    def request_failed(self, error: Exception) -> bool:
        """Count a failed request; True when it took the model's readiness away.

        A backend that keeps failing requests is not ready, whatever its health check says.
        """
        if isinstance(error, InferwireError) and not isinstance(error, BackendUnavailableError):
            return False  # the request's fault (or a limit), not the backend's
        self.backend_failures += 1
        if self.backend_failures < FAILURES_BEFORE_NOT_READY or self.failing_since is not None:
            return False
        self.failing_since = time.monotonic()
        self.detail = f"the last {self.backend_failures} requests failed ({error})"
        return True

    def request_succeeded(self) -> bool:
        """Count a request that succeeded; True when it gave the model's readiness back."""
        self.backend_failures = 0
        if self.failing_since is None:
            return False
        self.failing_since = None
        return True


def backend_health_reports(models: list[ManagedModel]) -> tuple[BackendHealthReport, ...]:
    """One report per backend of `models`: healthy unless a loaded model of it is not."""
    backends: dict[str, list[ManagedModel]] = {}
    for model in models:
        backends.setdefault(model.spec.backend, []).append(model)
    reports = []
    for name, members in backends.items():
        loaded = [m for m in members if m.state is ModelState.READY]
        unhealthy = [m.spec.name for m in loaded if not m.backend_healthy]
        detail = (
            f"unhealthy models: {', '.join(unhealthy)}"
            if unhealthy
            else f"{len(loaded)} of {len(members)} models loaded"
        )
        reports.append(BackendHealthReport(name, not unhealthy, detail))
    return tuple(reports)
