"""The faults tier's rig: two real tritonservers, a real Toxiproxy in front of each and in
front of inferwire, and an in-process inferwire gateway between them.

    client ──(proxy "client")──▶ inferwire ──(proxy "a")──▶ tritonserver a
                                           └─(proxy "b")──▶ tritonserver b

Models of the gateway (all Triton ones serve vllm_echo, TOKEN_DELAY_S a token):
  pair     - both Triton links: the picker, failover, resets
  only_a   - Triton link a alone: in-flight requests on a black hole (a slower keepalive
             than the pair's, so that deadlines come first)
  bounded  - as only_a, with request_timeout_s BOUNDED_TIMEOUT_S: the default timeout a
             client without a deadline gets (300 s in production, shortened here)
  only_b   - Triton link b alone: latency in Timing
  demo     - the bundled model on the embedded engine: a cut client link stops it

Timings are logged and put in pytest's summary (FIGURES), not asserted, except lower
bounds that the injected faults themselves guarantee.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.config import Settings, load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.toxiproxy import Proxy
from tests.support.triton import TritonServer
from tests.support.waiting import read_rest
from tests.triton_models.echo_engine import echo_text
from tests.unit.api.test_metrics import Samples, scrape

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TRITON_MODELS = ("pair", "only_a", "bounded", "only_b")
TOKEN_DELAY_S = 0.01
HEALTH_INTERVAL_S = 0.25  # the Triton endpoint checks, and the manager's watcher
HEALTH_TIMEOUT_S = 0.5
KEEPALIVE_TIME_S = 1.0
KEEPALIVE_TIMEOUT_S = 1.0
# only_a and bounded: a slower keepalive, so that deadlines end their requests first.
SLOW_KEEPALIVE_TIMEOUT_S = 3.0
BOUNDED_TIMEOUT_S = 1.5
# Generous: a wait fails a test only when something hangs.
BOUND_S = 30.0
SETTLE_S = 10.0
# (title, line) of what each test measured, for pytest's summary.
FIGURES: list[tuple[str, str]] = []
log = logging.getLogger(__name__)


def report(title: str, line: str) -> None:
    log.info("%s: %s", title, line)
    FIGURES.append((title, line))


def gateway_settings(a: Proxy, b: Proxy) -> Settings:
    def triton(name: str, urls: list[str], **options: Any) -> dict[str, Any]:
        return {
            "name": name,
            "backend": "triton",
            "load_on_startup": True,
            "max_concurrency": 16,
            "options": {
                "urls": urls,
                "triton_model": "vllm_echo",
                "health_interval_s": HEALTH_INTERVAL_S,
                "health_timeout_s": HEALTH_TIMEOUT_S,
                "keepalive_time_s": KEEPALIVE_TIME_S,
                "keepalive_timeout_s": KEEPALIVE_TIMEOUT_S,
                **options,
            },
        }

    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "127.0.0.1:0",
            "grace_period_s": 1,
            "health_check_interval_s": HEALTH_INTERVAL_S,
        },
        models=[
            triton("pair", [a.listen, b.listen]),
            triton("only_a", [a.listen], keepalive_timeout_s=SLOW_KEEPALIVE_TIMEOUT_S),
            triton(
                "bounded",
                [a.listen],
                keepalive_timeout_s=SLOW_KEEPALIVE_TIMEOUT_S,
                request_timeout_s=BOUNDED_TIMEOUT_S,
            ),
            triton("only_b", [b.listen]),
            {
                "name": "demo",
                "load_on_startup": True,
                "max_concurrency": 1,  # one generation thread, started by the warm-up
                "options": {"path": "builtin", "device": "cpu"},
            },
        ],
    )


# gRPC core's EventEngine pool (threads named "event_engine") adds a worker when its
# queue backs up, as a black hole's blocked calls on a slow machine make it, and reclaims
# an extra worker only after 20 s idle (kIdleThreadLimit in work_stealing_thread_pool.cc).
# Its size is the library's, not ours: it is given that long to shrink back.
GRPC_POOL_THREAD = "event_engine"
GRPC_POOL_IDLE_S = 20.0


@dataclass(frozen=True)
class Footprint:
    """What the test process holds: threads (ours, and gRPC core's pool apart), open
    descriptors, asyncio tasks."""

    threads: int
    grpc_pool: int
    fds: int
    tasks: int
    # Thread names (the kernel's comm) and counts, for a failure to say which grew.
    thread_names: dict[str, int] = field(default_factory=dict, compare=False)

    @classmethod
    def now(cls) -> Footprint:
        names: dict[str, int] = {}
        for task in os.listdir("/proc/self/task"):
            try:
                name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
            except OSError:  # ended while listed
                continue
            names[name] = names.get(name, 0) + 1
        pool = names.get(GRPC_POOL_THREAD, 0)
        fds = len(os.listdir("/proc/self/fd"))
        return cls(sum(names.values()) - pool, pool, fds, len(asyncio.all_tasks()), names)

    def within_but_grpc_pool(self, baseline: Footprint) -> bool:
        return (
            self.threads <= baseline.threads
            and self.fds <= baseline.fds
            and self.tasks <= baseline.tasks
        )

    def within(self, baseline: Footprint) -> bool:
        return self.within_but_grpc_pool(baseline) and self.grpc_pool <= baseline.grpc_pool


async def start_default_executor_workers() -> None:
    """Start every worker of the loop's default executor now: it starts them lazily and
    keeps them, so a thread count taken before a test could not be compared after it."""
    workers = ThreadPoolExecutor()._max_workers  # the default size, as asyncio makes it
    barrier = threading.Barrier(workers)
    await asyncio.gather(*(asyncio.to_thread(barrier.wait, 10) for _ in range(workers)))


@dataclass
class Rig:
    gateway: InferwireServer
    tritons: dict[str, TritonServer]
    proxies: dict[str, Proxy]
    stub: inference_pb2_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub

    @property
    def link_a(self) -> Proxy:
        return self.proxies["a"]

    @property
    def link_b(self) -> Proxy:
        return self.proxies["b"]

    async def status(self, model: str) -> int:
        request = health_pb2.HealthCheckRequest(service=f"model/{model}")
        return (await self.health.Check(request, timeout=5)).status

    async def until_status(self, model: str, wanted: int, since: float) -> float:
        """Seconds from `since` until `model/<model>` is `wanted`."""
        while await self.status(model) != wanted:
            assert time.monotonic() - since < BOUND_S, f"model/{model} never turned {wanted}"
            await asyncio.sleep(0.02)
        return time.monotonic() - since

    async def detail(self, model: str) -> str:
        response = await self.stub.Health(pb.HealthRequest(model=model), timeout=5)
        return response.models[0].detail

    async def until_detail(self, model: str, phrase: str, since: float) -> float:
        while phrase not in await self.detail(model):
            assert time.monotonic() - since < BOUND_S, f"{model}'s detail never said {phrase!r}"
            await asyncio.sleep(0.02)
        return time.monotonic() - since

    async def infer(self, model: str, prompt: str = "a b", tokens: int = 3, **kw: Any) -> Any:
        request = pb.InferRequest(
            model=model, prompt=prompt, parameters=pb.GenerationParameters(max_tokens=tokens)
        )
        reply = await self.stub.Infer(request, **kw)
        if model != "demo":
            assert reply.text == echo_text(prompt, tokens)
        return reply

    def served(self) -> dict[str, int]:
        """Requests each tritonserver counts as executed for vllm_echo."""
        return {name: triton.statistics("vllm_echo") for name, triton in self.tritons.items()}

    def deaths(self) -> str:
        """How each tritonserver that died by itself ended, for a failure's message."""
        return "".join(f"\n{d}" for t in self.tritons.values() if (d := t.death()))

    async def metrics(self) -> Samples:
        return await scrape(self.gateway)

    async def recovered(self, baseline: Footprint) -> Footprint:
        """Every toxic removed: every model SERVING again and serving requests, with no
        gateway restart; then the process's footprint back to `baseline`."""
        for proxy in self.proxies.values():
            proxy.clear()
        since = time.monotonic()
        for model in TRITON_MODELS:
            await self.until_status(model, SERVING, since)
            # Every endpoint healthy and none slow: the detail lists no problem.
            while "(" in (detail := await self.detail(model)):
                assert time.monotonic() - since < BOUND_S, f"{detail}{self.deaths()}"
                await asyncio.sleep(0.05)
        for model in TRITON_MODELS:
            for _ in range(2):  # on both endpoints of the pair
                await until_ok(lambda model=model: self.infer(model), since)
        settled_at = time.monotonic()
        while not (footprint := Footprint.now()).within(baseline):
            waited_s = time.monotonic() - settled_at
            if waited_s > SETTLE_S and not footprint.within_but_grpc_pool(baseline):
                break
            if waited_s > SETTLE_S + GRPC_POOL_IDLE_S:
                break
            await asyncio.sleep(0.1)
        return footprint


async def until_ok(attempt: Any, since: float) -> None:
    while True:
        try:
            await attempt()
            return
        except grpc.aio.AioRpcError:
            assert time.monotonic() - since < BOUND_S, "requests kept failing"
            await asyncio.sleep(0.05)


def long_stream(
    stub: inference_pb2_grpc.InferenceServiceStub, model: str, request_id: str = "", **kw: Any
) -> Any:
    """A stream far longer than any test here (1200 tokens), to be cut by a fault."""
    prompt = " ".join(f"w{i}" for i in range(400))
    request = pb.InferStreamRequest(
        model=model,
        prompt=prompt,
        request_id=request_id,
        parameters=pb.GenerationParameters(max_tokens=1200),
    )
    return stub.InferStream(request, **kw)


async def ending(call: Any) -> tuple[grpc.StatusCode, str, float]:
    """How a started stream ends: its code, its details, and when (time.monotonic())."""
    try:
        await read_rest(call)
        code, details = grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    return code, details, time.monotonic()
