"""Loading and unloading models: explicit, at start-up, on demand, by eviction and when idle.

Each model's lifecycle lock serialises its loads and unloads. A load first asks
`Residency` for room on its device (which may evict idle models), then loads the
backend, measuring the device's memory around it. An on-demand model that is not
resident is loaded by its first request; every request that arrives meanwhile waits
on that same load and gets its outcome. Models with `idle_unload_s` are unloaded
once they have gone that long without a request.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from inferwire.core.adapters import require_base_ready, require_no_adapters
from inferwire.core.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    InferwireError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from inferwire.core.models import ManagedModel
from inferwire.core.residency import Residency
from inferwire.core.status import ModelState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthHooks:
    """The manager's health publishing, which loads and unloads call as states change."""

    publish: Callable[[], Awaitable[None]]  # tell the listeners every model's readiness
    refresh: Callable[[list[ManagedModel]], Awaitable[None]]  # re-check these backends


class Trigger(enum.Enum):
    """What made a model load: the `trigger` label of inferwire_model_loads_total."""

    STARTUP = "startup"
    EXPLICIT = "explicit"
    ON_DEMAND = "on_demand"


def _wall_clock() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Lifecycle:
    """Loads and unloads the manager's models, within their devices' budgets."""

    def __init__(self, residency: Residency, health: HealthHooks, cooldown_s: float) -> None:
        """`cooldown_s`: after a failed load, how long requests get its error before one
        loads the model again."""
        self.residency = residency
        self._publish_health, self._refresh_health = health.publish, health.refresh
        self._failure_cooldown_s = cooldown_s
        self._on_demand: dict[str, asyncio.Task[list[str]]] = {}  # one load per model

    async def load(self, model: ManagedModel, trigger: Trigger, wait_s: float = 0.0) -> list[str]:
        """Load `model` (idempotent); returns the models evicted to make room for it.

        An adapter model loads on its READY base; an on-demand base is loaded first."""
        if model.base is not None:
            await self.ensure_loaded(model.base, deadline=None)
            async with model.base.lifecycle_lock:
                pass  # a load of the base under way (at start-up) ends first
        async with model.lifecycle_lock:
            if model.state is ModelState.READY:
                # The backend may have lost the model (a Triton restart): have it checked.
                try:
                    await model.backend.reconcile()
                finally:
                    await self._refresh_health([model])
                return []
            require_base_ready(model)
            evicted = await self.residency.make_room(model, wait_s, self._evict)
            model.load_started()
            await self._publish_health()
            started = time.perf_counter()
            try:
                with self.residency.measuring(model):
                    facts = await model.backend.load()
                health = await model.backend.health()
            except BaseException as exc:
                self.residency.release(model)
                if not isinstance(exc, Exception):  # cancelled: the server is stopping
                    model.unloaded()
                    raise
                error = await self._failed(model, exc)
                if error is exc:
                    raise
                raise error from exc
            seconds = time.perf_counter() - started
            model.loaded(facts, health)
            await self._publish_health()
            self.residency.metrics.model_loaded(model.name, trigger.value, seconds)
            log.info(
                "model ready",
                extra={
                    "model": model.name,
                    "load_ms": round(seconds * 1e3, 1),
                    "trigger": trigger.value,
                    "evicted": evicted,
                },
            )
            return evicted

    async def _failed(self, model: ManagedModel, exc: Exception) -> InferwireError:
        """Record a failed load; the error to raise for it."""
        model.load_failed(str(exc))
        await self._publish_health()
        # Engine errors (a corrupt file, out of memory) are the operator's to fix,
        # like configuration errors: report them all as a failed precondition.
        log.error(
            "model load failed",
            extra={"model": model.name, "error": str(exc)},
            exc_info=not isinstance(exc, InferwireError),
        )
        if isinstance(exc, ModelNotFoundError | BackendUnavailableError):
            return exc  # absent from the backend, or the backend is down: say so
        return ModelNotReadyError(f"model {model.name!r} failed to load: {exc}")

    async def unload(self, model: ManagedModel, shutting_down: bool = False, why: str = "") -> None:
        """Refuse new requests at once, let in-flight ones finish, then unload. Idempotent.

        At server shutdown the backend only releases the model: a model on a shared
        server (Triton) stays loaded for the other inferwire servers that use it.
        """
        async with model.lifecycle_lock:
            if model.state in (ModelState.UNLOADED, ModelState.FAILED):
                model.unloaded()  # deliberately: a failed model no longer counts (serving)
                await self._publish_health()
                return
            if not shutting_down:
                require_no_adapters(model)
            model.unloading()
            await self._publish_health()
            await model.admission.idle.wait()
            try:
                await (model.backend.release() if shutting_down else model.backend.unload())
            finally:
                self._unloaded(model, why)
                await self._publish_health()
            log.info("model unloaded", extra={"model": model.name, "reason": why or "requested"})

    def _unloaded(self, model: ManagedModel, why: str) -> None:
        model.unloaded(why)
        self.residency.release(model)

    async def _evict(self, victim: ManagedModel, for_model: str) -> bool:
        """Unload an idle model to make room for `for_model`; it drains nothing.

        Residency only picks a model whose lifecycle lock is free, so taking it here does
        not wait, and no load of the victim can start until it is evicted."""
        async with victim.lifecycle_lock:
            if victim.state is not ModelState.READY or victim.busy:
                return False
            victim.unloading()
            try:
                await victim.backend.unload()
            finally:
                self._unloaded(victim, f"evicted to load {for_model!r} at {_wall_clock()}")
                await self._publish_health()
        log.info("model evicted", extra={"model": victim.name, "for_model": for_model})
        return True

    # ---- on demand -------------------------------------------------------------------

    async def ensure_loaded(self, model: ManagedModel, deadline: float | None) -> float:
        """For an on-demand model that is not READY, wait for it to load (starting the
        one load all its requests share); the seconds waited. Others: 0, unchanged."""
        if not model.spec.on_demand or model.state is ModelState.READY:
            return 0.0
        if model.state is ModelState.FAILED and model.failed_at is not None:
            since = time.monotonic() - model.failed_at
            if since < self._failure_cooldown_s:
                raise ModelNotReadyError(
                    f"model {model.name!r} failed to load {since:.1f}s ago: "
                    f"{model.load_error}; a request loads it again after "
                    f"{self._failure_cooldown_s:g}s"
                )
        started = time.perf_counter()
        load = self._on_demand.get(model.name)
        if load is None or load.cancelling():
            load = asyncio.create_task(self._load_on_demand(model), name=f"load {model.name}")
            self._on_demand[model.name] = load
        try:
            with model.awaiting_load():  # a model with waiters is not evicted
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    await asyncio.wait_for(asyncio.shield(load), remaining)
                except TimeoutError:
                    if (shortage := self.residency.waiting_for_memory(model)) is not None:
                        raise shortage from None
                    raise DeadlineExceededError(
                        f"model {model.name!r} was still loading at the request's deadline"
                    ) from None
        finally:
            if not model.load_waiters and self.residency.waiting_for_memory(model):
                load.cancel()  # nobody waits for the memory any more
        return time.perf_counter() - started

    async def _load_on_demand(self, model: ManagedModel) -> list[str]:
        try:
            return await self.load(model, Trigger.ON_DEMAND, self.residency.settings.load_wait_s)
        finally:
            if self._on_demand.get(model.name) is asyncio.current_task():
                del self._on_demand[model.name]

    # ---- idle unloads -----------------------------------------------------------------

    async def unload_idle_models(self, models: Iterable[ManagedModel]) -> None:
        """Run for the server's life: unload each model that has `idle_unload_s` once it
        has gone that long without a request."""
        watched = [m for m in models if m.spec.idle_unload_s is not None]
        while watched:
            now, next_check = time.monotonic(), float("inf")
            for model in watched:
                idle_s = model.spec.idle_unload_s or 0.0
                due = (model.last_used or model.loaded_at) + idle_s
                if self._idle(model) and due <= now:
                    why = f"unloaded at {_wall_clock()} after {idle_s:g}s without a request"
                    try:
                        await self.unload(model, why=why)
                    except Exception:
                        log.exception("idle unload failed", extra={"model": model.name})
                if not self._idle(model) or due <= now:
                    due = now + idle_s  # checked again at the latest then
                next_check = min(next_check, due)
            await asyncio.sleep(max(next_check - time.monotonic(), 0.01))

    @staticmethod
    def _idle(model: ManagedModel) -> bool:
        return (
            model.state is ModelState.READY
            and not model.busy
            and not model.lifecycle_lock.locked()
            and not model.loaded_adapters()
        )
