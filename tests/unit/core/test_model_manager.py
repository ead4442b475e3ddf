"""The model manager through the scriptable fake backend: states, admission, health.

No engine, no subprocess, no wall-clock waits: requests are held in flight by gates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferwire.core.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    ModelNotFoundError,
    ModelNotReadyError,
    QueueFullError,
)
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.requests import InferenceRequest
from inferwire.core.results import FinishReason, StreamChunk
from inferwire.core.sampling import GenerationParams
from inferwire.core.status import BackendHealth, ModelState
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends


def spec(name: str, startup: bool = False, concurrency: int = 4, queue: int = 4) -> ModelSpec:
    return ModelSpec(
        name=name,
        backend=FAKE_BACKEND,
        load_on_startup=startup,
        max_concurrency=concurrency,
        max_queue=queue,
    )


class Harness:
    """A manager over fake backends, and every health map it published."""

    def __init__(self, *specs: ModelSpec, failure_cooldown_s: float | None = None) -> None:
        self.backends = FakeBackends()
        self.manager = ModelManager(
            list(specs) or [spec("m")],
            self.backends,
            RequestLimits(max_prompt_bytes=1024),
            failure_cooldown_s=failure_cooldown_s,
        )
        self.published: list[dict[str, bool]] = []
        self.manager.add_health_listener(self._record)

    async def _record(self, statuses: dict[str, bool]) -> None:
        self.published.append(statuses)

    def state(self, model: str = "m") -> ModelState:
        return self.manager.model_status(model).state


def request(model: str = "m", prompt: str = "hi", **params: object) -> InferenceRequest:
    return InferenceRequest("", model, prompt, params=GenerationParams(**params))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(harness: Harness) -> AsyncIterator[Harness]:
    await harness.manager.start()
    try:
        yield harness
    finally:
        await harness.manager.close()


async def collect(chunks: AsyncIterator[StreamChunk]) -> list[StreamChunk]:
    return [chunk async for chunk in chunks]


async def test_model_moves_through_its_states_and_loads_are_idempotent():
    harness = Harness(spec("m"))
    backend = harness.backends["m"]
    assert harness.state() is ModelState.UNLOADED
    backend.load_gate.close()
    loading = asyncio.create_task(harness.manager.load("m"))
    await asyncio.sleep(0)
    assert harness.state() is ModelState.LOADING
    with pytest.raises(ModelNotReadyError, match="still loading"):
        await harness.manager.infer(request())
    backend.load_gate.open()
    assert (await loading).state is ModelState.READY
    assert (await harness.manager.load("m")).state is ModelState.READY
    assert backend.calls.loads == 1
    assert (await harness.manager.unload("m")).state is ModelState.UNLOADED
    assert (await harness.manager.unload("m")).state is ModelState.UNLOADED
    assert backend.calls.unloads == 1


async def test_failed_load_turns_failed_with_detail_and_a_later_load_recovers():
    harness = Harness(spec("m"))
    backend = harness.backends["m"]
    backend.load_error = RuntimeError("weights are corrupt")
    with pytest.raises(ModelNotReadyError, match="'m' failed to load: weights are corrupt"):
        await harness.manager.load("m")
    status = harness.manager.model_status("m")
    assert (status.state, status.detail) == (ModelState.FAILED, "load failed: weights are corrupt")
    with pytest.raises(ModelNotReadyError, match="its last load failed"):
        await harness.manager.infer(request())
    backend.load_error = None
    assert (await harness.manager.load("m")).state is ModelState.READY


async def test_start_returns_the_startup_models_that_failed_and_why():
    harness = Harness(spec("m", startup=True), spec("ok", startup=True), spec("later"))
    harness.backends["m"].load_error = RuntimeError("weights are corrupt")
    try:
        assert await harness.manager.start() == {"m": "weights are corrupt"}
        assert harness.state("ok") is ModelState.READY
        with pytest.raises(ModelNotReadyError) as refused:
            await harness.manager.infer(request())
    finally:
        await harness.manager.close()
    assert str(refused.value) == (
        "model 'm' is FAILED, not READY: its last load failed: weights are corrupt"
    )


@pytest.mark.parametrize(
    "error", [BackendUnavailableError("down"), ModelNotFoundError("m", "not on the backend")]
)
async def test_load_failures_that_name_their_cause_keep_their_kind(error):
    harness = Harness(spec("m"))
    harness.backends["m"].load_error = error
    with pytest.raises(type(error)):
        await harness.manager.load("m")
    assert harness.state() is ModelState.FAILED


async def test_inference_on_a_model_that_is_not_loaded_fails_closed():
    harness = Harness(spec("m"))
    with pytest.raises(ModelNotReadyError, match="call LoadModel first"):
        await harness.manager.infer(request())
    assert harness.backends["m"].calls.requests == []


async def test_unknown_and_empty_model_names_are_refused_before_any_backend():
    harness = Harness(spec("m"))
    with pytest.raises(ModelNotFoundError, match="'ghost' is not configured"):
        await harness.manager.load("ghost")
    with pytest.raises(InvalidArgumentError, match="model: must be a non-empty"):
        await harness.manager.unload("")


async def test_unary_and_stream_return_the_same_text_usage_and_finish():
    async with running(Harness(spec("m", startup=True))) as harness:
        result = await harness.manager.infer(request())
        request_id, chunks = harness.manager.infer_stream(request())
        streamed = await collect(chunks)
    assert request_id
    assert result.text == "".join(c.text for c in streamed) == "Hello, world"
    assert streamed[-1].finish_reason is result.finish_reason is FinishReason.STOP
    assert streamed[-1].usage == result.usage
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 3)


async def test_core_renders_context_and_resolves_max_tokens_for_the_backend():
    async with running(Harness(spec("m", startup=True))) as harness:
        backend = harness.backends["m"]
        await harness.manager.infer(
            InferenceRequest("r1", "m", "question", context=("a", "b"), params=GenerationParams())
        )
        await harness.manager.infer(request(max_tokens=2))
    first, second = backend.calls.requests
    assert first.prompt == "a\n\nb\n\nquestion" and first.prompt_field == "context"
    assert first.max_tokens == min(256, backend.limits_.max_output_tokens)
    assert second.max_tokens == 2 and second.prompt_field == "prompt"


async def test_stop_string_cuts_the_text_closes_the_backend_stream_and_counts_to_the_match():
    async with running(Harness(spec("m", startup=True))) as harness:
        backend = harness.backends["m"]
        backend.pieces = ["Hel", "lo w", "orld", " and", " more"]
        result = await harness.manager.infer(request(stop=("o wo",)))
        _, chunks = harness.manager.infer_stream(request(stop=("o wo",)))
        streamed = await collect(chunks)
    assert result.text == "".join(c.text for c in streamed) == "Hell"
    assert result.finish_reason is streamed[-1].finish_reason is FinishReason.STOP_SEQUENCE
    assert result.usage.completion_tokens == 3  # the token that completed the stop string
    assert backend.calls.streams_closed_early == 2


async def test_limits_the_model_sets_are_field_violations():
    async with running(Harness(spec("m", startup=True))) as harness:
        with pytest.raises(InvalidArgumentError) as raised:
            await harness.manager.infer(request(max_tokens=33, seed=1001))
    fields = [v.field for v in raised.value.violations]
    assert fields == ["parameters.max_tokens", "parameters.seed"]
    assert "allows at most 32" in str(raised.value)


async def hold_one_and_queue_one(harness: Harness) -> tuple[asyncio.Task[Any], ...]:
    """One request holding model m's only slot (its gate closed), and one queued behind it."""
    harness.backends["m"].generation_gate.close()
    holding = asyncio.create_task(harness.manager.infer(request()))
    await harness.backends["m"].started.wait()
    queued = asyncio.create_task(harness.manager.infer(request()))
    await asyncio.sleep(0)
    return holding, queued


async def test_a_full_queue_is_refused_and_queued_requests_run_when_a_slot_frees():
    async with running(Harness(spec("m", startup=True, concurrency=1, queue=1))) as harness:
        backend = harness.backends["m"]
        running_request, queued = await hold_one_and_queue_one(harness)
        report = (await harness.manager.health_report("m")).models[0]
        assert (report.inflight, report.queued) == (1, 1)
        with pytest.raises(QueueFullError, match="max_queue 1"):
            await harness.manager.infer(request())
        backend.generation_gate.open()
        assert (await running_request).text == (await queued).text == "Hello, world"


async def test_unload_refuses_new_requests_at_once_and_waits_for_inflight_ones():
    async with running(Harness(spec("m", startup=True))) as harness:
        backend = harness.backends["m"]
        backend.generation_gate.close()
        _, chunks = harness.manager.infer_stream(request())
        stream = asyncio.create_task(collect(chunks))
        await backend.started.wait()
        unloading = asyncio.create_task(harness.manager.unload("m"))
        await asyncio.sleep(0)
        assert harness.state() is ModelState.UNLOADING
        with pytest.raises(ModelNotReadyError, match="being unloaded"):
            await harness.manager.infer(request())
        assert backend.calls.unloads == 0
        backend.generation_gate.open()
        assert "".join(c.text for c in await stream) == "Hello, world"
        assert (await unloading).state is ModelState.UNLOADED
        assert backend.calls.unloads == 1


async def test_a_queued_request_whose_model_starts_unloading_is_refused_not_run():
    async with running(Harness(spec("m", startup=True, concurrency=1, queue=4))) as harness:
        backend = harness.backends["m"]
        first, queued = await hold_one_and_queue_one(harness)
        unloading = asyncio.create_task(harness.manager.unload("m"))
        await asyncio.sleep(0)
        backend.generation_gate.open()
        assert (await first).text == "Hello, world"
        with pytest.raises(ModelNotReadyError, match="being unloaded"):
            await queued
        assert (await unloading).state is ModelState.UNLOADED
        assert len(backend.calls.requests) == 1


async def test_a_consumer_that_leaves_closes_the_backend_stream_and_frees_the_slot():
    async with running(Harness(spec("m", startup=True, concurrency=1, queue=0))) as harness:
        backend = harness.backends["m"]
        _, chunks = harness.manager.infer_stream(request())
        async with contextlib.aclosing(chunks):
            assert (await anext(chunks)).text == "Hello"
        assert backend.calls.streams_closed_early == 1
        assert (await harness.manager.infer(request())).text == "Hello, world"


async def test_backend_errors_reach_the_caller_and_free_the_slot():
    async with running(Harness(spec("m", startup=True, concurrency=1, queue=0))) as harness:
        backend = harness.backends["m"]
        backend.infer_error, backend.error_after_pieces = BackendUnavailableError("gone"), 1
        with pytest.raises(BackendUnavailableError, match="gone"):
            await harness.manager.infer(request())
        backend.infer_error = None
        assert (await harness.manager.infer(request())).text == "Hello, world"


async def test_health_transitions_are_pushed_to_listeners():
    harness = Harness(spec("m", startup=True), spec("spare"))
    async with running(harness):
        assert harness.published[0] == {"": False, "m": False, "spare": False}
        assert harness.published[-1] == {"": True, "m": True, "spare": False}
        await harness.manager.load("spare")
        assert harness.published[-1]["spare"] is True
        await harness.manager.unload("m")
        # Deliberately unloaded, m no longer counts for the server (docs/operations.md).
        assert harness.published[-1] == {"": True, "m": False, "spare": True}
        published_before_shutdown = len(harness.published)
        await harness.manager.begin_shutdown()
        assert harness.published[published_before_shutdown:] == [
            {"": False, "m": False, "spare": False}
        ]


async def test_backend_health_flapping_follows_each_check_and_only_changes_are_published():
    async with running(Harness(spec("m", startup=True))) as harness:
        backend = harness.backends["m"]
        published = len(harness.published)
        await harness.manager.check_backend_health()
        assert len(harness.published) == published  # nothing changed
        backend.health_ = BackendHealth(False, "endpoint down")
        await harness.manager.check_backend_health()
        assert harness.published[-1] == {"": False, "m": False}
        assert harness.manager.model_status("m").detail == "not serving: endpoint down"
        backend.health_ = ConnectionError("no route")
        await harness.manager.check_backend_health()
        assert harness.manager.model_status("m").detail == (
            "not serving: health check failed: no route"
        )
        backend.health_ = BackendHealth(True, "fake: fine")
        await harness.manager.check_backend_health()
        assert harness.published[-1] == {"": True, "m": True}
        report = await harness.manager.health_report()
        assert report.serving and report.models[0].ready and report.backends[0].healthy


async def test_load_on_a_ready_model_has_the_backend_check_it_still_has_the_model():
    async with running(Harness(spec("m", startup=True))) as harness:
        backend = harness.backends["m"]
        assert (await harness.manager.load("m")).state is ModelState.READY
        assert (backend.calls.loads, backend.calls.reconciles) == (1, 1)
        backend.reconcile_error = BackendUnavailableError("no endpoint took the model")
        backend.health_ = BackendHealth(False, "0 of 1 endpoints")
        with pytest.raises(BackendUnavailableError):
            await harness.manager.load("m")
        status = harness.manager.model_status("m")
        assert (status.state, status.detail) == (ModelState.READY, "not serving: 0 of 1 endpoints")
        assert harness.published[-1]["m"] is False


async def test_requests_failing_in_the_backend_take_readiness_away_until_one_succeeds():
    async with running(Harness(spec("m", startup=True), failure_cooldown_s=3600)) as harness:
        backend = harness.backends["m"]
        backend.infer_error = InvalidArgumentError([])  # the request's fault: never counted
        for _ in range(5):
            with pytest.raises(InvalidArgumentError):
                await harness.manager.infer(request())
        assert harness.published[-1]["m"] is True
        backend.infer_error = BackendUnavailableError("stub crashed")
        for _ in range(3):
            with pytest.raises(BackendUnavailableError):
                await harness.manager.infer(request())
        assert harness.published[-1] == {"": False, "m": False}
        detail = harness.manager.model_status("m").detail
        assert detail == "not serving: the last 3 requests failed (stub crashed)"
        await harness.manager.check_backend_health()  # healthy, but within the cool-down
        assert harness.published[-1]["m"] is False
        backend.infer_error = None
        assert (await harness.manager.infer(request())).text == "Hello, world"
        assert harness.published[-1] == {"": True, "m": True}


async def test_a_healthy_check_after_the_cool_down_gives_readiness_back():
    async with running(Harness(spec("m", startup=True), failure_cooldown_s=0)) as harness:
        backend = harness.backends["m"]
        backend.infer_error = RuntimeError("engine fault")
        for _ in range(3):
            with pytest.raises(RuntimeError):
                await harness.manager.infer(request())
        assert harness.published[-1]["m"] is False
        await harness.manager.check_backend_health()
        assert harness.published[-1]["m"] is True
