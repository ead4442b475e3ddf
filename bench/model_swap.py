"""Model swap: what loading on demand costs, with three copies of the bundled model.

1. First-request latency of a model that is not resident (the request loads it on
   demand) against the same request once it is resident: `UnloadModel`, then two
   `Infer` calls, for several rounds.
2. Requests per second under a random mix over the three models with a CPU budget that
   fits two (models are evicted and loaded again as the mix moves), against the same
   mix with no budget (all three stay resident): the baseline.

Every model is `on_demand` with `min_resident_s: 0`; `load_wait_s` is long enough
that no request is refused while busy models finish.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    closed_loop,
    latency_summary,
    percentile,
    ratio,
    write_plot,
)
from inferwire.backends.ort_genai import OrtGenAIBackend, builtin_model_path
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

NAME = "model_swap"
MODELS = ("m0", "m1", "m2")
MAX_CONCURRENCY = 4
CONCURRENCY = 16
PARAMS = pb.GenerationParameters(max_tokens=8)


def write_config(directory: Path, budget: int | None) -> Path:
    """Three copies of the bundled model, on demand; `budget`: bytes on `cpu` (None: none)."""
    models = []
    for name in MODELS:
        shutil.copytree(builtin_model_path(), directory / name, dirs_exist_ok=True)
        models.append(
            {
                "name": name,
                "on_demand": True,
                "max_concurrency": MAX_CONCURRENCY,
                "max_queue": 256,
                "options": {"path": str(directory / name), "batching": "per_request"},
            }
        )
    memory: dict[str, Any] = {"load_wait_s": 120, "min_resident_s": 0}
    if budget is not None:
        memory["budgets"] = {"cpu": budget}
    config = directory / f"config-{budget or 'unlimited'}.yaml"
    config.write_text(yaml.safe_dump({"server": {"memory": memory}, "models": models}))
    return config


async def first_requests(target: str, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """Per round: latency of the first Infer after an unload, of the next one (both ms),
    and the load time the first one reported."""
    cold, warm, load = [], [], []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        request = pb.InferRequest(model="m0", prompt="Once upon a time", parameters=PARAMS)
        await stub.Infer(request)
        for _ in range(rounds):
            await stub.UnloadModel(pb.UnloadModelRequest(model="m0"))
            started = time.perf_counter()
            reply = await stub.Infer(request)
            cold.append((time.perf_counter() - started) * 1e3)
            load.append(reply.timing.load_ms)
            started = time.perf_counter()
            await stub.Infer(request)
            warm.append((time.perf_counter() - started) * 1e3)
    return cold, warm, load


async def mixed_run(target: str, requests: int) -> dict[str, float]:
    """A closed loop over the three models, in a random mix (the same for every run)."""
    rng = random.Random(22)
    loads = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def call() -> None:
            model = rng.choice(MODELS)
            reply = await stub.Infer(
                pb.InferRequest(model=model, prompt="The little dog", parameters=PARAMS),
                timeout=300,
            )
            if reply.timing.load_ms > 0:
                loads.append(reply.timing.load_ms)

        for name in MODELS:  # every model resident once, as the budget allows
            await stub.Infer(pb.InferRequest(model=name, prompt="Hi", parameters=PARAMS))
        wall, latencies = await closed_loop(call, requests, CONCURRENCY)
    summary = latency_summary(wall, latencies)
    summary["requests_that_waited_for_a_load"] = len(loads)
    summary["load_wait_p50_ms"] = percentile(loads, 0.5)
    return summary


def run(options: RunOptions) -> ScenarioResult:
    rounds = options.size(20, 3)
    requests = options.size(1500, 120)
    footprint = OrtGenAIBackend("m", {"path": "builtin"}, MAX_CONCURRENCY).footprint()
    assert footprint is not None
    budget = footprint.amount * 5 // 2  # two fit, three do not
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="inferwire-model-swap-") as scratch:
        for label, limit in (("two_of_three", budget), ("unlimited", None)):
            config = write_config(Path(scratch), limit)
            server = start_serving_server("--config", str(config))
            try:
                if label == "two_of_three":
                    results["first"] = asyncio.run(first_requests(server.target, rounds))
                results[label] = asyncio.run(mixed_run(server.target, requests))
            finally:
                stop_server_process(server, graceful=True)
    cold, warm, load = results["first"]
    swap, resident = results["two_of_three"], results["unlimited"]
    cold_p50, warm_p50 = percentile(cold, 0.5), percentile(warm, 0.5)
    rps_ratio = ratio(swap["rps"], resident["rps"])
    plot = write_plot(
        options,
        NAME,
        [
            Series("first request, model not resident", list(range(1, rounds + 1)), cold),
            Series("next request, resident", list(range(1, rounds + 1)), warm, baseline=True),
        ],
        xlabel="round (UnloadModel, then two Infer)",
        ylabel="Infer latency (ms)",
        title="First request: loading on demand against resident",
    )
    data: dict[str, Any] = {
        "footprint_bytes": footprint.amount,
        "budget_bytes": budget,
        "rounds": rounds,
        "first_request_ms": cold,
        "resident_request_ms": warm,
        "load_ms": load,
        "mix_two_of_three": swap,
        "mix_unlimited": resident,
        "concurrency": CONCURRENCY,
        "plot": plot.name,
    }
    return ScenarioResult(
        name=NAME,
        title="Model swap: loading on demand, and a three-model mix in room for two",
        baseline="the same request once resident; the same mix with all three resident",
        data=data,
        ratios={"mix_rps_vs_all_resident": rps_ratio, "first_vs_resident_p50": cold_p50 / warm_p50},
        table_header=["measure", "budget for two of three", "all resident (baseline)"],
        table_rows=[
            ["first request p50 (ms)", f"{cold_p50:.1f}", f"{warm_p50:.1f}"],
            ["its load_ms p50", f"{percentile(load, 0.5):.1f}", "0"],
            [
                f"mix requests/s ({CONCURRENCY} callers)",
                f"{swap['rps']:.1f}",
                f"{resident['rps']:.1f}",
            ],
            ["mix latency p50 (ms)", f"{swap['p50_ms']:.1f}", f"{resident['p50_ms']:.1f}"],
            ["mix latency p99 (ms)", f"{swap['p99_ms']:.1f}", f"{resident['p99_ms']:.1f}"],
            [
                "mix requests that waited for a load",
                f"{swap['requests_that_waited_for_a_load']:.0f}",
                f"{resident['requests_that_waited_for_a_load']:.0f}",
            ],
        ],
        targets=[],
        notes=[
            f"Each model's estimated footprint {footprint.amount / 2**20:.1f} MiB "
            f"(max_concurrency {MAX_CONCURRENCY}); budget {budget / 2**20:.1f} MiB.",
            f"{requests} mixed requests per run, {rounds} first-request rounds.",
        ],
    )
