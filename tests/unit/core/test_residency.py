"""Many models on bounded memory, through the fake backend: budgets, least-recently-used
eviction, pinning, anti-thrash, on-demand loads and their waiters, idle unloads.

Requests are held in flight by gates; the only clock the tests lean on is
min_resident_s (set to 0 unless a test is about it) and idle_unload_s, whose test
waits for the unload with a bound and asserts nothing about how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferwire.core.errors import (
    ConfigurationError,
    DeadlineExceededError,
    MemoryExhaustedError,
    ModelNotReadyError,
)
from inferwire.core.lifecycle import Trigger
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.memory import Footprint, MemorySettings
from inferwire.core.requests import InferenceRequest
from inferwire.core.status import ModelState
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends

MODEL_BYTES = 100


class RecordedMemoryMetrics:
    """A MemoryMetrics that keeps what it was told."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []
        self.evictions: list[str] = []
        self.used: dict[str, int] = {}
        self.budgets: dict[str, int | None] = {}
        self.resident: dict[str, int] = {}

    def model_loaded(self, model: str, trigger: str, seconds: float) -> None:
        assert seconds >= 0
        self.loads.append((model, trigger))

    def model_evicted(self, model: str) -> None:
        self.evictions.append(model)

    def memory_changed(self, device: str, budget: int | None, used: int) -> None:
        self.budgets[device], self.used[device] = budget, used

    def resident_changed(self, model: str, resident_bytes: int) -> None:
        self.resident[model] = resident_bytes


def spec(name: str, **fields: Any) -> ModelSpec:
    return ModelSpec(name=name, backend=FAKE_BACKEND, **fields)


class Memory:
    """A manager whose fake models hold MODEL_BYTES each on `cpu`, within `budget`."""

    def __init__(
        self,
        *specs: ModelSpec,
        budget: int = 2 * MODEL_BYTES,
        load_wait_s: float = 0.0,
        min_resident_s: float = 0.0,
        unit: str = "bytes",
    ) -> None:
        self.backends = FakeBackends()
        self.metrics = RecordedMemoryMetrics()
        memory = MemorySettings(
            budgets={"cpu": budget} if unit == "bytes" else {},
            load_wait_s=load_wait_s,
            min_resident_s=min_resident_s,
        )
        self.unit = unit
        self.budget = budget
        self.manager = ModelManager(
            list(specs),
            self._factory,
            RequestLimits(max_prompt_bytes=1024),
            memory=memory,
            memory_metrics=self.metrics,
            failure_cooldown_s=60.0,
        )
        self.published: list[dict[str, bool]] = []
        self.manager.add_health_listener(self._record)

    def _factory(self, model_spec: ModelSpec) -> Any:
        backend = self.backends(model_spec)
        if self.unit == "bytes":
            backend.footprint_ = Footprint("cpu", MODEL_BYTES, detail="as faked")  # type: ignore[attr-defined]
        else:
            backend.footprint_ = Footprint("triton:pool", 1, "models", budget=self.budget)  # type: ignore[attr-defined]
        return backend

    async def _record(self, statuses: dict[str, bool]) -> None:
        self.published.append(statuses)

    def state(self, model: str) -> ModelState:
        return self.manager.model_status(model).state

    def resident(self) -> set[str]:
        return {s.name for s in self.manager.list_models() if s.state is ModelState.READY}

    @contextlib.asynccontextmanager
    async def busy(self, model: str) -> AsyncIterator[asyncio.Task[Any]]:
        """One request held in flight on `model` for the duration."""
        backend = self.backends[model]
        backend.generation_gate.close()
        backend.started.clear()
        task = asyncio.create_task(self.manager.infer(ask(model)))
        await backend.started.wait()
        try:
            yield task
        finally:
            backend.generation_gate.open()
            await task


def ask(model: str, deadline: float | None = None) -> InferenceRequest:
    return InferenceRequest("", model, "hi", deadline=deadline)


@contextlib.asynccontextmanager
async def running(memory: Memory) -> AsyncIterator[Memory]:
    await memory.manager.start()
    try:
        yield memory
    finally:
        await memory.manager.close()


async def test_a_load_that_does_not_fit_evicts_the_least_recently_used_idle_model_only():
    async with running(Memory(spec("a"), spec("b"), spec("c"), budget=2 * MODEL_BYTES)) as m:
        await m.manager.load("a")
        await m.manager.load("b")
        await m.manager.infer(ask("a"))  # a is now the more recently used
        status, evicted = await m.manager.load_evicting("c")
        assert evicted == ["b"]
        assert status.state is ModelState.READY and status.resident_bytes == MODEL_BYTES
        assert m.resident() == {"a", "c"}
        b = m.manager.model_status("b")
        assert b.state is ModelState.UNLOADED and "evicted to load 'c' at " in b.detail
        assert b.resident_bytes == 0
        assert m.backends["b"].calls.unloads == 1
        assert m.metrics.evictions == ["b"]
        assert m.metrics.used["cpu"] == 2 * MODEL_BYTES
        assert m.metrics.resident == {"a": MODEL_BYTES, "b": 0, "c": MODEL_BYTES}
        assert [load for load in m.metrics.loads if load[0] == "c"] == [("c", "explicit")]


async def test_pinned_and_busy_models_are_not_evicted_and_the_refusal_names_the_holders():
    models = spec("pin", pinned=True), spec("b"), spec("c")
    async with running(Memory(*models)) as m:
        await m.manager.load("pin")
        await m.manager.load("b")
        async with m.busy("b"):
            with pytest.raises(MemoryExhaustedError) as refused:
                await m.manager.load_evicting("c")
            message = str(refused.value)
            assert f"needs 100 B ({MODEL_BYTES} bytes) on cpu" in message
            assert "0 B (0 bytes) of its 200 B budget free" in message
            assert "'pin' 100 B (pinned)" in message
            assert "'b' 100 B (busy: 1 running, 0 queued" in message
            assert m.resident() == {"pin", "b"}  # nothing was evicted for nothing
            assert m.state("c") is ModelState.UNLOADED
        # Once b is idle it goes, the pinned model stays.
        assert (await m.manager.load_evicting("c"))[1] == ["b"]
        assert m.resident() == {"pin", "c"}
        # Explicit unloads and loads still work on a pinned model.
        await m.manager.unload("pin")
        assert m.state("pin") is ModelState.UNLOADED
        await m.manager.load("pin")
        assert m.resident() == {"pin", "c"}


async def test_a_model_loaded_less_than_min_resident_s_ago_is_not_evicted():
    async with running(Memory(spec("a"), spec("b"), budget=MODEL_BYTES, min_resident_s=60)) as m:
        await m.manager.load("a")
        with pytest.raises(MemoryExhaustedError) as refused:
            await m.manager.load("b")
        assert "'a' 100 B (too recent: loaded " in str(refused.value)
        assert "min_resident_s 60" in str(refused.value)
        delay = refused.value.retry_delay_s
        assert delay is not None and 0 < delay <= 60


async def test_a_model_larger_than_the_budget_is_refused_without_evicting():
    async with running(Memory(spec("a"), spec("big", memory_bytes=500))) as m:
        await m.manager.load("a")
        with pytest.raises(MemoryExhaustedError, match="needs 500 B"):
            await m.manager.load("big")
        assert m.resident() == {"a"}


async def test_on_demand_requests_share_one_load_and_report_the_time_they_waited():
    async with running(Memory(spec("od", on_demand=True, max_concurrency=8))) as m:
        backend = m.backends["od"]
        assert m.published[-1]["od"] is True  # loadable on demand: SERVING
        backend.load_gate.close()
        requests = [asyncio.create_task(m.manager.infer(ask("od"))) for _ in range(6)]
        await asyncio.sleep(0)
        while m.state("od") is not ModelState.LOADING:
            await asyncio.sleep(0)
        backend.load_gate.open()
        results = await asyncio.gather(*requests)
        assert backend.calls.loads == 1
        assert all(r.text == "Hello, world" for r in results)
        assert all(r.timing.load_ms > 0 for r in results)
        assert all(r.timing.queue_ms >= 0 for r in results)
        resident = await m.manager.infer(ask("od"))
        assert resident.timing.load_ms == 0
        assert ("od", "on_demand") in m.metrics.loads
        # Tokenize loads on demand too.
        await m.manager.unload("od")
        assert (await m.manager.tokenize("od", "ab", ())).token_ids == (97, 98)
        assert backend.calls.loads == 2


async def test_a_failed_on_demand_load_fails_every_waiting_request_with_its_error():
    async with running(Memory(spec("od", on_demand=True))) as m:
        backend = m.backends["od"]
        backend.load_error = RuntimeError("model.onnx is corrupt")
        backend.load_gate.close()
        requests = [asyncio.create_task(m.manager.infer(ask("od"))) for _ in range(5)]
        while m.state("od") is not ModelState.LOADING:
            await asyncio.sleep(0)
        backend.load_gate.open()
        outcomes = await asyncio.gather(*requests, return_exceptions=True)
        assert backend.calls.loads == 1
        for outcome in outcomes:
            assert isinstance(outcome, ModelNotReadyError)
            assert "failed to load: model.onnx is corrupt" in str(outcome)
        assert m.published[-1]["od"] is False  # its load failed: NOT_SERVING
        # Within the cool-down a request gets the load's error without loading again.
        with pytest.raises(ModelNotReadyError, match=r"model\.onnx is corrupt"):
            await m.manager.infer(ask("od"))
        assert backend.calls.loads == 1
        # An explicit load retries at once.
        backend.load_error = None
        await m.manager.load("od")
        assert m.published[-1]["od"] is True


async def test_an_on_demand_request_waits_load_wait_s_for_a_busy_model_then_loads():
    models = spec("a"), spec("od", on_demand=True)
    async with running(Memory(*models, budget=MODEL_BYTES, load_wait_s=30)) as m:
        await m.manager.load("a")
        async with m.busy("a"):
            waiting = asyncio.create_task(m.manager.infer(ask("od")))
            while (
                m.manager._lifecycle.residency.waiting_for_memory(m.manager._models["od"]) is None
            ):
                await asyncio.sleep(0)
            assert not waiting.done()
        result = await waiting  # a became idle: evicted, od loaded
        assert result.timing.load_ms > 0
        assert m.resident() == {"od"}
        assert "evicted to load 'od'" in m.manager.model_status("a").detail


async def test_without_load_wait_an_on_demand_request_gets_resource_exhausted_with_a_retry():
    models = spec("a"), spec("od", on_demand=True)
    async with running(Memory(*models, budget=MODEL_BYTES)) as m:
        await m.manager.load("a")
        async with m.busy("a"):
            with pytest.raises(MemoryExhaustedError) as refused:
                await m.manager.infer(ask("od"))
        assert refused.value.retry_delay_s is not None
        assert "'a' 100 B (busy: 1 running" in str(refused.value)
        assert m.state("od") is ModelState.UNLOADED
        assert m.published[-1]["od"] is True  # still loadable once memory frees


async def test_the_wait_for_memory_never_passes_the_request_deadline():
    models = spec("a"), spec("od", on_demand=True)
    async with running(Memory(*models, budget=MODEL_BYTES, load_wait_s=600)) as m:
        await m.manager.load("a")
        async with m.busy("a"):
            with pytest.raises(MemoryExhaustedError) as refused:
                await m.manager.infer(ask("od", deadline=time.monotonic() + 0.05))
            assert refused.value.retry_delay_s is not None
            # The load nobody waits for any more was given up.
            while m.manager._lifecycle._on_demand:
                await asyncio.sleep(0)
        assert m.state("od") is ModelState.UNLOADED


async def test_a_request_whose_deadline_passes_while_its_model_loads_gets_deadline_exceeded():
    async with running(Memory(spec("od", on_demand=True))) as m:
        m.backends["od"].load_gate.close()
        with pytest.raises(DeadlineExceededError, match="still loading"):
            await m.manager.infer(ask("od", deadline=time.monotonic() + 0.05))
        m.backends["od"].load_gate.open()
        await m.manager.load("od")  # the load went on for the next requests


async def test_idle_unload_s_unloads_and_the_next_request_loads_again():
    models = (spec("od", on_demand=True, idle_unload_s=0.05),)
    async with running(Memory(*models)) as m:
        await m.manager.infer(ask("od"))
        assert m.state("od") is ModelState.READY
        async with asyncio.timeout(10):
            while m.state("od") is not ModelState.UNLOADED:
                await asyncio.sleep(0.01)
        assert "without a request" in m.manager.model_status("od").detail
        assert m.published[-1]["od"] is True  # still SERVING: loadable on demand
        again = await m.manager.infer(ask("od"))
        assert again.timing.load_ms > 0
        assert m.backends["od"].calls.loads == 2


async def test_a_count_budget_keeps_at_most_that_many_models_loaded():
    models = spec("x", on_demand=True), spec("y", on_demand=True)
    async with running(Memory(*models, budget=1, unit="models")) as m:
        for model in ["x", "y", "x", "y"]:
            await m.manager.infer(ask(model))
            assert m.resident() == {model}
        assert m.manager.model_status("x").resident_bytes == 0
        assert m.metrics.used == {}  # a count is not bytes


async def test_start_up_loads_are_counted_and_last_used_is_reported():
    async with running(Memory(spec("a", load_on_startup=True))) as m:
        assert m.metrics.loads == [("a", Trigger.STARTUP.value)]
        status = m.manager.model_status("a")
        assert status.last_used is not None and status.resident_bytes == MODEL_BYTES
        assert "memory: 100 B as faked; " in status.detail


def test_declared_memory_bytes_on_a_count_budget_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="memory_bytes does not apply"):
        Memory(spec("x", memory_bytes=10), unit="models")
