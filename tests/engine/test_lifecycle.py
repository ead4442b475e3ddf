"""LoadModel, UnloadModel and ListModels: states, idempotence, fail-closed, draining."""

import asyncio

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.waiting import model_health, read_rest, wait_until


async def state_of(stub, name: str) -> int:
    models = (await stub.ListModels(pb.ListModelsRequest())).models
    return next(m.state for m in models if m.name == name)


async def test_list_models_reports_every_configured_model(stub):
    models = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
    assert list(models) == ["demo", "tight", "spare", "broken"]
    demo = models["demo"]
    assert demo.backend == "onnxruntime-genai"
    assert demo.state == pb.MODEL_STATE_READY
    assert demo.capabilities.streaming
    assert demo.capabilities.on_premises
    assert demo.capabilities.max_concurrency == 8
    assert list(demo.capabilities.modalities) == ["text"]
    assert models["tight"].capabilities.max_concurrency == 1


async def test_inference_on_unloaded_model_fails_closed(stub):
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="spare", prompt="Hi"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "UNLOADED" in error.value.details()


async def test_load_and_unload_are_idempotent(stub):
    for _ in range(2):
        loaded = await stub.LoadModel(pb.LoadModelRequest(model="spare"))
        assert loaded.model.state == pb.MODEL_STATE_READY
        assert loaded.model.capabilities.context_length == 1024
    response = await stub.Infer(
        pb.InferRequest(
            model="spare", prompt="Hi", parameters=pb.GenerationParameters(max_tokens=2)
        )
    )
    assert response.usage.completion_tokens == 2
    for _ in range(2):
        unloaded = await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
        assert unloaded.model.state == pb.MODEL_STATE_UNLOADED
    assert await state_of(stub, "spare") == pb.MODEL_STATE_UNLOADED


async def test_concurrent_loads_are_serialised(stub):
    responses = await asyncio.gather(
        *(stub.LoadModel(pb.LoadModelRequest(model="spare")) for _ in range(4))
    )
    assert {r.model.state for r in responses} == {pb.MODEL_STATE_READY}
    await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))


async def test_unknown_model_load_is_not_found(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.LoadModel(pb.LoadModelRequest(model="not-configured"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_failed_load_reports_why_and_model_state_is_failed(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.LoadModel(pb.LoadModelRequest(model="broken"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.value.details().startswith(
        "model 'broken' failed to load: /nonexistent/inferwire-model/genai_config.json not found"
    )
    assert error.value.details().count("broken") == 1  # the model is named once
    models = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
    assert models["broken"].state == pb.MODEL_STATE_FAILED
    assert "genai_config.json" in models["broken"].detail
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="broken", prompt="Hi"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.value.details().count("broken") == 1
    assert error.value.details().count("load failed") == 1


async def test_unload_waits_for_inflight_streams_and_refuses_new_requests(stub, slow_stub):
    await stub.LoadModel(pb.LoadModelRequest(model="spare"))
    # A slow reader keeps this stream in flight until we drain it.
    stream = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="spare",
            prompt="Hello",
            parameters=pb.GenerationParameters(max_tokens=400, temperature=0),
        )
    )
    first = await stream.read()
    assert first.text
    unload = asyncio.ensure_future(stub.UnloadModel(pb.UnloadModelRequest(model="spare")))

    async def unloading() -> bool:
        return await state_of(stub, "spare") == pb.MODEL_STATE_UNLOADING

    await wait_until(unloading)
    assert not unload.done()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="spare", prompt="Hi"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "UNLOADING" in error.value.details()

    # The in-flight stream still runs to completion.
    messages = [first, *await read_rest(stream)]
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert messages[-1].usage.completion_tokens == 400
    assert (await unload).model.state == pb.MODEL_STATE_UNLOADED
    assert (await model_health(stub, "spare")).inflight == 0
