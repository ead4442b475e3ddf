"""Concurrency scaling: N streams started together, through `InferStream` and through
`og.Engine` driven directly with a static batch of N rows, for N in 1, 4, 16, 32.

Aggregate tokens/s is all tokens over the wall time until the last stream ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import RunOptions, ScenarioResult, Series, at_least, ratio, write_plot
from bench.streams import (
    DirectEngine,
    compare_texts,
    gateway_batch,
    gateway_channel,
    gateway_server,
    prompts_for,
    summarize,
)
from inferwire.v1 import inference_pb2_grpc

NAME = "concurrency_scaling"
CONCURRENCY = (1, 4, 16, 32)


def run(options: RunOptions) -> ScenarioResult:
    max_tokens = options.size(64, 8)
    rounds = options.size(3, 1)
    levels = CONCURRENCY
    points: dict[int, dict[str, Any]] = {}
    with gateway_server(max_concurrency=max(levels)) as server:
        for streams in levels:
            engine = DirectEngine(max_batch_size=streams)
            engine.run(prompts_for(streams), max_tokens)  # warm-up
            direct = [engine.run(prompts_for(streams, r), max_tokens) for r in range(rounds)]
            del engine

            async def through_gateway(streams: int = streams) -> list:
                async with gateway_channel(server) as channel:
                    stub = inference_pb2_grpc.InferenceServiceStub(channel)
                    await gateway_batch(stub, prompts_for(streams), max_tokens)  # warm-up
                    return [
                        await gateway_batch(stub, prompts_for(streams, r), max_tokens)
                        for r in range(rounds)
                    ]

            gateway = asyncio.run(through_gateway())
            d, g = summarize(direct), summarize(gateway)
            points[streams] = {
                "direct_engine": d,
                "through_inferwire": g,
                "tokens_ratio": ratio(g["aggregate_tokens_per_s"], d["aggregate_tokens_per_s"]),
                "same_text_share": compare_texts(direct, gateway),
            }
    xs = [float(n) for n in levels]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                "InferStream via inferwire",
                xs,
                [points[n]["through_inferwire"]["aggregate_tokens_per_s"] for n in levels],
            ),
            Series(
                "og.Engine directly (static batch = N)",
                xs,
                [points[n]["direct_engine"]["aggregate_tokens_per_s"] for n in levels],
                baseline=True,
            ),
        ],
        xlabel="concurrent streams",
        ylabel="aggregate tokens/s",
        title=f"Concurrency scaling, greedy, {max_tokens} tokens per stream",
        log_x=True,
    )
    rows = [
        [
            str(n),
            f"{p['direct_engine']['aggregate_tokens_per_s']:,.0f}",
            f"{p['through_inferwire']['aggregate_tokens_per_s']:,.0f}",
            f"{p['tokens_ratio']:.3f}",
            f"{p['direct_engine']['ttft_p50_ms']:.1f}",
            f"{p['through_inferwire']['ttft_p50_ms']:.1f}",
        ]
        for n, p in points.items()
    ]
    at16 = points[16]["tokens_ratio"]
    return ScenarioResult(
        name=NAME,
        title="Concurrency scaling: aggregate tokens/s, InferStream vs og.Engine directly",
        baseline="og.Engine driven in-process, static batching with max_batch_size = N",
        data={
            "max_tokens": max_tokens,
            "rounds": rounds,
            "points": {str(n): p for n, p in points.items()},
            "plot": plot.name,
        },
        ratios={f"tokens_per_s_at_{n}": p["tokens_ratio"] for n, p in points.items()},
        table_header=[
            "streams",
            "og.Engine tok/s",
            "inferwire tok/s",
            "ratio",
            "og.Engine TTFT p50 ms",
            "inferwire TTFT p50 ms",
        ],
        table_rows=rows,
        targets=[
            at_least("Aggregate tokens/s at 16 streams vs og.Engine at 16", at16, 0.9),
        ],
        notes=[
            "Same greedy prompts on both paths; share with identical text per level: "
            + ", ".join(f"{n}: {p['same_text_share']:.0%}" for n, p in points.items()),
        ],
    )
