"""DNS discovery against real components: a DNS server on a loopback port (dnslib) and
three `tritonserver` processes on 127.0.0.2, .3 and .4, one port for all three.

The zone is rewritten while a gateway serves `scaled` from `triton.test:<port>`, resolved
every 0.5 s. Timings are logged (`-o log_cli=true --log-cli-level=INFO`), not asserted;
bounds only fail a test that would otherwise hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.dns import DnsServer
from tests.support.triton import (
    SKIP_REASON,
    TRITON_DIR,
    TritonServer,
    all_running,
    free_port,
    health_status,
)
from tests.support.waiting import read_rest
from tests.triton_models.echo_engine import echo_text

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

NAME = "triton.test"
MODEL = "vllm_echo"
SERVICE = "model/scaled"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
BOUND_S = 30.0
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture(scope="module")
def tritons(triton_dir: Path, record_dir: Path) -> Iterator[list[TritonServer]]:
    port = free_port(ADDRESSES[0])
    servers = [
        TritonServer(
            record_dir,
            address=address,
            port=port,
            extra_env={"INFERWIRE_TRITON_TOKEN_DELAY_S": "0.01"},
        )
        for address in ADDRESSES
    ]
    with all_running(servers):
        yield servers


@pytest.fixture(scope="module")
def dns_server() -> Iterator[DnsServer]:
    server = DnsServer()
    server.start()
    yield server
    server.stop()


@dataclass
class Rig:
    tritons: list[TritonServer]
    zone_server: DnsServer
    stub: inference_pb2_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub

    def zone(self, *servers: TritonServer) -> None:
        self.zone_server.zone.set(NAME, [server.address for server in servers])

    async def until_status(self, wanted: int) -> None:
        since = time.monotonic()
        while await health_status(self.health, SERVICE) != wanted:
            assert time.monotonic() - since < BOUND_S, f"health never turned {wanted}"
            await asyncio.sleep(0.05)

    async def detail(self) -> str:
        reply = await self.stub.Health(pb.HealthRequest(model="scaled"))
        return reply.models[0].detail

    async def until_rotation(self, *servers: TritonServer) -> None:
        """Until the endpoints in rotation are exactly `servers`."""
        wanted = sorted(server.url for server in servers)
        since = time.monotonic()
        while True:
            detail = await self.detail()
            listed = detail.partition("endpoints from DNS: ")[2].split(";")[0]
            if sorted(listed.split(", ")) == wanted and "joining" not in detail:
                return
            assert time.monotonic() - since < BOUND_S, f"rotation never became {wanted}: {detail}"
            await asyncio.sleep(0.05)

    async def infer(self, prompt: str = "a b") -> None:
        request = pb.InferRequest(
            model="scaled", prompt=prompt, parameters=pb.GenerationParameters(max_tokens=2)
        )
        reply = await self.stub.Infer(request, timeout=BOUND_S)
        assert reply.text == echo_text(prompt, 2)

    async def infer_many(self, count: int) -> None:
        """`count` requests, 16 at a time (within the model's queue)."""
        slots = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with slots:
                await self.infer(f"p{i} q")

        await asyncio.gather(*(one(i) for i in range(count)))


def executed(server: TritonServer) -> int:
    """Requests Triton executed for the model; 0 while the model is not loaded there."""
    return server.statistics(MODEL) if server.model_ready(MODEL) else 0


@contextlib.asynccontextmanager
async def serving(
    tritons: list[TritonServer], dns_server: DnsServer, *initial: TritonServer
) -> AsyncIterator[Rig]:
    """A gateway serving `scaled` from the zone, which starts as `initial`."""
    dns_server.zone.set(NAME, [server.address for server in initial])
    model = {
        "name": "scaled",
        "backend": "triton",
        "load_on_startup": True,
        "max_concurrency": 32,
        "options": {
            "discovery": "dns",
            "urls": [f"{NAME}:{tritons[0].port}"],
            "dns_server": dns_server.address,
            "dns_refresh_s": 0.5,
            "triton_model": MODEL,
            "health_timeout_s": 0.5,
            "connect_timeout_s": 5,
        },
    }
    server = {"address": "127.0.0.1:0", "grace_period_s": 1, "health_check_interval_s": 0.5}
    gateway = InferwireServer(load_settings(server=server, models=[model]))
    await gateway.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            rig = Rig(
                tritons,
                dns_server,
                inference_pb2_grpc.InferenceServiceStub(channel),
                health_pb2_grpc.HealthStub(channel),
            )
            await rig.until_status(SERVING)
            await rig.until_rotation(*initial)
            yield rig
    finally:
        await gateway.stop(grace_s=1)


async def test_a_new_address_gets_the_model_then_a_share_of_requests(tritons, dns_server):
    a, b, _ = tritons
    if b.model_ready(MODEL):
        b.unload_model(MODEL)
    async with serving(tritons, dns_server, a) as rig:
        before_a, before_b = executed(a), executed(b)
        rig.zone(a, b)
        changed = time.monotonic()
        while executed(b) == before_b:
            assert time.monotonic() - changed < BOUND_S, "the new endpoint never got traffic"
            await rig.infer()
        log.info("zone change to traffic on the new endpoint: %.2f s", time.monotonic() - changed)
        assert b.model_ready(MODEL)
        await rig.until_rotation(a, b)
        mid_a, mid_b = executed(a), executed(b)
        await rig.infer_many(100)
        share_a, share_b = executed(a) - mid_a, executed(b) - mid_b
        log.info("100 requests: %d on %s, %d on %s", share_a, a.url, share_b, b.url)
        assert share_a + share_b == 100
        assert share_a > 0 and share_b > 0
        assert mid_a > before_a


async def test_a_removed_address_drains_its_streams_and_gets_no_new_requests(tritons, dns_server):
    a, b, _ = tritons
    async with serving(tritons, dns_server, a, b) as rig:
        before_b = executed(b)
        prompt = " ".join(f"w{i}" for i in range(100))
        calls = [
            rig.stub.InferStream(
                pb.InferStreamRequest(
                    model="scaled",
                    prompt=prompt,
                    parameters=pb.GenerationParameters(max_tokens=100),
                ),
                timeout=BOUND_S,
            )
            for _ in range(8)
        ]
        firsts = [(await call.read()).text for call in calls]
        rig.zone(a)
        await rig.until_rotation(a)
        rests = await asyncio.gather(*(read_rest(call) for call in calls))
        for first, rest in zip(firsts, rests, strict=True):
            assert first + "".join(m.text for m in rest) == echo_text(prompt, 100)
        drained_b = executed(b)
        assert drained_b > before_b, "no stream ran on the removed endpoint"
        await rig.infer_many(20)
        assert executed(b) == drained_b


async def test_an_empty_answer_is_not_serving_until_addresses_return(tritons, dns_server):
    a = tritons[0]
    async with serving(tritons, dns_server, a) as rig:
        rig.zone()
        await rig.until_status(NOT_SERVING)
        since = time.monotonic()
        while "resolved" not in (detail := await rig.detail()):
            assert time.monotonic() - since < BOUND_S, f"the detail never said why: {detail}"
            await asyncio.sleep(0.05)
        log.info("no address: %s", detail)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rig.infer()
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        rig.zone(a)
        await rig.until_status(SERVING)
        await rig.infer()


async def test_a_failing_dns_server_keeps_the_last_good_set(tritons, dns_server):
    a = tritons[0]
    async with serving(tritons, dns_server, a) as rig:
        dns_server.zone.failing = True
        try:
            asked = dns_server.zone.questions
            while dns_server.zone.questions < asked + 4:  # a few resolutions fail
                await asyncio.sleep(0.05)
            assert "DNS error, last good set kept" in await rig.detail()
            await rig.infer()
        finally:
            dns_server.zone.failing = False


async def test_a_killed_server_fails_over(tritons, dns_server):
    a, _, c = tritons
    async with serving(tritons, dns_server, a, c) as rig:
        c.kill()
        await rig.infer_many(20)
