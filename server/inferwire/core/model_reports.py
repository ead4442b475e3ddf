"""What the models say of themselves: ListModels' `ModelStatus`, and the Health RPC's
per-model and per-backend reports.

Plain functions of a `ManagedModel`'s read-only fields, so that what a model reports is
written once and the model itself only keeps its state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from inferwire.core.facts import PromptCacheStats
from inferwire.core.memory import format_size
from inferwire.core.status import BackendHealthReport, ModelHealthReport, ModelState, ModelStatus

if TYPE_CHECKING:
    from inferwire.core.models import ManagedModel


def describe_prompt_cache(cache: PromptCacheStats) -> str:
    conversations = cache.cached_conversations
    return (
        f"prompt cache: {conversations} conversation{'s' if conversations != 1 else ''} "
        f"({format_size(cache.cached_bytes)}), {cache.hit_rate:.0%} of prompt tokens reused"
    )


def model_status(model: ManagedModel) -> ModelStatus:
    """What ListModels says of `model` (ManagedModel.status keeps it while it holds)."""
    ready_state = model.state is ModelState.READY
    facts = model.facts if ready_state else None
    detail = model.detail
    if ready_state and not model.ready:
        # READY is the lifecycle (loaded); the detail says it cannot serve right now.
        detail = f"not serving: {detail}"
    if ready_state:
        cache = model.backend.prompt_cache()
        for more in (
            model.memory_detail,
            model.admission.reservation.describe(),
            describe_prompt_cache(cache) if cache is not None else "",
        ):
            detail = f"{detail}; {more}" if detail and more else detail or more
    spec = model.spec
    return ModelStatus(
        spec.name,
        spec.backend,
        model.state,
        detail,
        facts.capabilities if facts is not None else None,
        pinned=spec.pinned,
        on_demand=spec.on_demand,
        resident_bytes=model.charged.amount if model.charged is not None else 0,
        last_used=model.last_used_wall,
        base_model=spec.adapter_of or "",
        version=model.version,
    )


def model_health_report(model: ManagedModel) -> ModelHealthReport:
    """What the Health RPC says of `model`: its state, readiness and request counts."""
    return ModelHealthReport(
        name=model.spec.name,
        backend=model.spec.backend,
        state=model.state,
        ready=model.ready,
        detail=model.detail,
        inflight=model.running,
        queued=model.queued,
        requests_total=model.requests_total,
        generated_tokens_total=model.generated_tokens_total,
    )


def backend_health_reports(models: Iterable[ManagedModel]) -> tuple[BackendHealthReport, ...]:
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
