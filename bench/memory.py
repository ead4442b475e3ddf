"""Memory: `inferwire serve`'s resident set (VmRSS) idle, after a short warm-up, and every
10% of the way through 10,000 mixed requests.

The mix, in turn, over 8 concurrent callers: Infer and InferStream on the bundled model
(4 tokens), ListModels, Health, Tokenize, and three refused requests (no model name:
INVALID_ARGUMENT; an unknown model: NOT_FOUND; max_tokens out of range). Growth against
idle counts what the first requests allocate once (the engine's arenas, grpc's pools);
growth against the warm-up isolates what keeps growing.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from pathlib import Path
from typing import Any

import grpc

from bench.common import RunOptions, ScenarioResult, Series, below, closed_loop, write_plot
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

NAME = "memory"
CONCURRENCY = 8
SAMPLES = 10


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def mixed_calls(stub: inference_pb2_grpc.InferenceServiceStub, codes: collections.Counter):
    """An endless cycle of request kinds; each records its status code in `codes`."""
    params = pb.GenerationParameters(max_tokens=4, temperature=0.0)

    async def infer() -> None:
        await stub.Infer(pb.InferRequest(model="demo", prompt="Hello", parameters=params))

    async def infer_stream() -> None:
        async for _ in stub.InferStream(
            pb.InferStreamRequest(model="demo", prompt="Once upon", parameters=params)
        ):
            pass

    async def list_models() -> None:
        await stub.ListModels(pb.ListModelsRequest())

    async def health() -> None:
        await stub.Health(pb.HealthRequest(model="demo"))

    async def tokenize() -> None:
        await stub.Tokenize(pb.TokenizeRequest(model="demo", prompt="Hello there"))

    async def no_model() -> None:
        await stub.Infer(pb.InferRequest(prompt="Hello"))

    async def unknown_model() -> None:
        await stub.Infer(pb.InferRequest(model="no-such-model", prompt="Hello"))

    async def bad_max_tokens() -> None:
        await stub.Infer(
            pb.InferRequest(
                model="demo", prompt="Hi", parameters=pb.GenerationParameters(max_tokens=-1)
            )
        )

    kinds = itertools.cycle(
        [
            infer,
            infer_stream,
            list_models,
            health,
            tokenize,
            no_model,
            unknown_model,
            bad_max_tokens,
        ]
    )

    async def call() -> None:
        kind = next(kinds)
        try:
            await kind()
            codes[f"{kind.__name__}:OK"] += 1
        except grpc.aio.AioRpcError as error:
            codes[f"{kind.__name__}:{error.code().name}"] += 1

    return call


def run(options: RunOptions) -> ScenarioResult:
    total = options.size(10_000, 400)
    warmup = options.size(200, 40)
    codes: collections.Counter[str] = collections.Counter()
    served: list[int] = []
    rss: list[float] = []
    server = start_serving_server()
    try:
        pid = server.process.pid
        idle = rss_mib(pid)

        async def drive() -> float:
            async with grpc.aio.insecure_channel(server.target) as channel:
                call = mixed_calls(inference_pb2_grpc.InferenceServiceStub(channel), codes)
                await closed_loop(call, warmup, CONCURRENCY)
                after_warmup = rss_mib(pid)
                step = total // SAMPLES
                for index in range(SAMPLES):
                    await closed_loop(call, step, CONCURRENCY)
                    served.append((index + 1) * step)
                    rss.append(rss_mib(pid))
                return after_warmup

        after_warmup = asyncio.run(drive())
    finally:
        stop_server_process(server, graceful=True)
    final = rss[-1]
    growth_vs_idle = (final - idle) / idle * 100
    growth_vs_warm = (final - after_warmup) / after_warmup * 100
    plot = write_plot(
        options,
        NAME,
        [
            Series("inferwire serve RSS", [0.0, *map(float, served)], [after_warmup, *rss]),
            Series(
                "idle RSS (after start-up)", [0.0, float(served[-1])], [idle, idle], baseline=True
            ),
        ],
        xlabel="mixed requests served (after the warm-up)",
        ylabel="RSS (MiB)",
        title=f"inferwire serve memory, {total:,} mixed requests",
    )
    data: dict[str, Any] = {
        "requests": total,
        "warmup_requests": warmup,
        "idle_rss_mib": idle,
        "after_warmup_rss_mib": after_warmup,
        "final_rss_mib": final,
        "samples": [{"served": s, "rss_mib": r} for s, r in zip(served, rss, strict=True)],
        "growth_pct_vs_idle": growth_vs_idle,
        "growth_pct_vs_warmup": growth_vs_warm,
        "status_codes": dict(sorted(codes.items())),
        "plot": plot.name,
    }
    return ScenarioResult(
        name=NAME,
        title=f"Memory: RSS idle and after {total:,} mixed requests",
        baseline="the server's idle RSS, after start-up with the bundled model loaded",
        data=data,
        ratios={"final_rss_vs_idle": final / idle},
        table_header=["point", "RSS MiB"],
        table_rows=[
            ["idle", f"{idle:.1f}"],
            [f"after {warmup} warm-up requests", f"{after_warmup:.1f}"],
            *[[f"after {s:,}", f"{r:.1f}"] for s, r in zip(served, rss, strict=True)],
        ],
        targets=[
            below(f"RSS growth over {total:,} requests (% of idle)", growth_vs_idle, 10.0, "%")
        ],
        notes=[
            f"Growth after the warm-up: {growth_vs_warm:.1f}%.",
            "Status codes: " + ", ".join(f"{k} {v}" for k, v in sorted(codes.items())),
        ],
    )
