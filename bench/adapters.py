"""Adapters: tokens/s of an adapter model (`demo-sonnets`) against its base (`demo`).

A real `inferwire serve` with the default configuration (the adapter-ready bundled model
and its bundled Sonnets adapter), greedy `InferStream` requests of 64 tokens, one stream
and 8 streams at once, the base and the adapter in turns. On a CPU both run one
`og.Generator` per request (the adapter always does: `og.Engine` takes no adapter in ORT
GenAI 0.18), so the difference is what the active adapter costs a request.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import grpc

from bench.common import RunOptions, ScenarioResult, Series, ratio, write_plot
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

NAME = "adapters"
BASE, ADAPTER = "demo", "demo-sonnets"
STREAMS = (1, 8)
MAX_TOKENS = 64
PROMPTS = ("Shall I compare thee", "When forty winters", "My mistress' eyes", "ROMEO:")


async def one_round(stub: Any, model: str, streams: int) -> tuple[int, float]:
    """`streams` requests at once: (tokens generated, wall seconds)."""

    async def one(index: int) -> int:
        request = pb.InferStreamRequest(
            model=model,
            prompt=PROMPTS[index % len(PROMPTS)],
            parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0.0),
        )
        tokens = 0
        async for message in stub.InferStream(request):
            if message.HasField("usage"):
                tokens = message.usage.completion_tokens
        return tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts), time.perf_counter() - started


async def measure(target: str, rounds: int) -> dict[str, dict[int, list[float]]]:
    """Tokens/s per round, by model and stream count; the models alternate round by round
    so that a change in the machine's load falls on both alike."""
    rates: dict[str, dict[int, list[float]]] = {BASE: {}, ADAPTER: {}}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        for model in (BASE, ADAPTER):  # warm-up
            await one_round(stub, model, 1)
        for streams in STREAMS:
            for _ in range(rounds):
                for model in (BASE, ADAPTER):
                    tokens, wall_s = await one_round(stub, model, streams)
                    rates[model].setdefault(streams, []).append(tokens / wall_s)
    return rates


def run(options: RunOptions) -> ScenarioResult:
    rounds = options.size(7, 2)
    server = start_serving_server()
    try:
        rates = asyncio.run(measure(server.target, rounds))
    finally:
        stop_server_process(server, graceful=True)
    median = {m: {s: statistics.median(v) for s, v in by.items()} for m, by in rates.items()}
    plot = write_plot(
        options,
        NAME,
        [
            Series(ADAPTER, list(STREAMS), [median[ADAPTER][s] for s in STREAMS]),
            Series(BASE, list(STREAMS), [median[BASE][s] for s in STREAMS], baseline=True),
        ],
        xlabel="concurrent streams",
        ylabel="tokens/s (all streams)",
        title="An adapter model against its base",
    )
    ratios = {
        f"tokens_per_s_{s}_streams": ratio(median[ADAPTER][s], median[BASE][s]) for s in STREAMS
    }
    rows = [
        [
            f"{s} stream{'s' if s > 1 else ''}",
            f"{median[ADAPTER][s]:.1f}",
            f"{median[BASE][s]:.1f}",
            f"{ratios[f'tokens_per_s_{s}_streams']:.3f}",
        ]
        for s in STREAMS
    ]
    return ScenarioResult(
        name=NAME,
        title="Adapters: tokens/s of demo-sonnets against demo",
        baseline=f"the base model {BASE!r}, same requests",
        data={
            "rounds": rounds,
            "max_tokens": MAX_TOKENS,
            "tokens_per_s": {m: {str(s): v for s, v in by.items()} for m, by in rates.items()},
            "median_tokens_per_s": {
                m: {str(s): v for s, v in by.items()} for m, by in median.items()
            },
            "plot": plot.name,
        },
        ratios=ratios,
        table_header=["streams", f"{ADAPTER} tokens/s", f"{BASE} tokens/s", "ratio"],
        table_rows=rows,
        targets=[],
        notes=[
            "Median of the rounds; every round runs the base and the adapter in turn.",
            "Both models run one og.Generator per request on this CPU; the adapter's "
            "generators also feed its 40 LoRA weight tensors to every step.",
        ],
    )
