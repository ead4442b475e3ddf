"""Single-stream tokens/s of the bundled model: the engine directly vs. through InferStream.

Baseline and gateway run in the same invocation with the same prompt, seed and
parameters; the gateway is a real `inferwire serve` process reached over gRPC.
Writes bench/results/stream_throughput.json and .png.
"""

from __future__ import annotations

import statistics
import time

import grpc
import onnxruntime_genai as og

from bench.common import write_boxplot, write_results
from inferwire.backends.ort_genai import builtin_model_path
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

PROMPT = "Hello"
MAX_TOKENS = 512
SEED = 42
TEMPERATURE = 0.8
RUNS = 7


def direct_engine_run(model: og.Model, tokenizer: og.Tokenizer) -> tuple[int, float, float]:
    """Generate with the engine alone; return (tokens, seconds, time to first token)."""
    started = time.perf_counter()
    ids = tokenizer.encode(PROMPT)
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(ids) + MAX_TOKENS,
        batch_size=1,
        do_sample=True,
        temperature=TEMPERATURE,
        random_seed=SEED,
    )
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    tokens, first = 0, 0.0
    while not generator.is_done() and tokens < MAX_TOKENS:
        generator.generate_next_token()
        stream.decode(int(generator.get_next_tokens()[0]))
        tokens += 1
        if tokens == 1:
            first = time.perf_counter() - started
    return tokens, time.perf_counter() - started, first


def gateway_run(stub: inference_pb2_grpc.InferenceServiceStub) -> tuple[int, float, float]:
    started = time.perf_counter()
    first = 0.0
    last = None
    for message in stub.InferStream(
        pb.InferStreamRequest(
            model="demo",
            prompt=PROMPT,
            parameters=pb.GenerationParameters(
                max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=SEED
            ),
        )
    ):
        if not first and message.text:
            first = time.perf_counter() - started
        last = message
    assert last is not None
    return last.usage.completion_tokens, time.perf_counter() - started, first


def summarize(runs: list[tuple[int, float, float]]) -> dict[str, object]:
    rates = [tokens / seconds for tokens, seconds, _ in runs]
    return {
        "tokens_per_run": [tokens for tokens, _, _ in runs],
        "tokens_per_s": rates,
        "median_tokens_per_s": statistics.median(rates),
        "median_ttft_ms": statistics.median(first * 1e3 for _, _, first in runs),
    }


def main() -> None:
    model = og.Model(str(builtin_model_path()))
    tokenizer = og.Tokenizer(model)
    direct_engine_run(model, tokenizer)  # warm-up
    direct = [direct_engine_run(model, tokenizer) for _ in range(RUNS)]
    del model, tokenizer

    server = start_serving_server()
    try:
        with grpc.insecure_channel(server.target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            gateway_run(stub)  # warm-up
            through_gateway = [gateway_run(stub) for _ in range(RUNS)]
    finally:
        stop_server_process(server, graceful=True)

    results = {
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "seed": SEED,
        "temperature": TEMPERATURE,
        "runs": RUNS,
        "direct_engine": summarize(direct),
        "through_gateway": summarize(through_gateway),
    }
    direct_rate = results["direct_engine"]["median_tokens_per_s"]
    gateway_rate = results["through_gateway"]["median_tokens_per_s"]
    results["gateway_vs_direct"] = gateway_rate / direct_rate
    path = write_results("stream_throughput", results)

    write_boxplot(
        "stream_throughput",
        {
            "engine directly": results["direct_engine"]["tokens_per_s"],
            "InferStream via inferwire": results["through_gateway"]["tokens_per_s"],
        },
        ylabel="tokens/s (single stream)",
        title=f"demo model, {MAX_TOKENS} tokens, seed {SEED}, {RUNS} runs",
    )
    print(
        f"direct engine: {direct_rate:,.0f} tok/s; through InferStream: {gateway_rate:,.0f} tok/s "
        f"({results['gateway_vs_direct']:.2f}x); wrote {path}"
    )


if __name__ == "__main__":
    main()
