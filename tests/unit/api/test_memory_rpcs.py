"""Memory budgets over gRPC: LoadModel's evicted list, RESOURCE_EXHAUSTED with RetryInfo,
the new ModelStatus and Timing fields, model/<name> health of an on-demand model, and
the residency metrics; through the real server assembly over fake backends."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from inferwire.cli import app
from inferwire.config import load_settings
from inferwire.core.manager import ModelSpec
from inferwire.core.memory import Footprint
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
async def served() -> AsyncIterator[tuple[InferwireServer, SizedFakes, grpc.aio.Channel]]:
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "memory": {"budgets": {"cpu": "200MiB"}, "min_resident_s": 0},
        },
        models=[
            {"name": "pin", "backend": FAKE_BACKEND, "pinned": True, "load_on_startup": True},
            {"name": "a", "backend": FAKE_BACKEND},
            {"name": "od", "backend": FAKE_BACKEND, "on_demand": True},
        ],
    )
    backends = SizedFakes()
    server = InferwireServer(settings, backend_factory=backends)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, backends, channel
    finally:
        await server.stop(grace_s=0)


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_load_model_lists_evictions_and_list_models_reports_residency(served):
    server, _, channel = served
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    on_demand_health = await health.Check(health_pb2.HealthCheckRequest(service="model/od"))
    assert on_demand_health.status == health_pb2.HealthCheckResponse.SERVING

    assert list((await stub.LoadModel(pb.LoadModelRequest(model="a"))).evicted) == []
    await stub.Infer(pb.InferRequest(model="a", prompt="hi"))
    response = await stub.Infer(pb.InferRequest(model="od", prompt="hi"))  # evicts a
    assert response.timing.load_ms > 0
    statuses = {s.name: s for s in (await stub.ListModels(pb.ListModelsRequest())).models}
    assert statuses["pin"].pinned and not statuses["pin"].on_demand
    assert statuses["od"].on_demand and statuses["od"].resident_bytes == 100 * MIB
    assert statuses["od"].last_used.seconds > 0
    assert "memory: 100.0 MiB as faked; " in statuses["od"].detail
    assert statuses["a"].state == pb.MODEL_STATE_UNLOADED
    assert statuses["a"].resident_bytes == 0
    assert "evicted to load 'od'" in statuses["a"].detail
    loaded = await stub.LoadModel(pb.LoadModelRequest(model="a"))
    assert list(loaded.evicted) == ["od"]

    assert server.metrics_port is not None
    samples = await asyncio.to_thread(scrape, server.metrics_port)
    assert samples[("inferwire_memory_budget_bytes", frozenset({("device", "cpu")}))] == 200 * MIB
    assert samples[("inferwire_memory_used_bytes", frozenset({("device", "cpu")}))] == 200 * MIB
    assert samples[("inferwire_model_resident_bytes", frozenset({("model", "od")}))] == 0
    assert samples[("inferwire_model_evictions_total", frozenset({("model", "a")}))] == 1
    assert samples[("inferwire_model_evictions_total", frozenset({("model", "od")}))] == 1
    for trigger, model, count in [
        ("startup", "pin", 1),
        ("explicit", "a", 2),
        ("on_demand", "od", 1),
    ]:
        labels = frozenset({("model", model), ("trigger", trigger)})
        assert samples[("inferwire_model_loads_total", labels)] == count
    assert samples[("inferwire_model_load_seconds_count", frozenset({("model", "a")}))] == 2


async def test_memory_held_by_a_busy_model_is_resource_exhausted_with_retry_info(served):
    _, backends, channel = served
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    await stub.LoadModel(pb.LoadModelRequest(model="a"))
    backends["a"].generation_gate.close()
    busy = asyncio.ensure_future(stub.Infer(pb.InferRequest(model="a", prompt="hi")))
    await backends["a"].started.wait()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Infer(pb.InferRequest(model="od", prompt="hi"))
        error = refused.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'a' 100.0 MiB (busy: 1 running" in error.details()
        assert "'pin' 100.0 MiB (pinned)" in error.details()
        status = rpc_status.from_call(error)
        assert status is not None
        retry = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(retry)
        assert retry.retry_delay.ToNanoseconds() > 0
        with pytest.raises(grpc.aio.AioRpcError) as load_refused:
            await stub.LoadModel(pb.LoadModelRequest(model="od"))
        assert load_refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        backends["a"].generation_gate.open()
        await busy


async def test_models_list_shows_residency_footprint_and_pinning(served):
    server, _, channel = served
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    await stub.Infer(pb.InferRequest(model="od", prompt="hi"))
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["models", "list", "--address", f"127.0.0.1:{server.port}"]
    )
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert "MODEL_STATE_READY  [resident 100.0 MiB, pinned]  (" in lines["pin"]
    assert "MODEL_STATE_UNLOADED  (" not in lines["a"] and "[" not in lines["a"]
    assert "MODEL_STATE_READY  [resident 100.0 MiB, on-demand]  (" in lines["od"]
