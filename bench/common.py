"""Shared benchmark plumbing: start a real `inferwire serve`, write results and plots."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
INFERWIRE = Path(sys.executable).with_name("inferwire")


def start_server(*args: str) -> tuple[subprocess.Popen[str], int, float]:
    """Start `inferwire serve` on a free port; return (process, port, start time)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(INFERWIRE), "serve", "--address", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    port: list[int] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if '"listening"' in line and not port:
                port.append(json.loads(line)["port"])
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(60):
        process.kill()
        raise RuntimeError("inferwire serve did not start")
    return process, port[0], started


def wait_serving(port: int, timeout_s: float = 60) -> None:
    """Block until grpc.health.v1 reports the whole server SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.01)
    raise RuntimeError("server never became SERVING")


def stop_server(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def write_boxplot(name: str, series: dict[str, list[float]], ylabel: str, title: str) -> Path:
    """Box plot of each named series side by side, saved as bench/results/<name>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot(list(series.values()), tick_labels=list(series))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_results(name: str, results: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")
    return path
