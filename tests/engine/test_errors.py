"""Every bad input gets the design's status code, names the field, and harms nothing."""

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.v1 import inference_pb2 as pb
from tests.support.engine import MAX_PROMPT_BYTES, serving
from tests.support.status import bad_request_fields


def params(**fields) -> pb.GenerationParameters:
    return pb.GenerationParameters(**fields)


BAD_INPUTS = {
    "empty-model": ({"model": "", "prompt": "Hi"}, "model"),
    "missing-model": ({"prompt": "Hi"}, "model"),
    "empty-prompt": ({"model": "demo", "prompt": ""}, "prompt"),
    "prompt-over-byte-limit": ({"model": "demo", "prompt": "x" * (MAX_PROMPT_BYTES + 1)}, "prompt"),
    "prompt-over-context-window": ({"model": "demo", "prompt": "~" * 3000}, "prompt"),
    "max-tokens-zero": (
        {"model": "demo", "prompt": "Hi", "parameters": params(max_tokens=0)},
        "parameters.max_tokens",
    ),
    "max-tokens-negative": (
        {"model": "demo", "prompt": "Hi", "parameters": params(max_tokens=-3)},
        "parameters.max_tokens",
    ),
    "max-tokens-above-limit": (
        {"model": "demo", "prompt": "Hi", "parameters": params(max_tokens=5000)},
        "parameters.max_tokens",
    ),
    "temperature-negative": (
        {"model": "demo", "prompt": "Hi", "parameters": params(temperature=-0.5)},
        "parameters.temperature",
    ),
    "temperature-nan": (
        {"model": "demo", "prompt": "Hi", "parameters": params(temperature=float("nan"))},
        "parameters.temperature",
    ),
    "temperature-infinite": (
        {"model": "demo", "prompt": "Hi", "parameters": params(temperature=float("inf"))},
        "parameters.temperature",
    ),
    "top-p-zero": (
        {"model": "demo", "prompt": "Hi", "parameters": params(top_p=0.0)},
        "parameters.top_p",
    ),
    "top-p-above-one": (
        {"model": "demo", "prompt": "Hi", "parameters": params(top_p=1.5)},
        "parameters.top_p",
    ),
    "too-many-stop-strings": (
        {"model": "demo", "prompt": "Hi", "parameters": params(stop=[f"s{i}" for i in range(17)])},
        "parameters.stop",
    ),
    "empty-stop-string": (
        {"model": "demo", "prompt": "Hi", "parameters": params(stop=["ok", ""])},
        "parameters.stop[1]",
    ),
    "too-many-context-entries": (
        {"model": "demo", "prompt": "Hi", "context": ["passage"] * 65},
        "context",
    ),
}


@pytest.mark.parametrize("rpc", ["Infer", "InferStream"])
@pytest.mark.parametrize(("fields", "field_name"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
async def test_bad_input_is_invalid_argument_naming_the_field(stub, rpc, fields, field_name):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        if rpc == "Infer":
            await stub.Infer(pb.InferRequest(**fields))
        else:
            async for _ in stub.InferStream(pb.InferStreamRequest(**fields)):
                pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_name in bad_request_fields(error.value)
    assert field_name.split("[")[0] in error.value.details()


async def test_several_bad_fields_are_all_reported(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(
            pb.InferRequest(model="demo", prompt="", parameters=params(top_p=2.0, max_tokens=0))
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(bad_request_fields(error.value)) == {
        "prompt",
        "parameters.top_p",
        "parameters.max_tokens",
    }


async def test_message_over_receive_limit_is_resource_exhausted(stub):
    # The test server's receive limit is 64 KiB; this request is bigger.
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="demo", prompt="y" * (80 * 1024)))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_server_keeps_serving_after_bad_inputs(stub):
    for fields, _ in BAD_INPUTS.values():
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Infer(pb.InferRequest(**fields))
    response = await stub.Infer(
        pb.InferRequest(model="demo", prompt="Still there?", parameters=params(max_tokens=3))
    )
    assert response.usage.completion_tokens == 3


async def test_a_seed_beyond_the_engines_range_names_the_field():
    """og.Generator takes a signed 32-bit seed: a larger one is refused, not folded (the
    continuous path, the CPU default, takes every uint32 seed)."""
    settings = load_settings(
        server={"address": "127.0.0.1:0", "metrics_address": "", "http_address": ""},
        models=[
            {
                "name": "og",
                "load_on_startup": True,
                "options": {"path": "builtin", "batching": "per_request"},
            }
        ],
    )
    async with serving(settings) as og_stub:
        for rpc in ("Infer", "InferStream"):
            fields = {"model": "og", "prompt": "Hi", "parameters": params(seed=2**31)}
            with pytest.raises(grpc.aio.AioRpcError) as error:
                if rpc == "Infer":
                    await og_stub.Infer(pb.InferRequest(**fields))
                else:
                    async for _ in og_stub.InferStream(pb.InferStreamRequest(**fields)):
                        pass
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "parameters.seed" in bad_request_fields(error.value)
        # A sampling parameter its backend does not take is refused, naming it; a
        # penalty of 0 changes nothing, so it is taken.
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await og_stub.Infer(
                pb.InferRequest(model="og", prompt="Hi", parameters=params(logit_bias={5: 1.0}))
            )
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(error.value) == ["parameters.logit_bias"]
        neutral = params(seed=2**31 - 1, presence_penalty=0.0)
        answer = await og_stub.Infer(pb.InferRequest(model="og", prompt="Hi", parameters=neutral))
        assert answer.usage.completion_tokens > 0


async def test_admin_rpcs_validate_the_model_name(stub):
    for call in (stub.LoadModel(pb.LoadModelRequest()), stub.UnloadModel(pb.UnloadModelRequest())):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(error.value) == ["model"]
