"""A model on a shared Triton keeps its own readiness while its neighbours load or fail.

Triton's ServerReady is server-wide: false while any model of its repository loads, and for
as long as any model failed to load (`--strict-readiness`, the default). A model's health in
inferwire is that Triton's ServerLive and the model's own ModelReady, so neither a sibling
loading (through inferwire) nor a broken model that someone else put on the same Triton
takes it out of service.

Each test has its own tritonserver (a failed model leaves Triton not ready for good) and its
own in-process gateway. The gateway checks its endpoints every 0.1 s and reports health every
0.1 s, so each window below spans many checks; a slower machine only lengthens the windows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.triton import (
    FAILING_INIT_MODEL,
    SKIP_REASON,
    SLOW_LOADING_MODEL,
    TRITON_DIR,
    TritonServer,
    shared_repository,
)
from tests.triton_models.echo_engine import echo_text

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
WATCHED = "echo"
SIBLING = "sibling"
SERVICES = ("", f"model/{WATCHED}")
POLL_S = 0.05
CHECK_INTERVAL_S = 0.1
# The broken neighbour's window: many endpoint checks and health reports long.
BROKEN_WINDOW_S = 30 * CHECK_INTERVAL_S
# Generous: it fails a test only when something hangs.
BOUND_S = 60.0


@dataclass
class Polls:
    """What every poll saw: inferwire's health per service, and Triton's own ServerReady."""

    health: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in SERVICES})
    triton_ready: list[bool] = field(default_factory=list)

    def not_serving(self) -> dict[str, int]:
        return {s: sum(v != SERVING for v in seen) for s, seen in self.health.items()}


@dataclass
class Rig:
    triton: TritonServer
    stub: inference_pb2_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub
    triton_stub: service_pb2_grpc.GRPCInferenceServiceStub

    async def triton_ready(self) -> bool:
        return (await self.triton_stub.ServerReady(service_pb2.ServerReadyRequest())).ready

    async def poll(self, polls: Polls, stop: asyncio.Event) -> None:
        """Poll every POLL_S until `stop` is set; each service and Triton once a poll."""
        while not stop.is_set():
            for service in SERVICES:
                response = await self.health.Check(health_pb2.HealthCheckRequest(service=service))
                polls.health[service].append(response.status)
            polls.triton_ready.append(await self.triton_ready())
            await asyncio.sleep(POLL_S)

    async def assert_watched_answers(self) -> None:
        request = pb.InferRequest(
            model=WATCHED, prompt="a b", parameters=pb.GenerationParameters(max_tokens=3)
        )
        assert (await self.stub.Infer(request, timeout=BOUND_S)).text == echo_text("a b", 3)


@pytest.fixture
async def rig(triton_dir: Path, record_dir: Path, tmp_path: Path) -> AsyncIterator[Rig]:
    (tmp_path / "repository").mkdir()
    triton = TritonServer(
        record_dir,
        repository=shared_repository(tmp_path / "repository"),
        load_models=("vllm_echo",),
    )
    triton.start()

    def model(name: str, triton_model: str, on_startup: bool) -> dict:
        options = {"url": triton.url, "triton_model": triton_model}
        return {
            "name": name,
            "backend": "triton",
            "load_on_startup": on_startup,
            "options": {**options, "health_interval_s": CHECK_INTERVAL_S},
        }

    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "grace_period_s": 1,
            "health_check_interval_s": CHECK_INTERVAL_S,
        },
        models=[
            model(WATCHED, "vllm_echo", on_startup=True),
            model(SIBLING, SLOW_LOADING_MODEL, on_startup=False),
        ],
    )
    gateway = InferwireServer(settings)
    try:
        await gateway.start()
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
            grpc.aio.insecure_channel(triton.url) as triton_channel,
        ):
            rig = Rig(
                triton,
                inference_pb2_grpc.InferenceServiceStub(channel),
                health_pb2_grpc.HealthStub(channel),
                service_pb2_grpc.GRPCInferenceServiceStub(triton_channel),
            )
            for service in SERVICES:
                check = health_pb2.HealthCheckRequest(service=service)
                assert (await rig.health.Check(check)).status == SERVING
            yield rig
    finally:
        await gateway.stop(grace_s=1)
        triton.kill()


async def test_a_model_stays_serving_through_six_loads_and_unloads_of_a_sibling(rig):
    polls, stop = Polls(), asyncio.Event()
    poller = asyncio.create_task(rig.poll(polls, stop))
    try:
        for _ in range(6):
            loaded = await rig.stub.LoadModel(pb.LoadModelRequest(model=SIBLING), timeout=BOUND_S)
            assert loaded.model.state == pb.MODEL_STATE_READY, loaded.model.detail
            await rig.stub.UnloadModel(pb.UnloadModelRequest(model=SIBLING), timeout=BOUND_S)
            await rig.assert_watched_answers()
    finally:
        stop.set()
        await poller
    # Each load held Triton not ready for SLOW_LOAD_S at least, so polls saw it.
    assert polls.triton_ready.count(False) >= 6, polls.triton_ready
    assert polls.not_serving() == {service: 0 for service in SERVICES}, polls


async def test_a_model_stays_serving_beside_a_model_that_failed_to_load_on_its_triton(rig):
    # Loaded straight into Triton, as another team's broken model would be.
    with pytest.raises(grpc.aio.AioRpcError, match="failing in initialize"):
        await rig.triton_stub.RepositoryModelLoad(
            service_pb2.RepositoryModelLoadRequest(model_name=FAILING_INIT_MODEL)
        )
    assert not await rig.triton_ready()  # Triton's own readiness now stays false

    polls, stop = Polls(), asyncio.Event()
    poller = asyncio.create_task(rig.poll(polls, stop))
    started = time.monotonic()
    try:
        while time.monotonic() - started < BROKEN_WINDOW_S:
            await rig.assert_watched_answers()
            await asyncio.sleep(POLL_S)
    finally:
        stop.set()
        await poller
    assert not any(polls.triton_ready), "Triton's ServerReady turned true: nothing was tested"
    assert polls.not_serving() == {service: 0 for service in SERVICES}, polls
