"""One configured model as the manager holds it: its state, its memory charge, its requests.

The manager (core/manager.py) decides when a model loads, unloads and serves; the
lifecycle (core/lifecycle.py) and residency (core/residency.py) carry it out. A
`ManagedModel` is the one owner of what that leaves behind: its fields are read-only from
outside, and each change goes through one of its methods (load started, loaded, failed,
unloading, unloaded, charged, used, ...), which moves its `version`. It is made of the
model's `AdmissionQueue` (core/admission.py: its slots and bounded wait queue) and its
`FailureBreaker` (core/breaker.py: requests failing in the backend); what it reports is
written in core/model_reports.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Generic, TypeVar, overload

from inferwire.core.admission import AdmissionQueue, LoadReporter
from inferwire.core.backend import Backend
from inferwire.core.breaker import FailureBreaker
from inferwire.core.errors import ModelNotFoundError, ModelNotReadyError
from inferwire.core.facts import ModelFacts
from inferwire.core.memory import Footprint
from inferwire.core.model_reports import model_status
from inferwire.core.record import RequestRecord
from inferwire.core.reserve import Reservation
from inferwire.core.scheduling import Claim, Grant
from inferwire.core.specs import ModelSpec
from inferwire.core.statistics import RequestStatistics
from inferwire.core.status import BackendHealth, ModelState, ModelStatus
from inferwire.core.tracing import Tracer
from inferwire.core.validation import require_model_name

log = logging.getLogger("inferwire.core.manager")  # health changes: the manager's log

_GONE = (ModelState.UNLOADED, ModelState.FAILED)
T = TypeVar("T")
# Every change of every model takes the next number, so a version names one model's one
# state: a model registered again (a run-time adapter) never repeats an earlier version.
_VERSIONS = itertools.count(1)

_NOT_READY_HINT = {
    ModelState.UNLOADED: "call LoadModel first",
    ModelState.LOADING: "it is still loading",
    ModelState.UNLOADING: "it is being unloaded",
}


class _ReadOnly(Generic[T]):
    """A field read from outside and set only by its class's methods (as `_<name>`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._private = "_" + name

    @overload
    def __get__(self, instance: None, owner: type) -> _ReadOnly[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> T: ...
    def __get__(self, instance: object | None, owner: type) -> T | _ReadOnly[T]:
        if instance is None:
            return self
        value: T = getattr(instance, self._private)
        return value

    def __set__(self, instance: object, value: T) -> None:
        raise AttributeError(f"{self._private[1:]} changes only through the model's methods")


class ManagedModel:
    """One configured model: its state, and what admits and counts its requests."""

    def __init__(
        self,
        spec: ModelSpec,
        backend: Backend,
        report_load: LoadReporter,
        max_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        base: ManagedModel | None = None,
        reservation: Reservation | None = None,
    ) -> None:
        """`max_wait_s`: when a waiting batch request ages up (core/scheduling.py);
        `base`: an adapter model's base model; `reservation`: its slots kept for the
        higher classes (core/reserve.py; default: none)."""
        self.spec = spec
        self.backend = backend
        self.lifecycle_lock = asyncio.Lock()  # serialises this model's loads and unloads
        self.admission = AdmissionQueue(spec, report_load, max_wait_s, clock, reservation)
        self._state = ModelState.UNLOADED
        self._detail = ""
        self._load_error = ""  # why the last load failed, in the backend's words
        self._backend_healthy = False
        self._facts: ModelFacts | None = None  # what the loaded model is (Backend.load)
        # Whether the server's readiness waits for this model: a start-up model, or one
        # loaded since, until it is deliberately unloaded (or evicted); see `serving`.
        self._wanted = spec.load_on_startup
        self.generated_tokens_total = 0
        self._breaker = FailureBreaker()
        # Residency (core/residency.py): what the model holds against its budget while it
        # is LOADING, READY or UNLOADING, and when it was loaded and last used.
        self._charged: Footprint | None = None
        self._memory_detail = ""  # the footprint's estimate and measured delta, once loaded
        self._loaded_at = 0.0  # time.monotonic()
        self._last_used: float | None = None  # time.monotonic()
        self._last_used_wall: float | None = None  # time.time(), for ListModels
        self._failed_at: float | None = None  # when its last load failed (time.monotonic())
        self._load_waiters = 0  # requests waiting for it to load on demand
        self._base = base
        self._adapters: list[ManagedModel] = []  # a base model's adapter models
        if base is not None:
            base._adapters.append(self)
        self.statistics = RequestStatistics(spec.name)
        self._live: set[RequestRecord] = set()  # requests holding a slot (their KV cache)
        self._version = next(_VERSIONS)
        self._status: tuple[tuple[int, float | None], ModelStatus] | None = None

    # ---- what it is now (read-only from outside: each is set by the methods below) ----

    state = _ReadOnly[ModelState]()
    detail = _ReadOnly[str]()
    load_error = _ReadOnly[str]()
    backend_healthy = _ReadOnly[bool]()
    facts = _ReadOnly["ModelFacts | None"]()  # what the loaded model is; None unless READY
    version = _ReadOnly[int]()  # moves with every change `status` reports, but last use
    wanted = _ReadOnly[bool]()
    charged = _ReadOnly["Footprint | None"]()
    memory_detail = _ReadOnly[str]()
    loaded_at = _ReadOnly[float]()
    last_used = _ReadOnly["float | None"]()
    last_used_wall = _ReadOnly["float | None"]()
    failed_at = _ReadOnly["float | None"]()
    load_waiters = _ReadOnly[int]()
    base = _ReadOnly["ManagedModel | None"]()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def adapters(self) -> tuple[ManagedModel, ...]:
        return tuple(self._adapters)

    @property
    def running(self) -> int:
        return self.admission.running

    @property
    def queued(self) -> int:
        return self.admission.queued

    @property
    def requests_total(self) -> int:
        return self.admission.requests_total

    @property
    def ready(self) -> bool:
        return self._state is ModelState.READY and self._backend_healthy and not self._breaker.open

    @property
    def serves(self) -> bool:
        """A request for it would succeed: it is ready, or an on-demand model that is not
        loaded and whose last load did not fail (model/<name> health)."""
        if self._state is ModelState.READY or not self.spec.on_demand:
            return self.ready
        return self._state is not ModelState.FAILED

    @property
    def busy(self) -> bool:
        """Requests run, queue or wait for it to load: it is not evicted."""
        return self.running > 0 or self.queued > 0 or self._load_waiters > 0

    def loaded_adapters(self) -> list[str]:
        """This base's adapter models that hold (or are taking) the base's model."""
        return [a.name for a in self._adapters if a._state not in _GONE]

    # ---- its lifecycle (core/lifecycle.py) -------------------------------------------

    def _changed(self) -> None:
        self._version = next(_VERSIONS)

    def load_started(self) -> None:
        self._state, self._detail, self._load_error = ModelState.LOADING, "", ""
        self._changed()

    def loaded(self, facts: ModelFacts, health: BackendHealth) -> None:
        self._loaded_at, self._failed_at = time.monotonic(), None
        self.used(self._loaded_at, time.time())
        self._state, self._facts, self._wanted = ModelState.READY, facts, True
        self._detail, self._backend_healthy = health.detail, health.healthy
        self._changed()

    def load_failed(self, error: str) -> None:
        self._state, self._detail, self._load_error = (
            ModelState.FAILED,
            f"load failed: {error}",
            error,
        )
        self._backend_healthy, self._failed_at, self._facts = False, time.monotonic(), None
        self._changed()

    def unloading(self) -> None:
        """A deliberate unload or eviction: `""` stops counting it now, not after the drain."""
        self._state, self._detail, self._wanted = ModelState.UNLOADING, "", False
        self._changed()

    def unloaded(self, why: str | None = None) -> None:
        """Not loaded any more, deliberately (an unload, an eviction, an idle unload, a
        load cancelled at shutdown); `why`: the detail to report (None: kept)."""
        self._state, self._backend_healthy, self._facts = ModelState.UNLOADED, False, None
        self._wanted = False
        if why is not None:
            self._detail = why
        self._changed()

    @contextlib.contextmanager
    def awaiting_load(self) -> Iterator[None]:
        """A request waits for this model to load on demand: it is not evicted meanwhile."""
        self._load_waiters += 1
        try:
            yield
        finally:
            self._load_waiters -= 1

    def adapter_removed(self, adapter: ManagedModel) -> None:
        """A run-time adapter model of this base is gone (core/adapters.py)."""
        self._adapters.remove(adapter)

    # ---- its memory (core/residency.py) ----------------------------------------------

    def charge(self, footprint: Footprint | None) -> None:
        self._charged = footprint
        self._changed()

    def discharge(self) -> Footprint | None:
        """Hold nothing against the budget any more; returns what it held."""
        charged, self._charged, self._memory_detail = self._charged, None, ""
        self._changed()
        return charged

    def measured(self, memory_detail: str) -> None:
        """The footprint's estimate and the memory measured around its load."""
        self._memory_detail = memory_detail
        self._changed()

    # ---- its use and what it reports -------------------------------------------------

    def used(self, now: float, wall: float) -> None:
        """A request arrived or ended: eviction order and idle unloads go by it."""
        self._last_used, self._last_used_wall = now, wall

    def status(self) -> ModelStatus:
        """What ListModels says of the model (core/model_reports.py): the same object while
        neither its version nor its last use moved."""
        key = (self._version, self._last_used_wall)
        if self._status is None or self._status[0] != key:
            self._status = (key, model_status(self))
        return self._status[1]

    # ---- its requests ----------------------------------------------------------------

    def request_started(self, record: RequestRecord) -> None:
        """A request took a slot: its tokens hold the model's KV cache until it ends."""
        self._live.add(record)

    def request_ended(self, record: RequestRecord) -> None:
        """Count an ended request of this model in its statistics and token total."""
        self._live.discard(record)
        self.generated_tokens_total += record.completion_tokens
        self.statistics.ended(record)

    @property
    def live_tokens(self) -> int:
        """The prompt and generated tokens of the requests running now."""
        # A copy first: a metrics scrape may read this from another thread.
        return sum(r.prompt_tokens + r.completion_tokens for r in tuple(self._live))

    # ---- admitting a request ---------------------------------------------------------

    def require_ready(self) -> ModelFacts:
        """Fail closed: refuse work unless the model is loaded; what it is, when it is."""
        facts = self._facts
        if self._state is not ModelState.READY or facts is None:
            hint = _NOT_READY_HINT.get(self._state, f"its last load failed: {self._load_error}")
            raise ModelNotReadyError(
                f"model {self.spec.name!r} is {self._state.value}, not READY: {hint}"
            )
        return facts

    @contextlib.asynccontextmanager
    async def slot(self, tracer: Tracer, claim: Claim | None = None) -> AsyncIterator[Grant]:
        """Run in one of the model's slots (AdmissionQueue.slot), and only while it is still
        loaded; yields the slot's grant."""
        async with self.admission.slot(tracer, claim) as grant:
            self.require_ready()  # it may have started unloading while this one waited
            yield grant

    # ---- its health (core/readiness.py; requests failing: core/breaker.py) -----------

    def checked(self, health: BackendHealth | BaseException, now: float, cooldown_s: float) -> bool:
        """Take in a health check's answer (or its failure); True when what the model
        reports changed."""
        if isinstance(health, BaseException):
            healthy, detail = False, f"health check failed: {health}"
        else:
            healthy, detail = health.healthy, health.detail
        if self._state is not ModelState.READY:
            return False
        # Half-open: a healthy check after the cool-down lets requests try again.
        changed = healthy and self._breaker.checked_healthy(now, cooldown_s)
        if healthy != self._backend_healthy or detail != self._detail:
            if healthy != self._backend_healthy:
                log.warning(
                    "model health changed",
                    extra={"model": self.name, "healthy": healthy, "detail": detail},
                )
            self._backend_healthy, self._detail = healthy, detail
            changed = True
        if changed:
            self._changed()
        return changed

    def request_failed(self, error: Exception) -> bool:
        """Count a failed request; True when it took the model's readiness away.

        A backend that keeps failing requests is not ready, whatever its health check says.
        """
        if not self._breaker.failed(error):
            return False
        self._detail = f"the last {self._breaker.failures} requests failed ({error})"
        self._changed()
        return True

    def request_succeeded(self) -> bool:
        """Count a request that succeeded; True when it gave the model's readiness back."""
        if not self._breaker.succeeded():
            return False
        self._changed()
        return True


def find_model(models: Mapping[str, ManagedModel], name: str) -> ManagedModel:
    """The model `name` names; a malformed or unknown name is refused."""
    require_model_name(name)
    try:
        return models[name]
    except KeyError:
        raise ModelNotFoundError(name) from None
