"""ListModels answers from messages it keeps while nothing changes (docs/performance.md,
"The unary floor"); every change shows in the very next call: loads, unloads, evictions,
residency, health, requests failing, and use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.core.errors import BackendUnavailableError
from inferwire.core.facts import PromptCacheStats
from inferwire.core.manager import ModelSpec
from inferwire.core.memory import Footprint
from inferwire.core.status import BackendHealth
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, FakeBackend, FakeBackends

MIB = 1 << 20


class SizedFakes(FakeBackends):
    """Fake backends that each hold 100 MiB on `cpu`."""

    def __call__(self, spec: ModelSpec) -> Any:
        backend = super().__call__(spec)
        assert isinstance(backend, FakeBackend)
        backend.footprint_ = Footprint("cpu", 100 * MIB, detail="as faked")
        return backend


@pytest.fixture
async def served() -> AsyncIterator[tuple[InferwireServer, SizedFakes, Any]]:
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "health_check_interval_s": 3600,
            "memory": {"budgets": {"cpu": "100MiB"}, "min_resident_s": 0},
        },
        models=[
            {"name": "a", "backend": FAKE_BACKEND},
            {"name": "b", "backend": FAKE_BACKEND},
        ],
    )
    backends = SizedFakes()
    server = InferwireServer(settings, backend_factory=backends)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, backends, inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(grace_s=0)


async def listed(stub: Any) -> dict[str, pb.ModelStatus]:
    # Twice: the second answer comes from what the first one kept, and must be the same.
    first = await stub.ListModels(pb.ListModelsRequest())
    second = await stub.ListModels(pb.ListModelsRequest())
    assert first == second
    return {status.name: status for status in second.models}


async def test_list_models_shows_each_change_in_the_next_call(served):
    _, backends, stub = served
    models = await listed(stub)
    assert models["a"].state == pb.MODEL_STATE_UNLOADED and not models["a"].HasField("last_used")

    await stub.LoadModel(pb.LoadModelRequest(model="a"))
    models = await listed(stub)
    assert models["a"].state == pb.MODEL_STATE_READY
    assert models["a"].resident_bytes == 100 * MIB
    assert models["a"].capabilities.max_output_tokens == 32
    loaded_at = models["a"].last_used.ToNanoseconds()

    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    models = await listed(stub)
    assert models["a"].last_used.ToNanoseconds() > loaded_at

    backends["a"].infer_error = BackendUnavailableError("stub crashed")
    for _ in range(3):  # FAILURES_BEFORE_NOT_READY
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    models = await listed(stub)
    assert models["a"].detail.startswith("not serving: the last 3 requests failed")
    backends["a"].infer_error = None
    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    assert not (await listed(stub))["a"].detail.startswith("not serving")

    backends["a"].health_ = BackendHealth(False, "fake: sick")
    await stub.LoadModel(pb.LoadModelRequest(model="a"))  # on a READY model: a health check
    assert (await listed(stub))["a"].detail.startswith("not serving: fake: sick")
    backends["a"].health_ = BackendHealth(True, "fake: fine")

    evicted = await stub.LoadModel(pb.LoadModelRequest(model="b"))  # the budget holds one
    assert list(evicted.evicted) == ["a"]
    models = await listed(stub)
    assert models["a"].state == pb.MODEL_STATE_UNLOADED and models["a"].resident_bytes == 0
    assert "evicted to load 'b'" in models["a"].detail
    assert models["b"].state == pb.MODEL_STATE_READY

    await stub.UnloadModel(pb.UnloadModelRequest(model="b"))
    models = await listed(stub)
    assert models["b"].state == pb.MODEL_STATE_UNLOADED
    assert not models["b"].HasField("capabilities")


async def test_a_model_status_is_the_same_object_until_the_model_changes(served):
    server, _, stub = served
    before = server.manager.model_status("a")
    assert server.manager.model_status("a") is before
    await stub.LoadModel(pb.LoadModelRequest(model="a"))
    loaded = server.manager.model_status("a")
    assert loaded is not before and loaded == server.manager.model_status("a")
    assert server.manager.model_status("a") is loaded
    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))  # use moves last_used
    assert server.manager.model_status("a").last_used != loaded.last_used


async def test_a_prompt_caches_figures_show_in_the_next_call(served):
    # A backend's prompt cache moves with every request, not with the model's version.
    _, backends, stub = served
    await stub.LoadModel(pb.LoadModelRequest(model="a"))
    backends["a"].prompt_cache = lambda: PromptCacheStats(2, 100, 2 * MIB, 200, 50)  # type: ignore[method-assign]
    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    detail = (await listed(stub))["a"].detail
    assert detail.endswith("prompt cache: 2 conversations (2.0 MiB), 25% of prompt tokens reused")
    backends["a"].prompt_cache = lambda: PromptCacheStats(1, 10, MIB, 400, 300)  # type: ignore[method-assign]
    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    assert (await listed(stub))["a"].detail.endswith(
        "prompt cache: 1 conversation (1.0 MiB), 75% of prompt tokens reused"
    )
