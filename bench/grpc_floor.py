"""The gRPC floor: inferwire's cheapest RPC (`ListModels`) against a bare grpc.aio unary
echo server (bench/echo_server.py), both separate processes, same grpc.aio client.

The echo server answers the same method path, so the client code is identical; it sends
the (empty) request's bytes back, which the client reads as an empty ListModelsResponse.
inferwire's answer names its model (a few dozen bytes more) and runs its interceptors
(metrics, access log), its error mapping and its servicer: that is the cost measured here.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc

from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    measure_rps,
    ratio,
    write_plot,
)
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

NAME = "grpc_floor"
CONCURRENCY = (1, 8, 32)
TARGET_CONCURRENCY = 32
METHOD = "/inferwire.v1.InferenceService/ListModels"


@contextlib.contextmanager
def echo_server(method: str) -> Iterator[str]:
    """bench.echo_server in its own process; yields its target."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.echo_server", method],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _measure(target: str, concurrency: int, requests: int, warmup: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        request = pb.ListModelsRequest()

        async def call() -> None:
            await stub.ListModels(request)

        return await measure_rps(call, requests, concurrency, warmup)


def run(options: RunOptions) -> ScenarioResult:
    requests = options.size(5000, 100)
    warmup = options.size(500, 20)
    points: dict[int, dict[str, Any]] = {}
    gateway = start_serving_server()
    try:
        with echo_server(METHOD) as echo_target:
            for concurrency in CONCURRENCY:
                echo = asyncio.run(_measure(echo_target, concurrency, requests, warmup))
                inferwire = asyncio.run(_measure(gateway.target, concurrency, requests, warmup))
                points[concurrency] = {
                    "bare_echo": echo,
                    "inferwire_list_models": inferwire,
                    "rps_ratio": ratio(inferwire["rps"], echo["rps"]),
                }
    finally:
        stop_server_process(gateway, graceful=True)
    xs = [float(c) for c in CONCURRENCY]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                "inferwire ListModels",
                xs,
                [points[c]["inferwire_list_models"]["rps"] for c in CONCURRENCY],
            ),
            Series(
                "bare grpc.aio echo",
                xs,
                [points[c]["bare_echo"]["rps"] for c in CONCURRENCY],
                baseline=True,
            ),
        ],
        xlabel="concurrency",
        ylabel="requests/s",
        title="The gRPC floor: ListModels vs a bare grpc.aio echo",
        log_x=True,
    )
    rows = [
        [
            str(c),
            f"{p['bare_echo']['rps']:,.0f}",
            f"{p['inferwire_list_models']['rps']:,.0f}",
            f"{p['rps_ratio']:.3f}",
            f"{p['bare_echo']['p50_ms']:.2f}",
            f"{p['inferwire_list_models']['p50_ms']:.2f}",
        ]
        for c, p in points.items()
    ]
    at_target = points[TARGET_CONCURRENCY]["rps_ratio"]
    return ScenarioResult(
        name=NAME,
        title="The gRPC floor: inferwire ListModels vs a bare grpc.aio unary echo",
        baseline="a bare grpc.aio server echoing the request bytes on the same method path",
        data={
            "requests": requests,
            "points": {str(c): p for c, p in points.items()},
            "plot": plot.name,
        },
        ratios={f"rps_at_{c}": p["rps_ratio"] for c, p in points.items()},
        table_header=[
            "concurrency",
            "echo req/s",
            "ListModels req/s",
            "ratio",
            "echo p50 ms",
            "ListModels p50 ms",
        ],
        table_rows=rows,
        targets=[
            at_least(
                f"ListModels RPS vs bare grpc.aio echo, concurrency {TARGET_CONCURRENCY}",
                at_target,
                0.85,
            )
        ],
        notes=[],
    )
