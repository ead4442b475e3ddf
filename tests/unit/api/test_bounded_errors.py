"""Statuses never echo client input without a bound, so every client can read them.

A 100 KB model name used to come back whole in grpc-message and again in
grpc-status-details-bin: grpcio refused the trailers (RESOURCE_EXHAUSTED) and grpc-js
hung the connection. The grpc-js side is proven in tests/polyglot.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.status import to_rpc_status
from inferwire.core.errors import FieldViolation, InvalidArgumentError, ModelNotFoundError
from inferwire.edge.errors import MAX_MESSAGE_BYTES, bounded
from inferwire.v1 import inference_pb2 as pb
from tests.support.status import bad_request_fields

HUGE_NAME = "m" * 100_000

REQUESTS = {
    "LoadModel": pb.LoadModelRequest(model=HUGE_NAME),
    "UnloadModel": pb.UnloadModelRequest(model=HUGE_NAME),
    "Infer": pb.InferRequest(model=HUGE_NAME, prompt="hi"),
    "InferStream": pb.InferStreamRequest(model=HUGE_NAME, prompt="hi"),
    "Health": pb.HealthRequest(model=HUGE_NAME),
    "Tokenize": pb.TokenizeRequest(model=HUGE_NAME, prompt="hi"),
}


def trailer_bytes(error: grpc.aio.AioRpcError) -> int:
    """Size of grpc-message and grpc-status-details-bin as they travel (percent/base64)."""
    details = sum(len(v) for k, v in error.trailing_metadata() or () if k.endswith("-bin"))
    return len(error.details().encode()) * 3 + details * 4 // 3


async def call(stub: Any, rpc: str) -> Any:
    if rpc == "InferStream":
        return [m async for m in stub.InferStream(REQUESTS[rpc])]
    return await getattr(stub, rpc)(REQUESTS[rpc])


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
async def test_a_huge_model_name_is_invalid_argument_in_bounded_trailers(served, rpc):
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(stub, rpc)
    error = raised.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(error) == ["model"]
    assert "100000 characters; model names have at most 128" in error.details()
    assert "mmmmmmmm" not in error.details()
    assert trailer_bytes(error) < 2048
    # The same connection keeps working.
    assert [m.name for m in (await stub.ListModels(pb.ListModelsRequest())).models]


@pytest.mark.parametrize("name", ["has space", "-leading-dash", "semi;colon", "x" * 129])
async def test_a_malformed_model_name_is_refused_before_lookup(served, name):
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model=name, prompt="hi"))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(raised.value) == ["model"]


async def test_health_service_with_a_huge_model_name_is_not_found_in_bounded_trailers(served):
    _, _, channel = served
    health = health_pb2_grpc.HealthStub(channel)
    expected = {
        "model/" + HUGE_NAME: "unknown service: the model name is 100000 characters",
        HUGE_NAME: "… (100018 characters)",
    }
    for service, message in expected.items():
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert raised.value.code() is grpc.StatusCode.NOT_FOUND
        assert len(raised.value.details().encode()) <= MAX_MESSAGE_BYTES
        assert message in raised.value.details()
    watch = health.Watch(health_pb2.HealthCheckRequest(service="model/" + HUGE_NAME))
    first = await watch.read()
    watch.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    response = await health.Check(health_pb2.HealthCheckRequest(service="model/m"))
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_bounded_keeps_short_text_and_cuts_long_text_with_its_length():
    assert bounded("short", 16) == "short"
    cut = bounded("é" * 1000, 64)
    assert cut.endswith("… (1000 characters)")
    assert len(cut.encode()) <= 64
    assert cut.startswith("é")


def test_every_status_fits_whatever_the_error_holds():
    violations = [FieldViolation(f"parameters.stop[{i}]" * 50, "x" * 10_000) for i in range(500)]
    for error in (InvalidArgumentError(violations), ModelNotFoundError("m", "y" * 100_000)):
        status = to_rpc_status(error)
        metadata_bytes = sum(len(v) for _, v in status.trailing_metadata)
        # Worst case on the wire: every message byte percent-encoded, details in base64.
        assert len(status.details.encode()) * 3 + metadata_bytes * 4 // 3 < 5 * 1024
    details = to_rpc_status(InvalidArgumentError(violations)).details
    assert details.endswith("characters)")
