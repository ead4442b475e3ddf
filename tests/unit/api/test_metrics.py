"""/metrics, scraped over HTTP after known traffic: every counter moves by exactly that."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from inferwire.config import ServerSettings, load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes

SERVICE = "inferwire.v1.InferenceService"
HEALTH = "grpc.health.v1.Health"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metered_settings(**server: object):
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            **server,
        },
        models=[
            {"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "idle", "backend": FAKE_BACKEND},
        ],
    )


@pytest.fixture(scope="module")
async def metered() -> AsyncIterator[tuple[InferwireServer, FakeBackends, grpc.aio.Channel]]:
    async with (
        serving_fakes(metered_settings()) as (server, backends),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        yield server, backends, channel


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def scrape(server: InferwireServer) -> Samples:
    assert server.metrics_port is not None
    text = await asyncio.to_thread(scrape_text, server.metrics_port)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def rpc_labels(kind: str, service: str, method: str) -> dict[str, str]:
    return {"grpc_type": kind, "grpc_service": service, "grpc_method": method}


async def test_counters_move_by_exactly_the_traffic_served(metered):
    server, _, channel = metered
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    prompts = [f"private prompt {i}" for i in range(5)]
    request_ids = [f"rid-{i}" for i in range(5)]
    before = await scrape(server)

    for prompt, request_id in zip(prompts[:3], request_ids[:3], strict=True):
        await stub.Infer(pb.InferRequest(model="m", prompt=prompt, request_id=request_id))
    streamed = 0
    for prompt, request_id in zip(prompts[3:], request_ids[3:], strict=True):
        request = pb.InferStreamRequest(model="m", prompt=prompt, request_id=request_id)
        streamed += len([m async for m in stub.InferStream(request)])
    bad = pb.GenerationParameters(top_p=2.0)
    for model, params, code in [
        ("m", bad, grpc.StatusCode.INVALID_ARGUMENT),
        ("ghost", None, grpc.StatusCode.NOT_FOUND),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Infer(pb.InferRequest(model=model, prompt="x", parameters=params))
        assert refused.value.code() == code
    for _ in range(2):
        await health.Check(health_pb2.HealthCheckRequest())
    await stub.ListModels(pb.ListModelsRequest())

    after = await scrape(server)
    infer = rpc_labels("unary", SERVICE, "Infer")
    stream = rpc_labels("server_stream", SERVICE, "InferStream")
    check = rpc_labels("unary", HEALTH, "Check")
    listing = rpc_labels("unary", SERVICE, "ListModels")
    expected = [
        ("grpc_server_started_total", infer, 5),
        ("grpc_server_started_total", stream, 2),
        ("grpc_server_started_total", check, 2),
        ("grpc_server_started_total", listing, 1),
        ("grpc_server_handled_total", {**infer, "grpc_code": "OK"}, 3),
        ("grpc_server_handled_total", {**infer, "grpc_code": "InvalidArgument"}, 1),
        ("grpc_server_handled_total", {**infer, "grpc_code": "NotFound"}, 1),
        ("grpc_server_handled_total", {**stream, "grpc_code": "OK"}, 2),
        ("grpc_server_handled_total", {**check, "grpc_code": "OK"}, 2),
        ("grpc_server_handled_total", {**listing, "grpc_code": "OK"}, 1),
        ("grpc_server_msg_received_total", infer, 5),
        ("grpc_server_msg_received_total", stream, 2),
        ("grpc_server_msg_sent_total", infer, 3),
        ("grpc_server_msg_sent_total", stream, streamed),
        ("grpc_server_msg_sent_total", check, 2),
        ("grpc_server_handling_seconds_count", infer, 5),
        ("grpc_server_handling_seconds_count", stream, 2),
        ("grpc_server_handling_seconds_count", check, 2),
        ("inferwire_requests_total", {"model": "m", "outcome": "STOP"}, 5),
        ("inferwire_requests_total", {"model": "m", "outcome": "rejected"}, 1),
        ("inferwire_prompt_tokens_total", {"model": "m"}, 5 * 3),
        ("inferwire_generated_tokens_total", {"model": "m"}, 5 * 3),
        ("inferwire_time_to_first_token_seconds_count", {"model": "m"}, 5),
        ("inferwire_time_per_output_token_seconds_count", {"model": "m"}, 5),
    ]
    moved = [(name, labels, delta(before, after, name, **labels)) for name, labels, _ in expected]
    assert moved == expected
    assert after[("inferwire_queue_depth", frozenset({"model": "m"}.items()))] == 0
    assert after[("inferwire_inflight_requests", frozenset({"model": "m"}.items()))] == 0
    labels = {value for _, pairs in after for _, value in pairs}
    assert not labels & {*prompts, *request_ids, "ghost", "x"}


async def test_inflight_gauge_counts_a_running_request(metered):
    server, backends, channel = metered
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    backends["m"].generation_gate.close()
    backends["m"].started.clear()
    try:
        call = asyncio.ensure_future(stub.Infer(pb.InferRequest(model="m", prompt="hi")))
        await backends["m"].started.wait()
        during = await scrape(server)
    finally:
        backends["m"].generation_gate.open()
    await call
    after = await scrape(server)
    key = ("inferwire_inflight_requests", frozenset({"model": "m"}.items()))
    assert (during[key], after[key]) == (1, 0)


async def test_model_ready_follows_unload_and_load(metered):
    server, _, channel = metered
    stub = inference_pb2_grpc.InferenceServiceStub(channel)

    async def ready(model: str) -> float:
        samples = await scrape(server)
        return samples[("inferwire_model_ready", frozenset({"model": model}.items()))]

    assert (await ready("m"), await ready("idle")) == (1, 0)
    await stub.UnloadModel(pb.UnloadModelRequest(model="m"))
    assert await ready("m") == 0
    await stub.LoadModel(pb.LoadModelRequest(model="m"))
    assert await ready("m") == 1


async def test_empty_metrics_address_serves_nothing_and_stop_closes_the_endpoint():
    assert ServerSettings().metrics_address == "0.0.0.0:9464"
    async with serving_fakes(metered_settings(metrics_address="")) as (server, _):
        assert server.metrics_port is None
    async with serving_fakes(metered_settings()) as (server, _):
        port = server.metrics_port
        assert port is not None
        assert "grpc_server_started_total" in await asyncio.to_thread(scrape_text, port)
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape_text, port)


def test_a_bad_metrics_address_is_a_configuration_error():
    with pytest.raises(ValueError, match="host:port"):
        ServerSettings(metrics_address="9464")


def access_lines(records) -> Counter[str]:
    return Counter(r.method for r in records if r.name == "inferwire.access")


async def test_series_exist_at_zero_before_the_first_request(metered) -> None:
    """`rate()` over the first burst after start-up needs the series before the burst."""
    server, _, _ = metered
    samples = await scrape(server)
    idle = {"model": "idle"}
    for outcome in ("STOP", "LENGTH", "rejected", "error", "cancelled", "deadline_exceeded"):
        assert (
            samples[("inferwire_requests_total", frozenset({**idle, "outcome": outcome}.items()))]
            == 0
        )
    for name in (
        "inferwire_prompt_tokens_total",
        "inferwire_generated_tokens_total",
        "inferwire_time_to_first_token_seconds_count",
        "inferwire_time_per_output_token_seconds_count",
    ):
        assert samples[(name, frozenset(idle.items()))] == 0
    tokenize = rpc_labels("unary", SERVICE, "Tokenize")
    for code in ("OK", "Canceled", "InvalidArgument", "DeadlineExceeded", "Unavailable"):
        assert (
            samples[
                ("grpc_server_handled_total", frozenset({**tokenize, "grpc_code": code}.items()))
            ]
            == 0
        )
    assert samples[("grpc_server_started_total", frozenset(tokenize.items()))] == 0
