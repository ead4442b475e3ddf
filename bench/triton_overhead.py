"""Triton overhead: unary Infer at concurrency 1, 8 and 32 on a trivial model, straight to
`tritonserver`, through the smallest Python gateway and through inferwire; one invocation.

The paths, all driven by grpc.aio in this process:
- `triton_stub`: the raw gRPC stub of `inference.GRPCInferenceService` with a prebuilt
  request: Triton's own rate, with no gateway at all (data);
- `tritonclient_aio`: `tritonclient.grpc.aio` (numpy in, numpy out), what most Python
  users write (data);
- `bare_proxy`: bench/triton_proxy.py, a bare grpc.aio server answering inferwire's
  `Infer` with one `ModelInfer` on one grpc.aio channel: the floor for a Python gateway
  (the targets' baseline);
- `through_inferwire`: a real `inferwire serve`.
The last two get the same InferRequest from the same client code. Next to requests per
second, each gateway's CPU time per request (bench/cpu.py, by thread group) is read from
/proc: far steadier than wall time on a shared machine. The paths take turns, in rounds
whose order alternates, so a change in the machine's load falls on all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
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
    at_most,
    closed_loop,
    latency_summary,
    ratio,
    write_plot,
)
from bench.cpu import CpuMeter, CpuUsage
from bench.triton_setup import (
    MAX_TOKENS,
    MODEL,
    PROMPT,
    direct_tensors,
    python_proxy,
    triton_and_gateway,
)
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

NAME = "triton_overhead"
CONCURRENCY = (1, 8, 32)
TARGET_CONCURRENCY = 8
PATHS = ("triton_stub", "tritonclient_aio", "bare_proxy", "through_inferwire")
GATEWAYS = ("bare_proxy", "through_inferwire")
LABELS = {
    "triton_stub": "Triton, raw gRPC stub",
    "tritonclient_aio": "Triton, tritonclient.grpc.aio",
    "bare_proxy": "bare Python proxy -> Triton",
    "through_inferwire": "inferwire Infer -> Triton",
}
Call = Callable[[], Awaitable[object]]


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


@contextlib.asynccontextmanager
async def _callers(urls: dict[str, str]) -> AsyncIterator[dict[str, Call]]:
    """One call per path, each on its own client; `urls`: path -> target."""
    async with contextlib.AsyncExitStack() as stack:
        calls: dict[str, Call] = {}
        inputs = _tritonclient_inputs()
        client = await stack.enter_async_context(
            triton_aio.InferenceServerClient(urls["tritonclient_aio"])
        )

        async def call_client() -> None:
            result = await client.infer(MODEL, inputs)
            assert result.as_numpy("text_output") is not None

        calls["tritonclient_aio"] = call_client
        request = stub_request()
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(urls["triton_stub"]))
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def call_stub() -> None:
            response = await stub.ModelInfer(request)
            assert response.outputs[0].name == "text_output"

        calls["triton_stub"] = call_stub
        gateway_request = pb.InferRequest(
            model=MODEL, prompt=PROMPT, parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS)
        )
        for path in GATEWAYS:  # the same client code for both gateways
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(urls[path]))
            gateway = inference_pb2_grpc.InferenceServiceStub(channel)

            async def call_gateway(gateway: Any = gateway) -> None:
                response = await gateway.Infer(gateway_request)
                assert response.text

            calls[path] = call_gateway
        yield calls


@dataclass
class PathRuns:
    """One path's rounds at one concurrency, added up."""

    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    cpu: CpuUsage = field(default_factory=lambda: CpuUsage(0.0, {}))

    def add(self, wall_s: float, latencies_ms: list[float], cpu: CpuUsage | None) -> None:
        self.wall_s += wall_s
        self.latencies_ms += latencies_ms
        if cpu is not None:
            self.cpu.total_us += cpu.total_us
            for group, us in cpu.by_group.items():
                self.cpu.by_group[group] = self.cpu.by_group.get(group, 0.0) + us

    def summary(self, metered: bool) -> dict[str, Any]:
        result: dict[str, Any] = latency_summary(self.wall_s, self.latencies_ms)
        if metered:
            result["cpu_us_per_request"] = self.cpu.per(len(self.latencies_ms))
        return result


async def _measure(
    urls: dict[str, str],
    pids: dict[str, int],
    concurrency: int,
    requests: int,
    warmup: int,
    rounds: int,
) -> dict[str, dict[str, Any]]:
    """`rounds` runs of `requests` per path, taking turns; gateways' CPU from `pids`."""
    runs = {path: PathRuns() for path in PATHS}
    async with _callers(urls) as calls:
        for path in PATHS:
            await closed_loop(calls[path], warmup, concurrency)
        for turn in range(rounds):
            for path in PATHS if turn % 2 == 0 else reversed(PATHS):
                if path in pids:
                    with CpuMeter(pids[path]) as meter:
                        wall, latencies = await closed_loop(calls[path], requests, concurrency)
                    runs[path].add(wall, latencies, meter.usage)
                else:
                    runs[path].add(*await closed_loop(calls[path], requests, concurrency), None)
    return {path: runs[path].summary(path in pids) for path in PATHS}


async def _answers(urls: dict[str, str]) -> dict[str, str]:
    """Each gateway's text for the benchmark's request: they must do the same work."""
    request = pb.InferRequest(
        model=MODEL, prompt=PROMPT, parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS)
    )
    texts = {}
    for path in GATEWAYS:
        async with grpc.aio.insecure_channel(urls[path]) as channel:
            response = await inference_pb2_grpc.InferenceServiceStub(channel).Infer(request)
            texts[path] = response.text
    return texts


def _point(measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    inferwire, proxy, stub = (
        measured["through_inferwire"],
        measured["bare_proxy"],
        measured["triton_stub"],
    )
    return {
        **measured,
        "rps_ratio_vs_proxy": ratio(inferwire["rps"], proxy["rps"]),
        "cpu_ratio_vs_proxy": ratio(
            inferwire["cpu_us_per_request"]["total"], proxy["cpu_us_per_request"]["total"]
        ),
        "rps_ratio_vs_stub": ratio(inferwire["rps"], stub["rps"]),
        "added_p50_ms_vs_proxy": inferwire["p50_ms"] - proxy["p50_ms"],
    }


def _row(concurrency: int, point: dict[str, Any]) -> list[str]:
    def cpu(path: str) -> str:
        per = point[path]["cpu_us_per_request"]
        return f"{per['total']:,.0f} ({per['event_loop']:,.0f} / {per['grpc']:,.0f})"

    return [
        str(concurrency),
        *(f"{point[path]['rps']:,.0f}" for path in PATHS),
        f"{point['rps_ratio_vs_proxy']:.3f}",
        cpu("bare_proxy"),
        cpu("through_inferwire"),
        f"{point['cpu_ratio_vs_proxy']:.3f}",
        f"{point['bare_proxy']['p50_ms']:.2f}",
        f"{point['through_inferwire']['p50_ms']:.2f}",
    ]


def run(options: RunOptions) -> ScenarioResult:
    requests = options.size(1000, 40)
    warmup = options.size(200, 10)
    rounds = options.size(3, 2)
    points: dict[int, dict[str, Any]] = {}
    with (
        triton_and_gateway(max_concurrency=max(CONCURRENCY)) as pair,
        python_proxy(pair.triton.url) as proxy,
    ):
        urls = {
            "triton_stub": pair.triton.url,
            "tritonclient_aio": pair.triton.url,
            "bare_proxy": proxy.target,
            "through_inferwire": pair.gateway.target,
        }
        pids = {"bare_proxy": proxy.pid, "through_inferwire": pair.gateway.process.pid}
        answers = asyncio.run(_answers(urls))
        for concurrency in CONCURRENCY:
            measured = asyncio.run(_measure(urls, pids, concurrency, requests, warmup, rounds))
            points[concurrency] = _point(measured)
    xs = [float(c) for c in CONCURRENCY]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                LABELS[path],
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
    at_target = points[TARGET_CONCURRENCY]
    return ScenarioResult(
        name=NAME,
        title="Triton overhead: unary Infer through inferwire vs a bare Python proxy",
        baseline="a bare grpc.aio server that answers Infer with one ModelInfer on one "
        "grpc.aio channel (bench/triton_proxy.py), same tritonserver, model and client; "
        "the raw GRPCInferenceService stub and tritonclient.grpc.aio straight to Triton "
        "as data",
        data={
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "answers": answers,
            "same_text": len(set(answers.values())) == 1,
            "requests_per_round": requests,
            "rounds": rounds,
            "points": {str(c): p for c, p in points.items()},
            "plot": plot.name,
        },
        ratios={
            **{f"rps_vs_proxy_at_{c}": p["rps_ratio_vs_proxy"] for c, p in points.items()},
            **{f"cpu_vs_proxy_at_{c}": p["cpu_ratio_vs_proxy"] for c, p in points.items()},
            **{f"rps_vs_stub_at_{c}": p["rps_ratio_vs_stub"] for c, p in points.items()},
        },
        table_header=[
            "concurrency",
            *(f"{path} req/s" for path in PATHS),
            "inferwire/proxy req/s",
            "proxy CPU µs/req (loop / grpc)",
            "inferwire CPU µs/req (loop / grpc)",
            "inferwire/proxy CPU",
            "proxy p50 ms",
            "inferwire p50 ms",
        ],
        table_rows=[_row(c, p) for c, p in points.items()],
        targets=[
            at_least(
                "Triton unary Infer vs bare Python proxy, concurrency 8: rps",
                at_target["rps_ratio_vs_proxy"],
                0.85,
            ),
            at_most(
                "Triton unary Infer vs bare Python proxy, concurrency 8: CPU per request",
                at_target["cpu_ratio_vs_proxy"],
                1.2,
                "x",
            ),
        ],
        notes=[
            "CPU per request is the gateway process's own (utime + stime from /proc), split "
            "by thread: the event loop, where grpc.aio and the handlers run, and gRPC core's "
            "threads.",
            "The client, both gateways, tritonserver and its Python backend stub share the "
            "CPUs; on a small machine every cycle a gateway spends is one Triton does not get.",
        ],
    )
