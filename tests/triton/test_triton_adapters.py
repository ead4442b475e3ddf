"""Adapter models on Triton: `lora_name` in the vLLM backend's sampling parameters.

One tritonserver of its own (vllm_echo answers per `lora_name` from its multi_lora.json,
and refuses one it does not list); an adapter on a TensorRT-LLM model is refused at load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.triton import TritonServer


@pytest.fixture(scope="module")
def triton(triton_dir: Path, record_dir: Path) -> Iterator[TritonServer]:
    with TritonServer(record_dir) as server:
        yield server


@pytest.fixture(scope="module")
async def stub(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    allowed = tmp_path_factory.mktemp("allowed")
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "adapters": {"allowed_dirs": [str(allowed)]},
        },
        models=[
            {
                "name": "base",
                "backend": "triton",
                "load_on_startup": True,
                "options": {"url": triton.url, "triton_model": "vllm_echo"},
            },
            {"name": "base-support", "adapter_of": "base", "options": {"lora_name": "support"}},
            {"name": "base-ghost", "adapter_of": "base", "options": {"lora_name": "ghost"}},
            {
                "name": "trt",
                "backend": "triton",
                "load_on_startup": True,
                "options": {"url": triton.url, "triton_model": "trtllm_echo"},
            },
            {"name": "trt-support", "adapter_of": "trt", "options": {"lora_name": "support"}},
        ],
    )
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(grace_s=1)


async def text(stub: inference_pb2_grpc.InferenceServiceStub, model: str, stream: bool) -> str:
    params = pb.GenerationParameters(max_tokens=4)
    if stream:
        request = pb.InferStreamRequest(model=model, prompt="alpha beta", parameters=params)
        return "".join([m.text async for m in stub.InferStream(request)])
    request_ = pb.InferRequest(model=model, prompt="alpha beta", parameters=params)
    return str((await stub.Infer(request_)).text)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_adapter_model_sends_its_lora_name(stub, stream: bool) -> None:
    await stub.LoadModel(pb.LoadModelRequest(model="base-support"))
    assert await text(stub, "base", stream) == "ahpla ateb ahpla ateb"
    assert await text(stub, "base-support", stream) == (
        "troppus.ahpla troppus.ateb troppus.ahpla troppus.ateb"
    )


async def test_an_unknown_lora_name_is_not_found_naming_the_adapter(stub) -> None:
    await stub.LoadModel(pb.LoadModelRequest(model="base-ghost"))
    for stream in (False, True):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await text(stub, "base-ghost", stream)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "'base-ghost'" in caught.value.details()
        assert "'ghost'" in caught.value.details()
    assert await text(stub, "base", False) == "ahpla ateb ahpla ateb"  # the base is fine


async def test_a_lora_name_registered_at_run_time(stub) -> None:
    source = pb.AdapterSource(base_model="base", path="legal")
    status = (await stub.LoadModel(pb.LoadModelRequest(model="legal", adapter=source))).model
    assert status.base_model == "base" and status.state == pb.MODEL_STATE_READY
    assert await text(stub, "legal", False) == "lagel.ahpla lagel.ateb lagel.ahpla lagel.ateb"
    await stub.UnloadModel(pb.UnloadModelRequest(model="legal"))
    names = [m.name for m in (await stub.ListModels(pb.ListModelsRequest())).models]
    assert "legal" not in names


async def test_a_tensorrt_llm_base_refuses_adapters_at_load(stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.LoadModel(pb.LoadModelRequest(model="trt-support"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "lora_task_id" in caught.value.details()
