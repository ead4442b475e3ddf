"""The server's readiness (grpc.health.v1 "" and inferwire.v1.InferenceService) counts
the models meant to be loaded now: the start-up models and those loaded since, less
those deliberately unloaded or evicted since. A model whose load failed, or whose backend
lost it, still counts until it is healed or unloaded (docs/operations.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from inferwire.core.errors import BackendUnavailableError
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.memory import Footprint, MemorySettings
from inferwire.core.requests import InferenceRequest
from inferwire.core.results import StreamChunk
from inferwire.core.sampling import GenerationParams
from inferwire.core.status import BackendHealth, ModelState
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends


def spec(name: str, **fields: object) -> ModelSpec:
    return ModelSpec(name=name, backend=FAKE_BACKEND, **fields)  # type: ignore[arg-type]


def manager(
    *specs: ModelSpec, memory: MemorySettings | None = None
) -> tuple[ModelManager, FakeBackends]:
    backends = FakeBackends()
    return ModelManager(list(specs), backends, RequestLimits(1024), memory=memory), backends


async def test_a_deliberate_unload_leaves_the_server_serving_and_a_lost_model_does_not():
    models, backends = manager(spec("m", load_on_startup=True), spec("spare"))
    await models.start()
    try:
        assert models.serving
        await models.load("spare")  # loaded since: it counts now
        backends["spare"].health_ = BackendHealth(False, "fake: lost its model")
        await models.check_backend_health()
        assert not models.serving and not models.health_statuses()["spare"]
        backends["spare"].health_ = BackendHealth(True, "fake: fine")
        await models.check_backend_health()
        assert models.serving
        await models.unload("m")  # deliberately: it no longer counts
        assert models.serving and not models.health_statuses()["m"]
        await models.load("m")
        backends["m"].health_ = BackendHealth(False, "fake: sick")
        await models.check_backend_health()
        assert not models.serving  # loaded again, it counts again
    finally:
        await models.close()


async def test_a_start_up_model_that_failed_to_load_counts_until_it_is_unloaded():
    models, backends = manager(spec("m", load_on_startup=True), spec("other", load_on_startup=True))
    backends["m"].load_error = BackendUnavailableError("fake: cannot load")
    failures = await models.start()
    try:
        assert set(failures) == {"m"}
        assert not models.serving
        await models.unload("m")  # the operator gives up on it
        assert models.serving
    finally:
        await models.close()


async def test_a_model_the_memory_budget_evicted_counts_as_deliberately_unloaded():
    budget = MemorySettings(budgets={"cpu": 100}, min_resident_s=0)
    models, backends = manager(spec("a", load_on_startup=True), spec("b"), memory=budget)
    for name in ("a", "b"):
        backends[name].footprint_ = Footprint("cpu", 80)
    await models.start()
    try:
        assert models.serving
        _, evicted = await models.load_evicting("b")
        assert evicted == ["a"]
        assert models.serving  # a was evicted to make room: it is not meant to be loaded
    finally:
        await models.close()


async def _read_all(chunks: AsyncIterator[StreamChunk]) -> list[StreamChunk]:
    return [chunk async for chunk in chunks]


async def test_an_unload_stops_counting_when_it_starts_not_after_its_drain():
    """The window CI found: "" went NOT_SERVING for as long as the unloaded model's
    in-flight requests took to finish, so health-checked channels on "" saw UNAVAILABLE."""
    models, backends = manager(spec("m", load_on_startup=True), spec("spare"))
    await models.start()
    published: list[dict[str, bool]] = []

    async def record(statuses: dict[str, bool]) -> None:
        published.append(statuses)

    models.add_health_listener(record)
    try:
        await models.load("spare")
        backends["spare"].generation_gate.close()
        _, chunks = models.infer_stream(
            InferenceRequest("", "spare", "hi", params=GenerationParams())
        )
        stream = asyncio.create_task(_read_all(chunks))
        await backends["spare"].started.wait()
        unloading = asyncio.create_task(models.unload("spare"))
        await asyncio.sleep(0)
        assert models.model_status("spare").state is ModelState.UNLOADING
        assert models.serving and not models.health_statuses()["spare"]
        backends["spare"].generation_gate.open()
        assert "".join(chunk.text for chunk in await stream) == "Hello, world"
        await unloading
        assert all(statuses[""] for statuses in published), published
    finally:
        backends["spare"].generation_gate.open()
        await models.close()
