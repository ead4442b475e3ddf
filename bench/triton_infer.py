"""Unary Infer at concurrency 16: tritonclient straight to Triton vs. through inferwire.

Two direct baselines: tritonclient's high-level aio client (numpy in, numpy out: what
most Python users write, and CPU-heavy on the client), and tritonclient's generated
gRPC stub with a prebuilt request, which costs the load generator about as little as
the prebuilt inferwire request does, so it isolates the gateway's added cost.

Both runs use the same real `tritonserver` (from nvidia-pytriton), the same test model
(`trtllm_unary` from tests/triton_models: TensorRT-LLM-style inputs, not decoupled, so
tritonclient's unary `infer` can call it) and the same prompt and max_tokens, in one
invocation. The gateway is a real `inferwire serve` process reached over gRPC. The model's
per-token delay is set to 0, so the numbers show the gateway's own cost.
Writes bench/results/triton_infer.json and .png.

Run: .venv/bin/python -m bench.triton_infer   (after scripts/install_triton.sh)
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as triton_types
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.common import write_boxplot, write_results
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process
from tests.support.triton import TRITON_DIR, TritonServer, prepare_python_backend

MODEL = "trtllm_unary"
PROMPT = "the quick brown fox"
MAX_TOKENS = 8
CONCURRENCY = 16
REQUESTS = 2000
WARMUP = 200


def direct_inputs() -> list[triton_types.InferInput]:
    inputs = []
    for name, value, datatype in [
        ("text_input", np.array([[PROMPT.encode()]], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
        ("exclude_input_in_output", np.array([[True]]), "BOOL"),
    ]:
        tensor = triton_types.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


async def run_load(call, requests: int) -> tuple[float, list[float]]:
    """`requests` calls with CONCURRENCY in flight; return (wall seconds, latencies in ms)."""
    latencies: list[float] = []
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            started = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started, latencies


def summary(wall_s: float, latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "rps": len(ordered) / wall_s,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "mean_ms": statistics.fmean(ordered),
    }


async def bench_direct(url: str) -> tuple[dict[str, float], list[float]]:
    inputs = direct_inputs()
    expected = None
    async with triton_aio.InferenceServerClient(url) as client:

        async def call() -> None:
            result = await client.infer(MODEL, inputs)
            text = result.as_numpy("text_output").reshape(-1)[0]
            assert expected is None or text == expected

        expected = (await client.infer(MODEL, inputs)).as_numpy("text_output").reshape(-1)[0]
        await run_load(call, WARMUP)
        wall, latencies = await run_load(call, REQUESTS)
    return summary(wall, latencies), latencies


async def bench_direct_stub(url: str) -> tuple[dict[str, float], list[float]]:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    for tensor in direct_inputs():
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def call() -> None:
            response = await stub.ModelInfer(request)
            assert response.outputs[0].name == "text_output"

        await run_load(call, WARMUP)
        wall, latencies = await run_load(call, REQUESTS)
    return summary(wall, latencies), latencies


async def bench_gateway(port: int) -> tuple[dict[str, float], list[float]]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        request = pb.InferRequest(
            model=MODEL, prompt=PROMPT, parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS)
        )

        async def call() -> None:
            await stub.Infer(request)

        await run_load(call, WARMUP)
        wall, latencies = await run_load(call, REQUESTS)
    return summary(wall, latencies), latencies


def main() -> None:
    if TRITON_DIR is None:
        raise SystemExit("tritonserver is not installed; run scripts/install_triton.sh")
    prepare_python_backend(TRITON_DIR)
    with tempfile.TemporaryDirectory() as scratch:
        triton = TritonServer(
            Path(scratch),
            load_models=(MODEL,),
            extra_env={"INFERWIRE_TRITON_TOKEN_DELAY_S": "0"},
        )
        triton.start()
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(
            f"models:\n  - name: {MODEL}\n    backend: triton\n"
            f"    load_on_startup: true\n    max_concurrency: {CONCURRENCY}\n"
            f"    options: {{url: '{triton.url}'}}\n"
        )
        try:
            direct, direct_latencies = asyncio.run(bench_direct(triton.url))
            direct_stub, direct_stub_latencies = asyncio.run(bench_direct_stub(triton.url))
            server = start_serving_server("--config", str(config))
            try:
                gateway, gateway_latencies = asyncio.run(bench_gateway(server.port))
            finally:
                stop_server_process(server, graceful=True)
        finally:
            triton.kill()
    results = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "concurrency": CONCURRENCY,
        "direct_tritonclient": direct,
        "direct_triton_stub": direct_stub,
        "through_inferwire": gateway,
        "added_p50_ms_vs_stub": gateway["p50_ms"] - direct_stub["p50_ms"],
        "rps_ratio_vs_stub": gateway["rps"] / direct_stub["rps"],
    }
    path = write_results("triton_infer", results)
    write_boxplot(
        "triton_infer",
        {
            "tritonclient client": direct_latencies,
            "tritonclient stub": direct_stub_latencies,
            "through inferwire": gateway_latencies,
        },
        ylabel="latency (ms)",
        title=f"Unary Infer on Triton, concurrency {CONCURRENCY}",
    )
    for name in ("direct_tritonclient", "direct_triton_stub", "through_inferwire"):
        r = results[name]
        print(
            f"{name:22s} {r['rps']:8.1f} req/s"
            f"  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
