"""Backend faults against a real Triton: killed, hung (SIGSTOP), and errors in a stream.

Each test has its own tritonserver and its own in-process gateway in front of it, so
the session's shared servers never see these faults. Timings are logged (run with
`-o log_cli=true --log-cli-level=INFO` to see them), not asserted: the machine is
shared, and only a wait that would otherwise hang is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer, health_status
from tests.support.waiting import read_rest
from tests.triton_models.echo_engine import echo_text

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE = "model/echo"
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 0.5
# Generous bounds: they fail a test only when something hangs.
BOUND_S = 30.0
LONG_PROMPT = " ".join(f"w{i}" for i in range(400))


@dataclass
class Rig:
    """A dedicated Triton and a gateway serving its vllm_echo as `echo`."""

    triton: TritonServer
    stub: inference_pb2_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub

    def signal(self, signum: int) -> None:
        """Signal the server and its Python backend stubs (its process group)."""
        self.triton.signal(signum)

    async def status(self) -> int:
        return await health_status(self.health, SERVICE)

    async def until_status(self, wanted: int, since: float) -> float:
        """Seconds from `since` until the model's grpc.health.v1 status is `wanted`."""
        while await self.status() != wanted:
            assert time.monotonic() - since < BOUND_S, f"health never turned {wanted}"
            await asyncio.sleep(0.02)
        return time.monotonic() - since

    async def until_infer_succeeds(self, since: float) -> float:
        """Seconds from `since` until a request succeeds (earlier ones may fail)."""
        request = pb.InferRequest(
            model="echo", prompt="a b", parameters=pb.GenerationParameters(max_tokens=3)
        )
        while True:
            try:
                reply = await self.stub.Infer(request, timeout=5)
            except grpc.aio.AioRpcError as exc:
                assert time.monotonic() - since < BOUND_S, f"requests kept failing: {exc}"
                await asyncio.sleep(0.05)
                continue
            assert reply.text == echo_text("a b", 3)
            return time.monotonic() - since

    async def assert_streams_work(self) -> None:
        call = long_stream(self)
        assert (await call.read()).text
        call.cancel()


@pytest.fixture
async def rig(triton_dir: Path, record_dir: Path) -> AsyncIterator[Rig]:
    # 20 ms a token: a 1200-token stream runs far longer than any test here.
    triton = TritonServer(
        record_dir,
        load_models=("vllm_echo",),
        extra_env={"INFERWIRE_TRITON_TOKEN_DELAY_S": "0.02"},
    )
    triton.start()
    model = {
        "name": "echo",
        "backend": "triton",
        "load_on_startup": True,
        "max_concurrency": 32,
        "options": {
            "url": triton.url,
            "triton_model": "vllm_echo",
            "health_timeout_s": HEALTH_TIMEOUT_S,
        },
    }
    server = {
        "address": "127.0.0.1:0",
        "grace_period_s": 1,
        "health_check_interval_s": HEALTH_INTERVAL_S,
    }
    gateway = InferwireServer(load_settings(server=server, models=[model]))
    try:
        await gateway.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            rig = Rig(
                triton,
                inference_pb2_grpc.InferenceServiceStub(channel),
                health_pb2_grpc.HealthStub(channel),
            )
            await rig.until_status(SERVING, time.monotonic())
            yield rig
    finally:
        if triton.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(triton.process.pid, signal.SIGCONT)
        await gateway.stop(grace_s=1)
        triton.kill()


def long_stream(rig: Rig) -> grpc.aio.UnaryStreamCall:
    return rig.stub.InferStream(
        pb.InferStreamRequest(
            model="echo",
            prompt=LONG_PROMPT,
            parameters=pb.GenerationParameters(max_tokens=1200),
        )
    )


async def final_code(call: grpc.aio.UnaryStreamCall) -> grpc.StatusCode:
    try:
        await read_rest(call)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_sigkill_fails_every_open_stream_and_a_restarted_triton_serves_again(rig):
    calls = [long_stream(rig) for _ in range(16)]
    for call in calls:
        assert (await call.read()).text
    rig.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    codes = await asyncio.wait_for(asyncio.gather(*(final_code(c) for c in calls)), BOUND_S)
    failed_s = time.monotonic() - killed_at
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 16
    down_s = await rig.until_status(NOT_SERVING, killed_at)

    rig.triton.kill()  # reap it; the restart reuses its port
    rig.triton.start()
    ready_at = time.monotonic()
    first_ok_s = await rig.until_infer_succeeds(ready_at)
    serving_s = await rig.until_status(SERVING, ready_at)
    log.info(
        "SIGKILL: 16 streams UNAVAILABLE %.3f s after the kill, health NOT_SERVING after "
        "%.2f s; restarted Triton ready -> first OK request %.2f s, SERVING %.2f s",
        failed_s,
        down_s,
        first_ok_s,
        serving_s,
    )
    await rig.assert_streams_work()  # through the same gateway


async def deadline_code(rig: Rig, streamed: bool, deadline_s: float) -> tuple[str, float]:
    """The code of one request with a deadline, and how long past the deadline it ended."""
    started = time.monotonic()
    try:
        if streamed:
            request = pb.InferStreamRequest(model="echo", prompt="a b")
            await read_rest(rig.stub.InferStream(request, timeout=deadline_s))
        else:
            await rig.stub.Infer(pb.InferRequest(model="echo", prompt="a b"), timeout=deadline_s)
        code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    return code.name, time.monotonic() - started - deadline_s


async def test_sigstop_ends_requests_at_their_deadline_and_health_follows_the_hang(rig):
    rig.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    deadline_s = 1.0
    results = await asyncio.wait_for(
        asyncio.gather(*(deadline_code(rig, i % 2 == 1, deadline_s) for i in range(8))),
        BOUND_S,
    )
    assert [code for code, _ in results] == ["DEADLINE_EXCEEDED"] * 8
    down_s = await rig.until_status(NOT_SERVING, stopped_at)

    rig.signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    serving_s = await rig.until_status(SERVING, resumed_at)
    first_ok_s = await rig.until_infer_succeeds(resumed_at)
    overshoots = sorted(over for _, over in results)
    log.info(
        "SIGSTOP: 8 requests with a %.1f s deadline ended DEADLINE_EXCEEDED, overshoot "
        "min %.3f s max %.3f s; NOT_SERVING %.2f s after the stop (health every %.1f s, "
        "timeout %.1f s); after SIGCONT SERVING in %.2f s, first OK request in %.2f s",
        deadline_s,
        overshoots[0],
        overshoots[-1],
        down_s,
        HEALTH_INTERVAL_S,
        HEALTH_TIMEOUT_S,
        serving_s,
        first_ok_s,
    )
    await rig.assert_streams_work()


# A `fail:<CODE>` prompt makes the test model answer with that Triton error code
# (tests/triton_models/README.md); these are the codes a client must be able to tell apart.
STREAM_ERRORS = [
    ("NOT_FOUND", grpc.StatusCode.NOT_FOUND),
    ("INVALID_ARG", grpc.StatusCode.INVALID_ARGUMENT),
    ("UNAVAILABLE", grpc.StatusCode.UNAVAILABLE),
    ("CANCELLED", grpc.StatusCode.CANCELLED),
    ("INTERNAL", grpc.StatusCode.INTERNAL),
    # Triton's UNSUPPORTED, sent as gRPC UNIMPLEMENTED: the request cannot succeed as sent.
    ("UNSUPPORTED", grpc.StatusCode.FAILED_PRECONDITION),
]


async def test_errors_triton_reports_in_a_stream_keep_their_class(rig):
    for triton_code, expected in STREAM_ERRORS:
        prompt = f"fail:{triton_code} a b"
        for streamed in (True, False):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                if streamed:
                    request = pb.InferStreamRequest(model="echo", prompt=prompt)
                    await read_rest(rig.stub.InferStream(request))
                else:
                    await rig.stub.Infer(pb.InferRequest(model="echo", prompt=prompt))
            assert raised.value.code() == expected, (triton_code, streamed)
            if expected is not grpc.StatusCode.INTERNAL:
                # INTERNAL keeps its details in the server log only.
                assert f"failing on request with {triton_code}" in raised.value.details()
    # Triton reports an unknown model inside the stream, header or not.
    async with grpc.aio.insecure_channel(rig.triton.url) as channel:
        triton = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        await triton.RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(model_name="vllm_echo")
        )
    while rig.triton.model_ready("vllm_echo"):
        await asyncio.sleep(0.05)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await read_rest(rig.stub.InferStream(pb.InferStreamRequest(model="echo", prompt="a b")))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "vllm_echo" in raised.value.details()
