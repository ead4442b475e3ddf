"""Triton overhead: unary Infer at concurrency 1, 8 and 32, straight to `tritonserver` and
through inferwire; same model, same server, same prompt and max_tokens, one invocation.

Two direct baselines:
- the raw gRPC stub of `inference.GRPCInferenceService` (tritonclient's generated stub)
  with a prebuilt request: it costs the load generator about as little as the prebuilt
  inferwire request does, so it isolates the gateway's added cost (the ratio's baseline);
- `tritonclient.grpc.aio` (numpy in, numpy out): what most Python users write.
The load generator is grpc.aio in this process for all three.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import tritonclient.grpc as triton_types
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    measure_rps,
    ratio,
    write_plot,
)
from bench.triton_setup import MAX_TOKENS, MODEL, PROMPT, direct_tensors, triton_and_gateway
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

NAME = "triton_overhead"
CONCURRENCY = (1, 8, 32)
PATHS = ("triton_stub", "tritonclient_aio", "through_inferwire")


def _tritonclient_inputs() -> list[triton_types.InferInput]:
    inputs = []
    for name, value, datatype in direct_tensors():
        tensor = triton_types.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def stub_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    for tensor in _tritonclient_inputs():
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    return request


async def _measure(
    path: str, url: str, gateway_target: str, concurrency: int, requests: int, warmup: int
) -> dict[str, float]:
    if path == "tritonclient_aio":
        inputs = _tritonclient_inputs()
        async with triton_aio.InferenceServerClient(url) as client:

            async def call_client() -> None:
                result = await client.infer(MODEL, inputs)
                assert result.as_numpy("text_output") is not None

            return await measure_rps(call_client, requests, concurrency, warmup)
    if path == "triton_stub":
        request = stub_request()
        async with grpc.aio.insecure_channel(url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def call_stub() -> None:
                response = await stub.ModelInfer(request)
                assert response.outputs[0].name == "text_output"

            return await measure_rps(call_stub, requests, concurrency, warmup)
    gateway_request = pb.InferRequest(
        model=MODEL, prompt=PROMPT, parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS)
    )
    async with grpc.aio.insecure_channel(gateway_target) as channel:
        gateway = inference_pb2_grpc.InferenceServiceStub(channel)

        async def call_gateway() -> None:
            response = await gateway.Infer(gateway_request)
            assert response.text

        return await measure_rps(call_gateway, requests, concurrency, warmup)


def run(options: RunOptions) -> ScenarioResult:
    requests = options.size(2000, 60)
    warmup = options.size(200, 10)
    points: dict[int, dict[str, Any]] = {}
    with triton_and_gateway(max_concurrency=max(CONCURRENCY)) as pair:
        for concurrency in CONCURRENCY:
            point: dict[str, Any] = {
                path: asyncio.run(
                    _measure(
                        path, pair.triton.url, pair.gateway.target, concurrency, requests, warmup
                    )
                )
                for path in PATHS
            }
            point["rps_ratio_vs_stub"] = ratio(
                point["through_inferwire"]["rps"], point["triton_stub"]["rps"]
            )
            point["added_p50_ms_vs_stub"] = (
                point["through_inferwire"]["p50_ms"] - point["triton_stub"]["p50_ms"]
            )
            points[concurrency] = point
    xs = [float(c) for c in CONCURRENCY]
    labels = {
        "triton_stub": "Triton, raw gRPC stub",
        "tritonclient_aio": "Triton, tritonclient.grpc.aio",
        "through_inferwire": "inferwire Infer -> Triton",
    }
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                labels[path],
                xs,
                [points[c][path]["rps"] for c in CONCURRENCY],
                baseline=path != "through_inferwire",
            )
            for path in PATHS
        ],
        xlabel="concurrency",
        ylabel="requests/s",
        title=f"Unary Infer on Triton ({MODEL}, {MAX_TOKENS} tokens)",
        log_x=True,
    )
    rows = [
        [
            str(c),
            *(f"{p[path]['rps']:,.0f}" for path in PATHS),
            f"{p['rps_ratio_vs_stub']:.3f}",
            f"{p['triton_stub']['p50_ms']:.2f}",
            f"{p['through_inferwire']['p50_ms']:.2f}",
        ]
        for c, p in points.items()
    ]
    at8 = points[8]["rps_ratio_vs_stub"]
    return ScenarioResult(
        name=NAME,
        title="Triton overhead: unary Infer, direct to tritonserver vs through inferwire",
        baseline="the raw GRPCInferenceService stub with a prebuilt ModelInferRequest, "
        "same tritonserver and model",
        data={
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "requests": requests,
            "points": {str(c): p for c, p in points.items()},
            "plot": plot.name,
        },
        ratios={f"rps_vs_stub_at_{c}": p["rps_ratio_vs_stub"] for c, p in points.items()},
        table_header=[
            "concurrency",
            "stub req/s",
            "tritonclient req/s",
            "inferwire req/s",
            "inferwire/stub",
            "stub p50 ms",
            "inferwire p50 ms",
        ],
        table_rows=rows,
        targets=[
            at_least("Unary Infer RPS via inferwire vs raw Triton stub, concurrency 8", at8, 0.8)
        ],
        notes=[
            "The client, inferwire, tritonserver and its Python backend stub share the CPUs; "
            "on a small machine every cycle inferwire spends is one Triton does not get.",
        ],
    )
