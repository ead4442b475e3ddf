"""Time from launching `inferwire serve` to grpc.health.v1 SERVING for "".

Baseline in the same run: time from launch until the port accepts connections,
so the model-loading share of start-up is visible. Writes
bench/results/startup_time.json and .png.
"""

from __future__ import annotations

import statistics
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import write_boxplot, write_results
from tests.support.process import start_server_process, stop_server_process

RUNS = 5


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


def main() -> None:
    runs = [one_start() for _ in range(RUNS)]
    results = {
        "runs": RUNS,
        "listening_s": [listening for listening, _ in runs],
        "serving_s": [serving for _, serving in runs],
        "median_listening_s": statistics.median(listening for listening, _ in runs),
        "median_serving_s": statistics.median(serving for _, serving in runs),
    }
    path = write_results("startup_time", results)
    write_boxplot(
        "startup_time",
        {"port listening": results["listening_s"], "health SERVING": results["serving_s"]},
        ylabel="seconds since launch",
        title=f"inferwire serve start-up, {RUNS} runs",
    )
    print(
        f"listening after {results['median_listening_s']:.2f} s, SERVING after "
        f"{results['median_serving_s']:.2f} s (medians); wrote {path}"
    )


if __name__ == "__main__":
    main()
