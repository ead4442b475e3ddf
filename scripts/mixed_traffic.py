"""Mixed traffic on the bundled model: long streams running while short requests arrive.

    python scripts/mixed_traffic.py [--repeat 3]

For each configuration (per_request; engine with static_batch_steps 32; engine with
static_batch_steps 0, whole static batches) it runs 2 long greedy streams (600 tokens)
and, while they run, 8 short unary requests (16 tokens) one after another, and prints
the median latency of the short requests and the aggregate tokens/s (medians of
`--repeat` runs). A measuring tool for docs/ort_genai_batching.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from scripts.stream_throughput import start_server

CONFIGS = {
    "per_request": {"batching": "per_request"},
    "engine, static_batch_steps 32": {"batching": "engine", "static_batch_steps": 32},
    "engine, static_batch_steps 0": {"batching": "engine", "static_batch_steps": 0},
}


async def mixed(target: str) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def long_stream(prompt: str) -> int:
            call = stub.InferStream(
                pb.InferStreamRequest(
                    model="demo",
                    prompt=prompt,
                    parameters=pb.GenerationParameters(max_tokens=600, temperature=0),
                )
            )
            messages = [message async for message in call]
            return messages[-1].usage.completion_tokens

        for _ in range(100):  # until the start-up load has finished
            try:
                await stub.Infer(pb.InferRequest(model="demo", prompt="warm"))
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
        started = time.perf_counter()
        longs = [asyncio.ensure_future(long_stream(p)) for p in ("Hello", "Once upon a time")]
        await asyncio.sleep(0.05)
        latencies, short_tokens = [], 0
        for _ in range(8):
            sent = time.perf_counter()
            response = await stub.Infer(
                pb.InferRequest(
                    model="demo",
                    prompt="My lord",
                    parameters=pb.GenerationParameters(max_tokens=16, temperature=0),
                )
            )
            latencies.append((time.perf_counter() - sent) * 1e3)
            short_tokens += response.usage.completion_tokens
        total = sum(await asyncio.gather(*longs)) + short_tokens
        return statistics.median(latencies), total / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for label, options in CONFIGS.items():
        config = {
            "models": [
                {
                    "name": "demo",
                    "load_on_startup": True,
                    "max_concurrency": 8,
                    "options": {"path": "builtin", **options},
                }
            ]
        }
        with tempfile.TemporaryDirectory() as tmp:
            config_file = Path(tmp) / "inferwire.yaml"
            config_file.write_text(json.dumps(config))
            process, port = start_server(config_file, None)
            try:
                time.sleep(1.0)
                runs = [asyncio.run(mixed(f"127.0.0.1:{port}")) for _ in range(args.repeat)]
            finally:
                process.kill()
                process.wait()
        latency = statistics.median(r[0] for r in runs)
        throughput = statistics.median(r[1] for r in runs)
        print(
            f"{label:32s} short-request latency p50 {latency:7.1f} ms  "
            f"aggregate {throughput:6.0f} tok/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
