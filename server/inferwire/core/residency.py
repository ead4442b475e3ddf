"""Which models hold memory on which device, and making room for a model to load.

Each device has a budget (`server.memory.budgets`, or a Triton pool's
`max_loaded_models`). A model is charged its footprint from the moment its load is
admitted until its unload ends. A load that does not fit evicts resident models that
are unpinned, idle (nothing running or queued) and loaded at least `min_resident_s`
ago, least recently used first, only as many as needed, and only when that frees
enough; otherwise it gets a `MemoryExhaustedError` naming the holders, or (with a
wait) retries each time memory may have been freed. Decisions are serialised by one
lock, so two loads never count the same free bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace

from inferwire.core.errors import ConfigurationError, MemoryExhaustedError
from inferwire.core.memory import Footprint, MemorySettings, format_size, memory_in_use
from inferwire.core.metrics import MemoryMetrics
from inferwire.core.models import ManagedModel
from inferwire.core.status import ModelState

log = logging.getLogger(__name__)

# Unloads a resident model to make room for another (named); False when it no longer
# could be (it became busy or was unloaded meanwhile).
Evict = Callable[[ManagedModel, str], Awaitable[bool]]

# The retry delay a RESOURCE_EXHAUSTED suggests when nothing says when memory frees up.
DEFAULT_RETRY_DELAY_S = 1.0


class Residency:
    """Budgets per device, the models charged against them, and room-making for loads."""

    def __init__(
        self, settings: MemorySettings, models: list[ManagedModel], metrics: MemoryMetrics
    ) -> None:
        self.settings = settings
        self._models = models
        self.metrics = metrics
        self._budgets: dict[str, int] = dict(settings.budgets)
        self._lock = asyncio.Lock()
        self._freed = asyncio.Event()  # set (and replaced) whenever memory may have freed
        self._waiting: dict[str, MemoryExhaustedError] = {}  # loads waiting for memory
        self._loading: dict[str, set[str]] = {}  # device -> models loading on it
        self._overlapped: set[str] = set()  # loads that shared their device with another
        for model in models:
            self._add_backend_budget(model)
        for device, budget in settings.budgets.items():
            metrics.memory_changed(device, budget, 0)
        for model in models:
            metrics.resident_changed(model.name, 0)

    def _add_backend_budget(self, model: ManagedModel) -> None:
        try:
            footprint = model.backend.footprint()
        except Exception:  # reported when the model loads
            return
        if footprint is not None and footprint.unit != "bytes" and model.spec.memory_bytes:
            raise ConfigurationError(
                f"model {model.name!r}: memory_bytes does not apply to backend "
                f"{model.spec.backend!r}, whose budget counts {footprint.unit}"
            )
        if footprint is not None and footprint.budget is not None:
            known = self._budgets.get(footprint.device)
            self._budgets[footprint.device] = min(footprint.budget, known or footprint.budget)

    def add(self, model: ManagedModel) -> None:
        """A model registered at run time (an adapter) joins the budgets."""
        self._models.append(model)
        self._add_backend_budget(model)
        self.metrics.resident_changed(model.name, 0)

    def remove(self, model: ManagedModel) -> None:
        """A run-time model dropped once unloaded (it holds nothing by then)."""
        self._models.remove(model)

    def budget(self, device: str) -> int | None:
        return self._budgets.get(device)

    def footprint(self, model: ManagedModel) -> Footprint | None:
        """The backend's estimate, or the model's declared `memory_bytes` on its device."""
        estimate = model.backend.footprint()
        declared = model.spec.memory_bytes
        if estimate is None or declared is None or estimate.unit != "bytes":
            return estimate
        return replace(estimate, amount=declared, detail="declared as memory_bytes")

    def resident_at_once(self, models: list[ManagedModel]) -> int:
        """How many of `models` (adapters) could be resident together within their devices'
        budgets, beside the other models resident now (smallest first); a model with no
        budget on its device, or no footprint, always fits."""
        fits = 0
        by_device: dict[str, list[int]] = {}
        for model in models:
            footprint = self.footprint(model)
            budget = None if footprint is None else self.budget(footprint.device)
            if footprint is None or budget is None:
                fits += 1
            else:
                by_device.setdefault(footprint.device, []).append(footprint.amount)
        for device, amounts in by_device.items():
            budget = self.budget(device) or 0
            others = sum(
                m.charged.amount
                for m in self._models
                if m.charged is not None and m.charged.device == device and m not in models
            )
            free = budget - others
            for amount in sorted(amounts):
                if amount > free:
                    break
                free -= amount
                fits += 1
        return fits

    def used(self, device: str, besides: ManagedModel | None = None) -> int:
        return sum(
            m.charged.amount
            for m in self._models
            if m.charged is not None and m.charged.device == device and m is not besides
        )

    # ---- admitting a load ---------------------------------------------------------

    async def make_room(self, model: ManagedModel, wait_s: float, evict: Evict) -> list[str]:
        """Charge `model` its footprint, evicting idle models if it does not fit; returns
        the names evicted. Retries for up to `wait_s` as memory frees, then raises."""
        footprint = self.footprint(model)
        evicted: list[str] = []
        give_up_at = time.monotonic() + wait_s
        while True:
            async with self._lock:
                shortage = await self._fit(model, footprint, evict, evicted)
            if shortage is None:
                return evicted
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                raise shortage
            self._waiting[model.name] = shortage
            try:
                freed = self._freed.wait()
                delay = shortage.retry_delay_s or remaining
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed, min(remaining, delay))
            finally:
                self._waiting.pop(model.name, None)

    async def _fit(
        self, model: ManagedModel, footprint: Footprint | None, evict: Evict, evicted: list[str]
    ) -> MemoryExhaustedError | None:
        if footprint is None:
            return None
        device, budget = footprint.device, self.budget(footprint.device)
        while budget is not None and footprint.amount > budget - self.used(device, model):
            free = budget - self.used(device, model)
            victims = self._evictable(device, model)
            freeable = sum(v.charged.amount for v in victims if v.charged is not None)
            if footprint.amount > budget or free + freeable < footprint.amount:
                return self._shortage(model, footprint, budget, free)
            victim = min(victims, key=lambda v: v.last_used or v.loaded_at)
            if await evict(victim, model.name):
                evicted.append(victim.name)
                self.metrics.model_evicted(victim.name)
        self.charge(model, footprint)
        return None

    def _evictable(self, device: str, loading: ManagedModel) -> list[ManagedModel]:
        now = time.monotonic()
        return [
            m
            for m in self._models
            if m is not loading
            and m.charged is not None
            and m.charged.device == device
            and m.state is ModelState.READY
            and not m.spec.pinned
            and not m.busy
            and not m.loaded_adapters()  # its adapters run on it
            and not m.lifecycle_lock.locked()  # being checked or unloaded: not now
            and now - m.loaded_at >= self.settings.min_resident_s
        ]

    def _shortage(
        self, model: ManagedModel, footprint: Footprint, budget: int, free: int
    ) -> MemoryExhaustedError:
        now = time.monotonic()
        min_resident_s = self.settings.min_resident_s
        holders, ages_out = [], []
        for held in self._models:
            if held is model or held.charged is None or held.charged.device != footprint.device:
                continue
            if held.state is not ModelState.READY:
                why = held.state.value.lower()
            elif held.busy or held.lifecycle_lock.locked():
                why = (
                    f"busy: {held.running} running, {held.queued} queued, "
                    f"{held.load_waiters} waiting for its load"
                )
            elif held.spec.pinned:
                why = "pinned"
            elif held.loaded_adapters():
                why = f"adapters loaded: {', '.join(held.loaded_adapters())}"
            else:
                age = now - held.loaded_at
                why = f"too recent: loaded {age:.1f}s ago, min_resident_s {min_resident_s:g}"
                ages_out.append(min_resident_s - age)
            holders.append(f"{held.name!r} {held.charged.describe()} ({why})")
        unit_bytes = footprint.unit == "bytes"
        needed = footprint.describe() + (f" ({footprint.amount} bytes)" if unit_bytes else "")
        message = (
            f"model {model.name!r} needs {needed} on {footprint.device}, "
            f"{footprint.describe(free)}"
            + (f" ({free} bytes)" if unit_bytes else "")
            + f" of its {footprint.describe(budget)} budget free; held by: "
            + ("; ".join(holders) or "nothing (the model is larger than the budget)")
        )
        retry_s = max(min(ages_out), 0.1) if ages_out else DEFAULT_RETRY_DELAY_S
        return MemoryExhaustedError(message, retry_s)

    def waiting_for_memory(self, model: ManagedModel) -> MemoryExhaustedError | None:
        """Why `model`'s load is waiting for memory right now, or None if it is not."""
        return self._waiting.get(model.name)

    # ---- charges --------------------------------------------------------------------

    def charge(self, model: ManagedModel, footprint: Footprint | None) -> None:
        model.charge(footprint)
        if footprint is not None:
            self._changed(model, footprint)

    def release(self, model: ManagedModel) -> None:
        """`model` no longer holds memory (unloaded, or its load failed)."""
        charged = model.discharge()
        if charged is not None:
            self._changed(model, charged)
        self.memory_may_have_freed()

    def memory_may_have_freed(self) -> None:
        """Wake loads waiting for memory: a model unloaded or became idle."""
        if self._waiting:
            self._freed.set()
            self._freed = asyncio.Event()

    def _changed(self, model: ManagedModel, footprint: Footprint) -> None:
        if footprint.unit != "bytes":  # a count budget: no byte series
            return
        device = footprint.device
        self.metrics.resident_changed(model.name, model.charged.amount if model.charged else 0)
        self.metrics.memory_changed(device, self.budget(device), self.used(device))

    # ---- measuring a load -------------------------------------------------------------

    @contextlib.contextmanager
    def measuring(self, model: ManagedModel) -> Iterator[None]:
        """Around a load: the device's memory before and after, for the model's detail.
        A load that overlapped another on the same device is not measured."""
        charged = model.charged
        if charged is None or charged.unit != "bytes":
            yield
            return
        loading = self._loading.setdefault(charged.device, set())
        if loading:
            self._overlapped.update(loading | {model.name})
        loading.add(model.name)
        before = memory_in_use(charged.device)
        try:
            yield
            after = memory_in_use(charged.device)
        finally:
            loading.discard(model.name)
        kind = "RSS" if charged.device == "cpu" else "device memory"
        estimate = f"memory: {charged.describe()} {charged.detail or 'estimated'}"
        if model.name in self._overlapped:
            measured = "not measured (another load on the device overlapped)"
        elif before is None or after is None:
            measured = f"{kind} not readable"
        else:
            delta = after - before
            measured = f"{'+' if delta >= 0 else '-'}{format_size(abs(delta))} {kind}"
            log.info(
                "model footprint",
                extra={
                    "model": model.name,
                    "estimated_bytes": charged.amount,
                    "measured_bytes": delta,
                },
            )
        self._overlapped.discard(model.name)
        model.measured(f"{estimate}; {measured} at load")
