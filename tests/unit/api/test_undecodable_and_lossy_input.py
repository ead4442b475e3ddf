"""Input is never lost silently, and a payload that is not protobuf gets a deliberate code."""

from __future__ import annotations

import grpc
import pytest

from inferwire.api.health import SERVICE_NAME
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.facts import ModelLimits
from inferwire.core.generation import check_prompt_fits
from inferwire.core.requests import GenerationRequest
from inferwire.v1 import inference_pb2 as pb
from tests.support.status import bad_request_fields

# A length-delimited field 1 whose length runs past the end: no message parses it.
NOT_PROTOBUF = b"\x0a\xff\xff\xff\x0f"
METHODS = [
    f"/{SERVICE_NAME}/{m.name}" for m in pb.DESCRIPTOR.services_by_name["InferenceService"].methods
]
STREAMING = {f"/{SERVICE_NAME}/InferStream", "/grpc.health.v1.Health/Watch"}


@pytest.mark.parametrize(
    "method", [*METHODS, "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"]
)
async def test_a_payload_that_is_not_protobuf_is_invalid_argument_on_every_method(served, method):
    stub, _, channel = served
    if method in STREAMING:
        call = channel.unary_stream(method)(NOT_PROTOBUF)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
    else:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await channel.unary_unary(method)(NOT_PROTOBUF)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be decoded" in raised.value.details()
    assert (await stub.ListModels(pb.ListModelsRequest())).models


async def test_reflection_answers_an_undecodable_message_with_invalid_argument(served):
    _, _, channel = served
    method = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
    call = channel.stream_stream(method)()
    await call.write(NOT_PROTOBUF)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("fields", "violation"),
    [
        ({"prompt": "ROMEO:\x00 the rest"}, "prompt"),
        ({"prompt": "hi", "context": ["fine", "cut\x00here"]}, "context[1]"),
        (
            {"prompt": "hi", "parameters": pb.GenerationParameters(stop=["a", "\x00"])},
            "parameters.stop[1]",
        ),
    ],
)
async def test_text_holding_a_nul_is_refused_naming_the_field(served, fields, violation):
    stub, backends, _ = served
    before = len(backends["m"].calls.requests)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model="m", **fields))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(raised.value) == [violation]
    assert len(backends["m"].calls.requests) == before


def test_a_prompt_of_no_tokens_is_refused_before_the_engine_runs():
    request = GenerationRequest(request_id="r", prompt="", max_tokens=4)
    with pytest.raises(InvalidArgumentError, match="prompt: tokenizes to no tokens"):
        check_prompt_fits(request, 0, "m", ModelLimits(context_length=64, max_output_tokens=8))
