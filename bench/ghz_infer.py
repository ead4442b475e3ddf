"""A non-Python load generator: `ghz` against inferwire's `Infer` (server reflection) and,
as the baseline, against Triton's own `ModelInfer` (a protoset built from tritonclient's
descriptors), same model and server, same ghz settings, at concurrency 1, 8 and 32.

Why this baseline: with a Go client the load generator costs little CPU and no Python, so
the ratio shows what the gateway adds in front of Triton without the Python client's own
cost folded into both sides (as in triton_overhead). ghz against a bare echo would only
repeat grpc_floor.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

from bench.common import RunOptions, ScenarioResult, Series, ratio, write_plot
from bench.triton_setup import MAX_TOKENS, MODEL, PROMPT, triton_and_gateway

NAME = "ghz_infer"
CONCURRENCY = (1, 8, 32)
GHZ = Path(__file__).resolve().parents[1] / ".tools" / "bin" / "ghz"


class GhzMissingError(RuntimeError):
    """ghz is not installed (scripts/install_tools.sh)."""


def ghz_path() -> Path:
    found = GHZ if GHZ.is_file() else (Path(p) if (p := shutil.which("ghz")) else None)
    if found is None:
        raise GhzMissingError("ghz is not installed: run scripts/install_tools.sh")
    return found


def write_triton_protoset(path: Path) -> None:
    """Triton's GRPCInferenceService and its dependencies as a FileDescriptorSet."""
    files = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file_descriptor: Any) -> None:
        if file_descriptor.name in seen:
            return
        seen.add(file_descriptor.name)
        for dependency in file_descriptor.dependencies:
            add(dependency)
        file_descriptor.CopyToProto(files.file.add())

    add(service_pb2.DESCRIPTOR)
    path.write_bytes(files.SerializeToString())


def triton_request_json() -> str:
    return json.dumps(
        {
            "model_name": MODEL,
            "inputs": [
                {
                    "name": "text_input",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "contents": {"bytes_contents": [base64.b64encode(PROMPT.encode()).decode()]},
                },
                {
                    "name": "max_tokens",
                    "datatype": "INT32",
                    "shape": [1, 1],
                    "contents": {"int_contents": [MAX_TOKENS]},
                },
                {
                    "name": "exclude_input_in_output",
                    "datatype": "BOOL",
                    "shape": [1, 1],
                    "contents": {"bool_contents": [True]},
                },
            ],
        }
    )


def run_ghz(args: list[str], target: str, concurrency: int, requests: int) -> dict[str, Any]:
    """One ghz run; its summary. Any non-OK response fails the scenario."""
    completed = subprocess.run(
        [
            str(ghz_path()),
            "--insecure",
            "--format=json",
            f"--concurrency={concurrency}",
            f"--total={requests}",
            f"--skipFirst={min(requests // 10, 200)}",
            *args,
            target,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"ghz failed: {completed.stderr or completed.stdout}")
    report = json.loads(completed.stdout)
    codes = report.get("statusCodeDistribution", {})
    if set(codes) != {"OK"}:
        raise RuntimeError(f"ghz saw failures: {codes} {report.get('errorDistribution')}")
    percentiles = {d["percentage"]: d["latency"] / 1e6 for d in report["latencyDistribution"]}
    return {
        "requests": report["count"],
        "rps": report["rps"],
        "p50_ms": percentiles.get(50, 0.0),
        "p99_ms": percentiles.get(99, 0.0),
        "mean_ms": report["average"] / 1e6,
    }


def run(options: RunOptions) -> ScenarioResult:
    requests = options.size(4000, 100)
    points: dict[int, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory() as scratch,
        triton_and_gateway(max_concurrency=max(CONCURRENCY)) as pair,
    ):
        protoset = Path(scratch) / "triton.protoset"
        write_triton_protoset(protoset)
        direct_args = [
            f"--protoset={protoset}",
            "--call=inference.GRPCInferenceService.ModelInfer",
            f"--data={triton_request_json()}",
        ]
        gateway_args = [
            "--call=inferwire.v1.InferenceService.Infer",
            "--data="
            + json.dumps(
                {"model": MODEL, "prompt": PROMPT, "parameters": {"max_tokens": MAX_TOKENS}}
            ),
        ]
        for concurrency in CONCURRENCY:
            direct = run_ghz(direct_args, pair.triton.url, concurrency, requests)
            gateway = run_ghz(gateway_args, pair.gateway.target, concurrency, requests)
            points[concurrency] = {
                "ghz_to_triton": direct,
                "ghz_through_inferwire": gateway,
                "rps_ratio": ratio(gateway["rps"], direct["rps"]),
            }
    xs = [float(c) for c in CONCURRENCY]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                "ghz -> inferwire Infer -> Triton",
                xs,
                [points[c]["ghz_through_inferwire"]["rps"] for c in CONCURRENCY],
            ),
            Series(
                "ghz -> Triton ModelInfer",
                xs,
                [points[c]["ghz_to_triton"]["rps"] for c in CONCURRENCY],
                baseline=True,
            ),
        ],
        xlabel="concurrency",
        ylabel="requests/s",
        title=f"ghz, unary Infer on Triton ({MODEL})",
        log_x=True,
    )
    rows = [
        [
            str(c),
            f"{p['ghz_to_triton']['rps']:,.0f}",
            f"{p['ghz_through_inferwire']['rps']:,.0f}",
            f"{p['rps_ratio']:.3f}",
            f"{p['ghz_to_triton']['p50_ms']:.2f}",
            f"{p['ghz_through_inferwire']['p50_ms']:.2f}",
        ]
        for c, p in points.items()
    ]
    return ScenarioResult(
        name=NAME,
        title="ghz: unary Infer through inferwire vs ModelInfer straight to Triton",
        baseline="ghz against Triton's ModelInfer, same model, server and settings",
        data={
            "model": MODEL,
            "requests": requests,
            "points": {str(c): p for c, p in points.items()},
            "plot": plot.name,
        },
        ratios={f"rps_at_{c}": p["rps_ratio"] for c, p in points.items()},
        table_header=[
            "concurrency",
            "Triton req/s",
            "inferwire req/s",
            "ratio",
            "Triton p50 ms",
            "inferwire p50 ms",
        ],
        table_rows=rows,
        targets=[],
        notes=["ghz connects once (--connections=1) and sends every request on that channel."],
    )
