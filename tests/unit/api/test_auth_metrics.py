"""Calls that auth refuses are counted in /metrics like any other: started, handled with
their code, timed; the core never saw them, so no inference series moves."""

from __future__ import annotations

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.auth import bearer, start_server, tokens_yaml
from tests.unit.api.test_metrics import SERVICE, delta, rpc_labels, scrape

READER = "tok-reader-0123456789"


async def refused(call, code: grpc.StatusCode) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code


async def test_calls_refused_by_auth_are_counted_with_their_code(tmp_path):
    tokens_file = tmp_path / "tokens.yaml"
    tokens_file.write_text(tokens_yaml({"reader": (READER, ["infer"], None)}))
    server = await start_server(tokens_file)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            before = await scrape(server)
            unauthenticated = grpc.StatusCode.UNAUTHENTICATED
            for token in (None, "tok-nobody-0123456789"):
                request = pb.InferRequest(model="m", prompt="hi")
                await refused(stub.Infer(request, metadata=bearer(token)), unauthenticated)
            stream = stub.InferStream(pb.InferStreamRequest(model="m", prompt="hi"))
            await refused(stream.read(), unauthenticated)
            load = stub.LoadModel(pb.LoadModelRequest(model="idle"), metadata=bearer(READER))
            await refused(load, grpc.StatusCode.PERMISSION_DENIED)
            await stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=bearer(READER))
            after = await scrape(server)
    finally:
        await server.stop(grace_s=0)

    infer = rpc_labels("unary", SERVICE, "Infer")
    streamed = rpc_labels("server_stream", SERVICE, "InferStream")
    loading = rpc_labels("unary", SERVICE, "LoadModel")
    expected = [
        ("grpc_server_started_total", infer, 3),
        ("grpc_server_started_total", streamed, 1),
        ("grpc_server_started_total", loading, 1),
        ("grpc_server_handled_total", {**infer, "grpc_code": "Unauthenticated"}, 2),
        ("grpc_server_handled_total", {**infer, "grpc_code": "OK"}, 1),
        ("grpc_server_handled_total", {**streamed, "grpc_code": "Unauthenticated"}, 1),
        ("grpc_server_handled_total", {**loading, "grpc_code": "PermissionDenied"}, 1),
        ("grpc_server_handling_seconds_count", infer, 3),
        ("grpc_server_handling_seconds_count", streamed, 1),
        ("grpc_server_handling_seconds_count", loading, 1),
        ("grpc_server_msg_sent_total", infer, 1),
        ("grpc_server_msg_sent_total", streamed, 0),
        # Only the one accepted request reached the core.
        ("inferwire_requests_total", {"model": "m", "outcome": "STOP"}, 1),
        ("inferwire_requests_total", {"model": "m", "outcome": "rejected"}, 0),
    ]
    moved = [(name, labels, delta(before, after, name, **labels)) for name, labels, _ in expected]
    assert moved == expected
