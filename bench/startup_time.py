"""Start-up: time from launching `inferwire serve` to grpc.health.v1 SERVING for "".

Baseline in the same run: time from launch until the port accepts connections, so the
model-loading share of start-up is visible.
"""

from __future__ import annotations

import statistics
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import RunOptions, ScenarioResult, Series, write_plot
from tests.support.process import start_server_process, stop_server_process

NAME = "startup_time"


def one_start() -> tuple[float, float]:
    started = time.perf_counter()
    server = start_server_process()
    try:
        listening = time.perf_counter() - started
        with grpc.insecure_channel(server.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return listening, time.perf_counter() - started
                time.sleep(0.005)
    finally:
        stop_server_process(server, graceful=True)


def run(options: RunOptions) -> ScenarioResult:
    runs = options.size(5, 1)
    starts = [one_start() for _ in range(runs)]
    listening = [first for first, _ in starts]
    serving = [second for _, second in starts]
    median_listening, median_serving = statistics.median(listening), statistics.median(serving)
    xs = [float(i + 1) for i in range(runs)]
    plot = write_plot(
        options,
        NAME,
        [
            Series("health SERVING", xs, serving),
            Series("port listening", xs, listening, baseline=True),
        ],
        xlabel="run",
        ylabel="seconds since launch",
        title=f"inferwire serve start-up, {runs} runs",
    )
    return ScenarioResult(
        name=NAME,
        title="Start-up: launch to SERVING, against launch to listening",
        baseline="time until the port listens (before any model is loaded)",
        data={
            "runs": runs,
            "listening_s": listening,
            "serving_s": serving,
            "median_listening_s": median_listening,
            "median_serving_s": median_serving,
            "plot": plot.name,
        },
        ratios={"serving_vs_listening": median_serving / median_listening},
        table_header=["run", "listening s", "SERVING s"],
        table_rows=[[str(i + 1), f"{a:.3f}", f"{b:.3f}"] for i, (a, b) in enumerate(starts)],
        targets=[],
        notes=[f"Medians: listening {median_listening:.3f} s, SERVING {median_serving:.3f} s."],
    )
