"""min_tokens and ignore_eos: conversion, the core's checks and how max_tokens resolves,
through the model manager and the real server over fake backends."""

from __future__ import annotations

import grpc
import pytest

from inferwire.api.converters import request_from_proto
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.manager import ModelSpec
from inferwire.core.requests import GenerationRequest, InferenceRequest
from inferwire.core.sampling import GenerationParams
from inferwire.core.validation import RequestLimits, validate_inference_request
from inferwire.v1 import inference_pb2 as pb
from tests.support.fake_backend import FAKE_BACKEND
from tests.support.status import bad_request_fields
from tests.unit.core.test_model_manager import Harness, request, running, spec


def test_request_conversion_carries_min_tokens_and_ignore_eos():
    parameters = pb.GenerationParameters(min_tokens=3, ignore_eos=True)
    converted = request_from_proto(pb.InferRequest(model="m", prompt="hi", parameters=parameters))
    assert (converted.params.min_tokens, converted.params.ignore_eos) == (3, True)
    # Set to 0 is kept as set (no minimum); unset is None.
    zero = pb.GenerationParameters(min_tokens=0)
    converted = request_from_proto(pb.InferStreamRequest(model="m", prompt="hi", parameters=zero))
    assert converted.params.min_tokens == 0
    unset = request_from_proto(pb.InferRequest(model="m", prompt="hi"))
    assert (unset.params.min_tokens, unset.params.ignore_eos) == (None, False)


def violations(**params: object) -> list[tuple[str, str]]:
    inference = InferenceRequest("", "m", "hi", params=GenerationParams(**params))  # type: ignore[arg-type]
    try:
        validate_inference_request(inference, RequestLimits(max_prompt_bytes=1024))
    except InvalidArgumentError as error:
        return [(v.field, v.description) for v in error.violations]
    return []


def test_min_tokens_must_not_exceed_max_tokens_when_both_are_set():
    assert violations(max_tokens=4, min_tokens=5) == [
        ("parameters.min_tokens", "is 5; it must not exceed parameters.max_tokens (4)")
    ]
    assert violations(max_tokens=4, min_tokens=4) == []
    assert violations(min_tokens=5) == []  # max_tokens unset: it resolves to at least 5
    # An invalid max_tokens is the one field to fix.
    assert [field for field, _ in violations(max_tokens=0, min_tokens=5)] == [
        "parameters.max_tokens"
    ]


def test_a_negative_min_tokens_is_refused():
    # The proto's field is unsigned; other transports (KServe's JSON) are checked too.
    assert violations(min_tokens=-1) == [
        ("parameters.min_tokens", "must be >= 0 (0 means no minimum), got -1")
    ]


def test_the_backend_gets_the_resolved_minimum():
    def generation(max_tokens: int, **params: object) -> GenerationRequest:
        return GenerationRequest("r", "hi", max_tokens, GenerationParams(**params))  # type: ignore[arg-type]

    assert generation(16).min_tokens == 0
    assert generation(16, min_tokens=5).min_tokens == 5
    assert generation(16, ignore_eos=True).min_tokens == 16
    assert generation(16, min_tokens=5, ignore_eos=True).min_tokens == 16
    assert generation(4, min_tokens=9).min_tokens == 4


async def test_min_tokens_above_the_models_output_limit_names_the_field():
    async with running(Harness(spec("m", startup=True))) as harness:  # the fake allows 32
        with pytest.raises(InvalidArgumentError) as raised:
            await harness.manager.infer(request(min_tokens=33))
    assert [(v.field, v.description) for v in raised.value.violations] == [
        ("parameters.min_tokens", "is 33; model 'm' generates at most 32 tokens")
    ]


async def test_an_unset_max_tokens_resolves_to_at_least_min_tokens():
    model = ModelSpec(
        name="m",
        backend=FAKE_BACKEND,
        load_on_startup=True,
        options={"default_max_tokens": 8},
    )
    async with running(Harness(model)) as harness:
        backend = harness.backends["m"]
        for params in (
            {},
            {"min_tokens": 5},
            {"min_tokens": 20},
            {"min_tokens": 20, "max_tokens": 24},
        ):
            await harness.manager.infer(request(**params))
    resolved = [(r.max_tokens, r.min_tokens) for r in backend.calls.requests]
    assert resolved == [(8, 0), (8, 5), (20, 20), (24, 20)]


async def test_ignore_eos_reaches_the_backend(served):
    stub, backends, _ = served
    before = len(backends["m"].calls.requests)
    parameters = pb.GenerationParameters(max_tokens=3, ignore_eos=True)
    await stub.Infer(pb.InferRequest(model="m", prompt="hi", parameters=parameters))
    (sent,) = backends["m"].calls.requests[before:]
    assert (sent.params.ignore_eos, sent.max_tokens, sent.min_tokens) == (True, 3, 3)


@pytest.mark.parametrize("rpc", ["Infer", "InferStream"])
async def test_min_tokens_over_max_tokens_is_invalid_argument_on_the_wire(served, rpc):
    stub, _, _ = served
    parameters = pb.GenerationParameters(max_tokens=2, min_tokens=3)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        if rpc == "Infer":
            await stub.Infer(pb.InferRequest(model="m", prompt="hi", parameters=parameters))
        else:
            call = stub.InferStream(
                pb.InferStreamRequest(model="m", prompt="hi", parameters=parameters)
            )
            [m async for m in call]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(raised.value) == ["parameters.min_tokens"]
