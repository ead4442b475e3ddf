"""grpc.health.v1 Check and Watch, and the detailed Health RPC."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2

from inferwire.v1 import inference_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def check(health_stub, service: str) -> int:
    response = await health_stub.Check(health_pb2.HealthCheckRequest(service=service))
    return response.status


@pytest.mark.parametrize("service", ["", "inferwire.v1.InferenceService", "model/demo"])
async def test_server_and_startup_models_are_serving(health_stub, service):
    assert await check(health_stub, service) == SERVING


async def test_model_health_follows_unload_and_load(stub, health_stub):
    await stub.LoadModel(pb.LoadModelRequest(model="spare"))
    assert await check(health_stub, "model/spare") == SERVING
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
    assert await check(health_stub, "model/spare") == NOT_SERVING
    # spare is not a start-up model, so the server as a whole still serves.
    assert await check(health_stub, "") == SERVING
    await stub.LoadModel(pb.LoadModelRequest(model="spare"))
    assert await check(health_stub, "model/spare") == SERVING
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))


async def test_a_deliberately_unloaded_startup_model_no_longer_counts_for_the_server(
    stub, health_stub
):
    # An operator freed one model: the pod stays in service (Triton's readiness counts the
    # models that should be loaded; after an explicit unload this one no longer should).
    await stub.UnloadModel(pb.UnloadModelRequest(model="tight"))
    try:
        assert await check(health_stub, "model/tight") == NOT_SERVING
        assert await check(health_stub, "") == SERVING
        assert await check(health_stub, "inferwire.v1.InferenceService") == SERVING
    finally:
        await stub.LoadModel(pb.LoadModelRequest(model="tight"))
    assert await check(health_stub, "model/tight") == SERVING
    assert await check(health_stub, "") == SERVING


@pytest.mark.parametrize("service", ["model/no-such-model", "no.such.Service", "model/"])
async def test_unknown_service_is_not_found(health_stub, service):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await check(health_stub, service)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_receives_transitions(stub, health_stub):
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
    watch = health_stub.Watch(health_pb2.HealthCheckRequest(service="model/spare"))
    seen = [(await watch.read()).status]
    await stub.LoadModel(pb.LoadModelRequest(model="spare"))
    seen.append((await asyncio.wait_for(watch.read(), 10)).status)
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
    seen.append((await asyncio.wait_for(watch.read(), 10)).status)
    watch.cancel()
    assert seen == [NOT_SERVING, SERVING, NOT_SERVING]


async def test_detailed_health_reports_models_and_backends(stub):
    await stub.Infer(
        pb.InferRequest(model="demo", prompt="Hi", parameters=pb.GenerationParameters(max_tokens=4))
    )
    report = await stub.Health(pb.HealthRequest())
    assert report.serving
    models = {m.name: m for m in report.models}
    assert set(models) == {"demo", "tight", "spare", "broken"}
    assert models["demo"].ready and models["demo"].state == pb.MODEL_STATE_READY
    assert models["demo"].requests_total >= 1
    assert models["demo"].generated_tokens_total >= 4
    assert not models["spare"].ready
    assert [b.name for b in report.backends] == ["onnxruntime-genai"]
    assert report.backends[0].healthy

    single = await stub.Health(pb.HealthRequest(model="demo"))
    assert [m.name for m in single.models] == ["demo"]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Health(pb.HealthRequest(model="nope"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
