"""KServe v2 overhead: tritonclient streaming through inferwire's `inference.GRPCInferenceService`
against inferwire's own `InferStream`; the same server, model, prompts and max_tokens, greedy.

One stream at a time: each request opens its own `ModelStreamInfer` with
`tritonclient.grpc.aio` (numpy tensors in and out, the vLLM convention with
`stream: true`), as each `InferStream` is one RPC. Rounds alternate the two paths, so
drift on a shared machine hits both alike. The ratio is KServe v2 / InferStream.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import tritonclient.grpc.aio as triton_aio

from bench.common import RunOptions, ScenarioResult, Series, ratio, write_plot
from bench.streams import (
    GATEWAY_MODEL,
    STREAM_TABLE_HEADER,
    BatchRun,
    StreamRun,
    compare_texts,
    gateway_batch,
    gateway_channel,
    gateway_server,
    prompts_for,
    stream_table_rows,
    summarize,
)
from inferwire.v1 import inference_pb2_grpc

NAME = "kserve_overhead"


def _inputs(prompt: str, max_tokens: int) -> list[triton_aio.InferInput]:
    values = [
        ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        ("stream", np.array([True]), "BOOL"),
        ("exclude_input_in_output", np.array([True]), "BOOL"),
        ("return_num_output_tokens", np.array([True]), "BOOL"),
        (
            "sampling_parameters",
            np.array([json.dumps({"max_tokens": max_tokens, "temperature": 0}).encode()]),
            "BYTES",
        ),
    ]
    inputs = []
    for name, value, datatype in values:
        tensor = triton_aio.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value.astype(np.object_) if datatype == "BYTES" else value)
        inputs.append(tensor)
    return inputs


async def _kserve_stream(
    client: triton_aio.InferenceServerClient, prompt: str, max_tokens: int
) -> BatchRun:
    inputs = _inputs(prompt, max_tokens)

    async def requests():  # type: ignore[no-untyped-def]  # tritonclient's iterator protocol
        yield {"model_name": GATEWAY_MODEL, "inputs": inputs}

    started = time.perf_counter()
    pieces: list[str] = []
    first, tokens = 0.0, 0
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        text = result.as_numpy("text_output").reshape(-1)[0].decode()
        if text and not first:
            first = time.perf_counter()
        pieces.append(text)
        counted = result.as_numpy("num_output_tokens")
        tokens += int(counted.reshape(-1)[0]) if counted is not None else 0
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    total = time.perf_counter() - started
    return BatchRun([StreamRun("".join(pieces), tokens, first - started, total)], total)


def run(options: RunOptions) -> ScenarioResult:
    max_tokens = options.size(128, 16)
    rounds = options.size(5, 1)
    per_round = options.size(8, 2)
    native: list[BatchRun] = []
    kserve: list[BatchRun] = []
    with gateway_server(max_concurrency=1) as server:

        async def measure_round(prompts: list[str]) -> tuple[list[BatchRun], list[BatchRun]]:
            async with gateway_channel(server) as channel:
                client = triton_aio.InferenceServerClient(server.target)
                try:
                    stub = inference_pb2_grpc.InferenceServiceStub(channel)
                    await gateway_batch(stub, prompts[:1], max_tokens)  # warm-up, both paths
                    await _kserve_stream(client, prompts[0], max_tokens)
                    ours, theirs = [], []
                    for prompt in prompts:
                        ours.append(await gateway_batch(stub, [prompt], max_tokens))
                        theirs.append(await _kserve_stream(client, prompt, max_tokens))
                    return ours, theirs
                finally:
                    await client.close()

        for round_index in range(rounds):
            ours, theirs = asyncio.run(measure_round(prompts_for(per_round, offset=round_index)))
            native += ours
            kserve += theirs
    n, k = summarize(native), summarize(kserve)
    tokens_ratio = ratio(k["aggregate_tokens_per_s"], n["aggregate_tokens_per_s"])
    extra_ttft = k["ttft_p50_ms"] - n["ttft_p50_ms"]
    same_text = compare_texts(native, kserve)
    plot = write_plot(
        options,
        NAME,
        [
            Series("ModelStreamInfer (tritonclient.grpc.aio)", [1], [k["aggregate_tokens_per_s"]]),
            Series("InferStream", [1], [n["aggregate_tokens_per_s"]], baseline=True),
        ],
        xlabel="concurrent streams",
        ylabel="tokens/s",
        title=f"One stream, greedy, {max_tokens} tokens, through inferwire",
    )
    rows = stream_table_rows([("InferStream", n), ("ModelStreamInfer via tritonclient", k)])
    return ScenarioResult(
        name=NAME,
        title="KServe v2 overhead: tritonclient ModelStreamInfer vs InferStream, one stream",
        baseline="inferwire.v1 InferStream, same server and model",
        data={
            "max_tokens": max_tokens,
            "requests_per_side": rounds * per_round,
            "infer_stream": n,
            "model_stream_infer": k,
            "extra_ttft_p50_ms": extra_ttft,
            "same_text_share": same_text,
            "plot": plot.name,
        },
        ratios={"tokens_per_s": tokens_ratio},
        table_header=STREAM_TABLE_HEADER,
        table_rows=rows,
        targets=[],  # the issue asks for the ratio (near 1), not a target of issue 17's table
        notes=[
            f"Greedy on both paths; {same_text:.0%} of requests produced the same text.",
            "The KServe path includes tritonclient's own cost (numpy tensors in and out); "
            "both clients run in the same process.",
        ],
    )
