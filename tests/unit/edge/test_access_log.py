"""One access line per RPC, with the design's fields; prompt text only with log_prompts."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.config import load_settings
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, serving_fakes

FIELDS = (
    "request_id",
    "method",
    "model",
    "code",
    "peer",
    "principal",
    "prompt_tokens",
    "completion_tokens",
    "duration_ms",
)
PROMPT = "my bank password is hunter2"
LOGGERS = ("inferwire.access",)


async def run_traffic(
    caplog: pytest.LogCaptureFixture, log_prompts: bool
) -> list[logging.LogRecord]:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "metrics_address": "", "log_prompts": log_prompts},
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    for logger in LOGGERS:
        caplog.set_level(logging.INFO, logger=logger)
    async with (
        serving_fakes(settings) as (server, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        caplog.clear()
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await stub.Infer(pb.InferRequest(model="m", prompt=PROMPT, request_id="r1"))
        [m async for m in stub.InferStream(pb.InferStreamRequest(model="m", prompt=PROMPT))]
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Infer(pb.InferRequest(model="ghost", prompt=PROMPT))
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        await stub.ListModels(pb.ListModelsRequest())
        await stub.UnloadModel(pb.UnloadModelRequest(model="m"))
        await asyncio.sleep(0)
    return [r for r in caplog.records if r.name in LOGGERS and hasattr(r, "method")]


async def test_every_rpc_writes_one_access_line_with_the_design_fields(caplog):
    records = await run_traffic(caplog, log_prompts=False)
    assert Counter(r.method for r in records) == {
        "/inferwire.v1.InferenceService/Infer": 2,
        "/inferwire.v1.InferenceService/InferStream": 1,
        "/grpc.health.v1.Health/Check": 1,
        "/inferwire.v1.InferenceService/ListModels": 1,
        "/inferwire.v1.InferenceService/UnloadModel": 1,
    }
    for record in records:
        assert all(hasattr(record, field) for field in FIELDS), record.__dict__
        assert record.peer.startswith("ipv4:127.0.0.1:")
        assert record.principal == "anonymous"
    by_request = {r.request_id: r for r in records if r.request_id}
    assert (by_request["r1"].code, by_request["r1"].model) == ("OK", "m")
    assert (by_request["r1"].prompt_tokens, by_request["r1"].completion_tokens) == (3, 3)
    assert sorted(r.code for r in records if r.model == "ghost") == ["NOT_FOUND"]
    unload = next(r for r in records if r.method.endswith("UnloadModel"))
    assert (unload.model, unload.code) == ("m", "OK")
    assert PROMPT not in caplog.text
    assert not any(PROMPT in str(value) for r in records for value in r.__dict__.values())


async def test_log_prompts_puts_prompt_and_output_text_in_the_request_log(caplog):
    records = await run_traffic(caplog, log_prompts=True)
    infer = next(r for r in records if getattr(r, "request_id", "") == "r1")
    assert (infer.prompt, infer.text) == (PROMPT, "Hello, world")
    stream = next(r for r in records if r.method.endswith("InferStream"))
    assert (stream.prompt, stream.text) == (PROMPT, "Hello, world")
