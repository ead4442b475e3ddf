"""Adapter models on the real engine: the bundled `demo` (adapter-ready) with its bundled
Sonnets adapter, and a second adapter made here from it at half the scale.

Concurrent streams over the base and both adapters equal their solo runs; an adapter
unloaded mid-stream lets its streams finish while the base serves on; a corrupt file and
an adapter for another graph fail to register, leaving nothing behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

SONNETS = builtin_model_path() / "sonnets.onnx_adapter"
PROMPT = "Shall I compare thee to a summer's day?\n"


def scaled_adapter(path: Path, scale: float) -> None:
    """The bundled adapter with every lora_B times `scale` (another adapter, same graph)."""
    parameters = ort.AdapterFormat.read_adapter(str(SONNETS)).get_parameters()
    arrays = {name: value.numpy() for name, value in parameters.items()}
    arrays = {
        n: (a * scale if ".lora_B." in n else a).astype(np.float32) for n, a in arrays.items()
    }
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    values = {n: ort.OrtValue.ortvalue_from_numpy(a.astype(np.float32)) for n, a in arrays.items()}
    adapter.set_parameters(values)
    adapter.export_adapter(str(path))


@pytest.fixture(scope="module")
async def stub(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[inference_pb2_grpc.InferenceServiceStub, Path]]:
    allowed = tmp_path_factory.mktemp("adapters")
    half = allowed / "half.onnx_adapter"
    scaled_adapter(half, 0.5)
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "adapters": {"allowed_dirs": [str(allowed)]},
        },
        models=[
            {"name": "demo", "load_on_startup": True, "options": {"path": "builtin"}},
            {
                "name": "demo-sonnets",
                "adapter_of": "demo",
                "load_on_startup": True,
                "options": {"adapter_file": str(SONNETS)},
            },
            {"name": "demo-half", "adapter_of": "demo", "options": {"adapter_file": str(half)}},
        ],
    )
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel), allowed
    finally:
        await server.stop(grace_s=1)


def stream_request(model: str) -> pb.InferStreamRequest:
    return pb.InferStreamRequest(
        model=model,
        prompt=PROMPT,
        parameters=pb.GenerationParameters(max_tokens=24, temperature=0.0),
    )


async def streamed(stub: inference_pb2_grpc.InferenceServiceStub, model: str) -> str:
    return "".join([m.text async for m in stub.InferStream(stream_request(model))])


async def test_concurrent_streams_over_the_base_and_two_adapters_equal_their_solo_runs(stub):
    stub, _ = stub
    await stub.LoadModel(pb.LoadModelRequest(model="demo-half"))
    models = ["demo", "demo-sonnets", "demo-half"]
    solo = {model: await streamed(stub, model) for model in models}
    assert solo["demo-sonnets"] != solo["demo"]
    mixed = [models[i % 3] for i in range(8)]
    together = await asyncio.gather(*(streamed(stub, m) for m in mixed))
    assert together == [solo[m] for m in mixed]


async def test_an_adapter_unloaded_mid_stream_lets_its_streams_finish(stub):
    stub, _ = stub
    await stub.LoadModel(pb.LoadModelRequest(model="demo-half"))
    solo = await streamed(stub, "demo-half")
    base = await streamed(stub, "demo")
    calls = [stub.InferStream(stream_request("demo-half")) for _ in range(3)]
    firsts = [(await call.read()).text for call in calls]  # each is running
    unload = asyncio.ensure_future(stub.UnloadModel(pb.UnloadModelRequest(model="demo-half")))
    assert await streamed(stub, "demo") == base
    for first, call in zip(firsts, calls, strict=True):
        text = [first]
        while (message := await call.read()) is not grpc.aio.EOF:
            text.append(message.text)
        assert "".join(text) == solo
    assert (await unload).model.state == pb.MODEL_STATE_UNLOADED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await streamed(stub, "demo-half")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await streamed(stub, "demo") == base


async def test_files_that_are_no_adapter_of_the_base_do_not_register(stub):
    stub, allowed = stub
    corrupt = allowed / "corrupt.onnx_adapter"
    corrupt.write_bytes(b"\x00\x01 not flatbuffers at all" * 10)
    other_graph = allowed / "other.onnx_adapter"  # the right names, another model's shapes
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    lora_a = np.zeros((100, 8), np.float32)
    name = "model.layers.0.attn.qkv_proj.lora_A.weight"
    adapter.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(lora_a)})
    adapter.export_adapter(str(other_graph))
    cases = {"corrupt": corrupt, "other-graph": other_graph}
    for name, path in cases.items():
        source = pb.AdapterSource(base_model="demo", path=str(path))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.LoadModel(pb.LoadModelRequest(model=name, adapter=source))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
        names = [m.name for m in (await stub.ListModels(pb.ListModelsRequest())).models]
        assert name not in names
    assert await streamed(stub, "demo")  # the server keeps serving
