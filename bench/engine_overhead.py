"""Engine overhead: one stream at a time, `InferStream` over loopback against `og.Engine`
driven directly in this process (the fastest path ONNX Runtime GenAI 0.18 offers).

Same prompts, greedy, same max_tokens, tokens decoded to text on both paths. Rounds
alternate direct and gateway so that drift on a shared machine hits both alike.
"""

from __future__ import annotations

import asyncio

from bench.common import RunOptions, ScenarioResult, Series, at_least, at_most, ratio, write_plot
from bench.streams import (
    STREAM_TABLE_HEADER,
    BatchRun,
    DirectEngine,
    compare_texts,
    gateway_batch,
    gateway_channel,
    gateway_server,
    prompts_for,
    stream_table_rows,
    summarize,
)
from inferwire.v1 import inference_pb2_grpc

NAME = "engine_overhead"


def run(options: RunOptions) -> ScenarioResult:
    max_tokens = options.size(128, 16)
    rounds = options.size(5, 1)
    per_round = options.size(8, 2)
    engine = DirectEngine(max_batch_size=1)
    engine.run(prompts_for(1), max_tokens)  # warm-up
    direct: list[BatchRun] = []
    gateway: list[BatchRun] = []
    with gateway_server(max_concurrency=1) as server:

        async def gateway_round(prompts: list[str]) -> list[BatchRun]:
            async with gateway_channel(server) as channel:
                stub = inference_pb2_grpc.InferenceServiceStub(channel)
                await gateway_batch(stub, prompts[:1], max_tokens)  # warm-up
                return [await gateway_batch(stub, [p], max_tokens) for p in prompts]

        for round_index in range(rounds):
            prompts = prompts_for(per_round, offset=round_index)
            direct += [engine.run([p], max_tokens) for p in prompts]
            gateway += asyncio.run(gateway_round(prompts))
    d, g = summarize(direct), summarize(gateway)
    tokens_ratio = ratio(g["aggregate_tokens_per_s"], d["aggregate_tokens_per_s"])
    extra_ttft = g["ttft_p50_ms"] - d["ttft_p50_ms"]
    same_text = compare_texts(direct, gateway)
    plot = write_plot(
        options,
        NAME,
        [
            Series("InferStream via inferwire", [1], [g["aggregate_tokens_per_s"]]),
            Series("og.Engine directly", [1], [d["aggregate_tokens_per_s"]], baseline=True),
        ],
        xlabel="concurrent streams",
        ylabel="tokens/s",
        title=f"One stream, greedy, {max_tokens} tokens",
    )
    rows = stream_table_rows([("og.Engine directly", d), ("InferStream via inferwire", g)])
    return ScenarioResult(
        name=NAME,
        title="Engine overhead: one stream, InferStream vs og.Engine directly",
        baseline="og.Engine (static batching, max_batch_size 1) driven in-process",
        data={
            "max_tokens": max_tokens,
            "requests_per_side": rounds * per_round,
            "direct_engine": d,
            "through_inferwire": g,
            "extra_ttft_p50_ms": extra_ttft,
            "same_text_share": same_text,
            "plot": plot.name,
        },
        ratios={"tokens_per_s": tokens_ratio},
        table_header=STREAM_TABLE_HEADER,
        table_rows=rows,
        targets=[
            at_least("InferStream tokens/s vs fastest direct path, one stream", tokens_ratio, 0.95),
            at_most("Extra time to first token through the gateway, p50 (ms)", extra_ttft, 2.0),
        ],
        notes=[
            f"Greedy on both paths; {same_text:.0%} of requests produced the same text.",
        ],
    )
