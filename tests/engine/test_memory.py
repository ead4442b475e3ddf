"""Many models on bounded memory with the real engine: copies of the bundled model under
their own names, a CPU budget that fits two of them, eviction under a storm of clients,
pinning, refusals with RetryInfo, a corrupt copy loaded on demand, idle unloads, and the
footprint estimate against the process's resident set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import random
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from inferwire.backends import create_backend
from inferwire.backends.ort_genai import OrtGenAIBackend, builtin_model_path
from inferwire.config import load_settings
from inferwire.core.lifecycle import Trigger
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.memory import MemorySettings, format_size, memory_in_use
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import GenerationParams
from inferwire.core.status import ModelState
from inferwire.core.validation import RequestLimits
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures
from tests.support.engine import SLOW_READER_OPTIONS
from tests.support.waiting import wait_until

log = logging.getLogger(__name__)

# The storm runs this long: the issue asks for 30 s; on the shared two-core machine the
# tier runs on, 15 s already covers dozens of evictions (the figures say how many).
STORM_S = 15.0
CLIENTS = 16
PROMPTS = ("Once upon a time", "The little dog", "In the morning", "She said")
MAX_TOKENS = 12
MAX_CONCURRENCY = 4
FIGURES = "many models on bounded memory"


def copy_model(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for source in builtin_model_path().iterdir():
        shutil.copyfile(source, directory / source.name)
    return directory


def estimate(max_concurrency: int = MAX_CONCURRENCY) -> int:
    backend = OrtGenAIBackend("x", {"path": "builtin"}, max_concurrency)
    footprint = backend.footprint()
    assert footprint is not None and footprint.device == "cpu"
    return footprint.amount


@contextlib.asynccontextmanager
async def serving(
    models: list[dict[str, Any]], budget: int, **memory: Any
) -> AsyncIterator[tuple[InferwireServer, grpc.aio.Channel]]:
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "health_check_interval_s": 0.5,
            "memory": {"budgets": {"cpu": budget}, **memory},
        },
        models=models,
    )
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, channel
    finally:
        await server.stop(grace_s=1)


def on_demand(name: str, path: Path, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "on_demand": True,
        "max_concurrency": MAX_CONCURRENCY,
        "max_queue": 64,
        "options": {"path": str(path), "batching": "per_request"},
        **fields,
    }


def ask(model: str, prompt: str = PROMPTS[0]) -> pb.InferStreamRequest:
    return pb.InferStreamRequest(
        model=model, prompt=prompt, parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS)
    )


async def stream_text(stub: Any, request: pb.InferStreamRequest) -> tuple[str, pb.Timing]:
    text, timing = [], pb.Timing()
    async for message in stub.InferStream(request, timeout=120):
        text.append(message.text)
        if message.HasField("timing"):
            timing = message.timing
    return "".join(text), timing


async def test_sixteen_clients_over_three_models_with_room_for_two(tmp_path):
    names = ["m0", "m1", "m2"]
    models = [on_demand(name, copy_model(tmp_path / name)) for name in names]
    budget = estimate() * 5 // 2  # two fit, three do not
    async with serving(models, budget, load_wait_s=60, min_resident_s=0) as (server, channel):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        # Each prompt's solo greedy text, one request at a time, on one copy.
        solo = {prompt: (await stream_text(stub, ask("m0", prompt)))[0] for prompt in PROMPTS}
        most_resident, samples = 0, 0
        stop = asyncio.Event()

        async def watch() -> None:
            nonlocal most_resident, samples
            while not stop.is_set():
                listed = (await stub.ListModels(pb.ListModelsRequest())).models
                holding = [m for m in listed if m.resident_bytes > 0]
                live = [
                    m
                    for m in listed
                    if m.state
                    in (pb.MODEL_STATE_LOADING, pb.MODEL_STATE_READY, pb.MODEL_STATE_UNLOADING)
                ]
                most_resident = max(most_resident, len(holding), len(live))
                samples += 1
                await asyncio.sleep(0.05)

        outcomes: Counter[str] = Counter()
        mismatches: list[str] = []
        load_waits: list[float] = []
        rng = random.Random(22)

        async def client() -> None:
            while not stop.is_set():
                model, prompt = rng.choice(names), rng.choice(PROMPTS)
                try:
                    text, timing = await stream_text(stub, ask(model, prompt))
                except grpc.aio.AioRpcError as error:
                    outcomes[error.code().name] += 1
                    continue
                outcomes["OK"] += 1
                if timing.load_ms > 0:
                    load_waits.append(timing.load_ms)
                if text != solo[prompt]:
                    mismatches.append(f"{model} {prompt!r}: {text!r} != {solo[prompt]!r}")

        watcher = asyncio.create_task(watch())
        clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
        await asyncio.sleep(STORM_S)
        stop.set()
        await asyncio.gather(*clients, watcher)
        registry = server.metrics.registry
        evictions = sum(
            registry.get_sample_value("inferwire_model_evictions_total", {"model": name}) or 0
            for name in names
        )
        figures.record(
            FIGURES,
            f"storm {STORM_S:g}s, {CLIENTS} clients, 3 models, budget {format_size(budget)} "
            f"(2 fit): {dict(outcomes)}, {evictions:.0f} evictions, {len(load_waits)} requests "
            f"waited for a load "
            f"(median {sorted(load_waits)[len(load_waits) // 2]:.0f} ms), "
            f"{samples} ListModels samples, most resident {most_resident}",
        )
        assert set(outcomes) == {"OK"}, outcomes
        assert not mismatches, mismatches[:3]
        assert evictions > 0 and load_waits
        assert samples > 0 and most_resident <= 2


async def test_pinned_busy_and_corrupt_models_at_the_edges(tmp_path):
    corrupt = copy_model(tmp_path / "corrupt")
    (corrupt / "model.onnx").write_bytes(b"not an ONNX model")
    models = [
        on_demand("pin", copy_model(tmp_path / "pin"), pinned=True),
        on_demand("a", copy_model(tmp_path / "a")),
        on_demand("b", copy_model(tmp_path / "b")),
        on_demand("corrupt", corrupt),
    ]
    budget = estimate() * 5 // 2
    async with (
        serving(models, budget, load_wait_s=3, min_resident_s=0) as (server, channel),
        grpc.aio.insecure_channel(
            f"127.0.0.1:{server.port}", options=SLOW_READER_OPTIONS
        ) as slow_channel,
    ):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        slow = inference_pb2_grpc.InferenceServiceStub(slow_channel)
        await stub.LoadModel(pb.LoadModelRequest(model="pin"))
        await stream_text(stub, ask("a"))
        # A reader that stops reading holds a's slot: a is busy.
        held = slow.InferStream(
            pb.InferStreamRequest(
                model="a", prompt="Hold", parameters=pb.GenerationParameters(max_tokens=1000)
            )
        )
        await held.read()

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.LoadModel(pb.LoadModelRequest(model="b"))
        message = refused.value.details()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "model 'b' needs " in message and " bytes) on cpu" in message
        assert "'pin' " in message and "(pinned)" in message
        assert "'a' " in message and "(busy: 1 running" in message
        log.info("LoadModel refused: %s", message)

        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as waited:
            await stream_text(stub, ask("b"))
        waited_s = time.monotonic() - started
        assert waited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status = rpc_status.from_call(waited.value)
        assert status is not None
        retry = error_details_pb2.RetryInfo()
        assert any(detail.Unpack(retry) for detail in status.details)
        figures.record(
            FIGURES,
            f"on-demand request while the memory is busy (load_wait_s 3): RESOURCE_EXHAUSTED "
            f"after {waited_s:.1f}s, RetryInfo {retry.retry_delay.ToMilliseconds()} ms",
        )

        # A request that waits while the busy model goes idle gets its model loaded.
        waiting = asyncio.ensure_future(stream_text(stub, ask("b")))
        await asyncio.sleep(0.2)
        held.cancel()
        text, timing = await waiting
        assert text and timing.load_ms > 0
        listed = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
        assert listed["pin"].state == pb.MODEL_STATE_READY  # pinned: never evicted
        assert listed["a"].state == pb.MODEL_STATE_UNLOADED
        assert "evicted to load 'b'" in listed["a"].detail

        # Every request waiting on a corrupt copy's load gets that load's error.
        attempts = await asyncio.gather(
            *(stream_text(stub, ask("corrupt")) for _ in range(4)), return_exceptions=True
        )
        for attempt in attempts:
            assert isinstance(attempt, grpc.aio.AioRpcError)
            assert attempt.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "'corrupt' failed to load" in (attempt.details() or "")
        health = health_pb2_grpc.HealthStub(channel)
        checked = await health.Check(health_pb2.HealthCheckRequest(service="model/corrupt"))
        assert checked.status == health_pb2.HealthCheckResponse.NOT_SERVING
        checked = await health.Check(health_pb2.HealthCheckRequest(service="model/a"))
        assert checked.status == health_pb2.HealthCheckResponse.SERVING  # loadable again


async def test_idle_unload_and_the_next_request_loads_again(tmp_path):
    models = [on_demand("idle", copy_model(tmp_path / "idle"), idle_unload_s=0.5)]
    async with serving(models, estimate() * 2) as (_, channel):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        _, first = await stream_text(stub, ask("idle"))
        assert first.load_ms > 0

        async def unloaded() -> bool:
            listed = (await stub.ListModels(pb.ListModelsRequest())).models
            return listed[0].state == pb.MODEL_STATE_UNLOADED

        await wait_until(unloaded, timeout_s=30)
        listed = (await stub.ListModels(pb.ListModelsRequest())).models
        assert "without a request" in listed[0].detail
        _, again = await stream_text(stub, ask("idle"))
        assert again.load_ms > 0
        figures.record(FIGURES, f"on-demand load seen by a request: {again.load_ms:.0f} ms")


@dataclass(frozen=True)
class Measured:
    estimated: int
    at_load: int
    serving: int
    load_ms: float
    detail: str


async def measure_footprint(directory: Path, concurrency: int) -> Measured:
    """In a fresh process (see the test): the RSS growth of loading a copy of the bundled
    model, and of it then serving `concurrency` requests at the full context length."""
    warm = OrtGenAIBackend("warm", {"path": str(copy_model(directory / "warm"))}, 1)
    # ONNX Runtime's one-time start-up is no model's footprint; the warm model stays
    # loaded so the measured one does not reuse memory the allocator kept from it.
    await warm.load()
    spec = ModelSpec(
        name="measured",
        max_concurrency=concurrency,
        options={"path": str(copy_model(directory / "measured")), "batching": "per_request"},
    )
    manager = ModelManager(
        [spec],
        create_backend,
        RequestLimits(max_prompt_bytes=1024),
        memory=MemorySettings(budgets={"cpu": 1 << 30}),
    )
    await manager.start()
    try:
        before = memory_in_use("cpu")
        started = time.perf_counter()
        status = await manager.load("measured", Trigger.EXPLICIT)
        load_ms = (time.perf_counter() - started) * 1e3
        loaded = memory_in_use("cpu")
        assert before is not None and loaded is not None and status.state is ModelState.READY
        context = json.loads((builtin_model_path() / "genai_config.json").read_text())["model"][
            "context_length"
        ]
        # Each request gets a KV cache for (nearly) the whole context window at once.
        params = GenerationParams(max_tokens=context - 16)
        streams = [
            manager.infer_stream(InferenceRequest(str(i), "measured", "Once upon", params=params))[
                1
            ]
            for i in range(concurrency)
        ]
        await asyncio.gather(*(anext(chunks) for chunks in streams))
        serving = memory_in_use("cpu")
        assert serving is not None
        for chunks in streams:
            await chunks.aclose()
        return Measured(
            status.resident_bytes, loaded - before, serving - before, load_ms, status.detail
        )
    finally:
        await manager.close()
        await warm.unload()


def _measure_in_this_process(directory: Path, concurrency: int) -> Measured:
    return asyncio.run(measure_footprint(directory, concurrency))


async def test_the_footprint_estimate_and_the_resident_set_agree_within_a_factor_of_two(
    tmp_path,
):
    # A fresh process: memory the allocator kept from earlier tests' unloads would be
    # reused and hide part of the growth.
    concurrency = 8
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        measured = await asyncio.get_running_loop().run_in_executor(
            pool, _measure_in_this_process, tmp_path, concurrency
        )
    files = sum(p.stat().st_size for p in builtin_model_path().iterdir())
    line = (
        f"bundled model: estimate {format_size(measured.estimated)} (files "
        f"{format_size(files)} + KV cache for {concurrency} requests at the full context); "
        f"RSS +{format_size(measured.at_load)} at load ({measured.load_ms:.0f} ms), "
        f"+{format_size(measured.serving)} serving {concurrency} full-context requests; "
        f"ListModels detail: {measured.detail}"
    )
    log.info(line)
    figures.record(FIGURES, line)
    # The KV cache is allocated per request, not at load: the estimate is compared with
    # the model serving its max_concurrency at full context.
    assert measured.estimated / 2 <= measured.serving <= measured.estimated * 2, line
    assert f"memory: {format_size(measured.estimated)} estimated: at load " in measured.detail
    assert "RSS at load" in measured.detail
