"""The gRPC floor: inferwire's cheapest RPC (`ListModels`) against a bare grpc.aio unary
echo server (bench/echo_server.py), both separate processes, same grpc.aio client.

The echo server answers the same method path, so the client code is identical; it sends
the (empty) request's bytes back, which the client reads as an empty ListModelsResponse.
inferwire's answer names its model (a few dozen bytes more) and runs its interceptors
(metrics, access log), its error mapping and its servicer: that is the cost measured here.

Besides requests per second, each server's CPU time per request is read from /proc
(bench/cpu.py), split by thread group: CPU is far steadier than wall time on a shared
machine. Each concurrency runs in rounds that alternate which server goes first, so drift
in the machine's load hits both alike; the figures sum the rounds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench.baseline_servers import BaselineProcess, baseline_server
from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    closed_loop,
    latency_summary,
    ratio,
    write_plot,
)
from bench.cpu import GROUPS, CpuMeter
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import start_serving_server, stop_server_process

NAME = "grpc_floor"
CONCURRENCY = (1, 8, 32)
TARGET_CONCURRENCY = 32
METHOD = "/inferwire.v1.InferenceService/ListModels"
ECHO, INFERWIRE = "bare_echo", "inferwire_list_models"


@dataclass
class Tally:
    """One server at one concurrency, summed over the rounds."""

    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    cpu_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("total", *GROUPS), 0.0))
    round_rps: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        requests = len(self.latencies_ms)
        return {
            **latency_summary(self.wall_s, self.latencies_ms),
            "round_rps": self.round_rps,
            "cpu_us_per_request": {g: us / requests for g, us in self.cpu_us.items()},
        }


class Server:
    """A server under test: its process (for its CPU) and a channel to it."""

    def __init__(self, pid: int, target: str) -> None:
        self.pid = pid
        self.channel = grpc.aio.insecure_channel(target)
        stub = inference_pb2_grpc.InferenceServiceStub(self.channel)
        request = pb.ListModelsRequest()
        self.call = lambda: stub.ListModels(request)

    async def measure(self, requests: int, concurrency: int, tally: Tally) -> float:
        """One measured run into `tally`; its requests per second."""
        with CpuMeter(self.pid) as meter:
            wall, latencies = await closed_loop(self.call, requests, concurrency)
        tally.wall_s += wall
        tally.latencies_ms += latencies
        tally.cpu_us["total"] += meter.usage.total_us
        for group, us in meter.usage.by_group.items():
            tally.cpu_us[group] += us
        tally.round_rps.append(len(latencies) / wall)
        return tally.round_rps[-1]


async def _measure_all(
    echo: BaselineProcess, gateway_pid: int, gateway_target: str, options: RunOptions
) -> dict[int, dict[str, Tally]]:
    requests = options.size(2000, 100)
    rounds = options.size(4, 2)
    servers = {ECHO: Server(echo.pid, echo.target), INFERWIRE: Server(gateway_pid, gateway_target)}
    try:
        for server in servers.values():
            await closed_loop(server.call, options.size(500, 20), 8)  # warm up
        tallies: dict[int, dict[str, Tally]] = {}
        for concurrency in CONCURRENCY:
            tallies[concurrency] = {name: Tally() for name in servers}
            for round_ in range(rounds):
                order = (ECHO, INFERWIRE) if round_ % 2 == 0 else (INFERWIRE, ECHO)
                for name in order:
                    await closed_loop(servers[name].call, concurrency * 4, concurrency)
                    await servers[name].measure(requests, concurrency, tallies[concurrency][name])
        return tallies
    finally:
        for server in servers.values():
            await server.channel.close()


def _point(tallies: dict[str, Tally]) -> dict[str, Any]:
    echo, inferwire = tallies[ECHO].summary(), tallies[INFERWIRE].summary()
    return {
        ECHO: echo,
        INFERWIRE: inferwire,
        "rps_ratio": ratio(inferwire["rps"], echo["rps"]),
        "round_rps_ratios": [
            ratio(i, e)
            for i, e in zip(tallies[INFERWIRE].round_rps, tallies[ECHO].round_rps, strict=True)
        ],
        "cpu_per_request_ratio": ratio(
            inferwire["cpu_us_per_request"]["total"], echo["cpu_us_per_request"]["total"]
        ),
    }


def _cpu_cell(summary: dict[str, Any]) -> str:
    cpu = summary["cpu_us_per_request"]
    return f"{cpu['total']:.0f} ({cpu['event_loop']:.0f} / {cpu['total'] - cpu['event_loop']:.0f})"


def run(options: RunOptions) -> ScenarioResult:
    gateway = start_serving_server()
    try:
        with baseline_server("bench.echo_server", METHOD) as echo:
            tallies = asyncio.run(_measure_all(echo, gateway.process.pid, gateway.target, options))
    finally:
        stop_server_process(gateway, graceful=True)
    points = {c: _point(t) for c, t in tallies.items()}
    xs = [float(c) for c in CONCURRENCY]
    plot = write_plot(
        options,
        NAME,
        [
            Series("inferwire ListModels", xs, [points[c][INFERWIRE]["rps"] for c in CONCURRENCY]),
            Series(
                "bare grpc.aio echo",
                xs,
                [points[c][ECHO]["rps"] for c in CONCURRENCY],
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
            f"{p[ECHO]['rps']:,.0f}",
            f"{p[INFERWIRE]['rps']:,.0f}",
            f"{p['rps_ratio']:.3f}",
            _cpu_cell(p[ECHO]),
            _cpu_cell(p[INFERWIRE]),
            f"{p['cpu_per_request_ratio']:.2f}",
            f"{p[ECHO]['p50_ms']:.2f}",
            f"{p[INFERWIRE]['p50_ms']:.2f}",
        ]
        for c, p in points.items()
    ]
    at_target = points[TARGET_CONCURRENCY]["rps_ratio"]
    return ScenarioResult(
        name=NAME,
        title="The gRPC floor: inferwire ListModels vs a bare grpc.aio unary echo",
        baseline="a bare grpc.aio server echoing the request bytes on the same method path",
        data={
            "requests_per_round": options.size(2000, 100),
            "rounds": options.size(4, 2),
            "points": {str(c): p for c, p in points.items()},
            "plot": plot.name,
        },
        ratios={
            **{f"rps_at_{c}": p["rps_ratio"] for c, p in points.items()},
            **{f"cpu_per_request_at_{c}": p["cpu_per_request_ratio"] for c, p in points.items()},
        },
        table_header=[
            "concurrency",
            "echo req/s",
            "ListModels req/s",
            "RPS ratio",
            "echo CPU µs/req (loop / rest)",
            "ListModels CPU µs/req (loop / rest)",
            "CPU ratio",
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
        notes=[
            "CPU µs per request is each server process's, from /proc, summed over "
            "rounds that alternate which server goes first; `loop` is the event-loop "
            "(main) thread, `rest` every other thread (grpc's, the log writer, the "
            "engine's); the JSON splits it by thread group.",
        ],
    )
