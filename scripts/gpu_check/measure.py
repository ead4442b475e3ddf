"""Measure exported models: `og.Engine` and `og.Generator` in this process against
`InferStream` through a real `inferwire serve`, and one stream against the bandwidth bound.

Every path is greedy, decodes every token to text and runs each request to `max_tokens`
(the model's EOS cannot win, scripts/gpu_check/model.py). The in-process engine is
static-batching with one row per stream, or dynamic as the model's genai_config.json says
(a paged-attention export); inferwire serves with `batching: auto`, which picks the engine
path for a dynamic model and one `og.Generator` per request otherwise
(docs/ort_genai_batching.md). CPU time: the server's by thread group, and this process's
for the direct paths (bench/cpu.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import onnxruntime_genai as og

from bench.cpu import CpuMeter
from bench.streams import (
    BatchRun,
    DirectEngine,
    StreamRun,
    compare_texts,
    gateway_batch,
    prompts_for,
    summarize,
)
from inferwire.v1 import inference_pb2_grpc
from scripts.gpu_check.model import decode_step_bytes
from scripts.gpu_check.report import write_report
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

MODEL_NAME = "gpu-check"
# A warm-up batch has every stream but only this many tokens: on the per-request path
# at 64 streams a full one would cost as much as a timed batch.
WARM_UP_TOKENS = 8


def is_dynamic(model_dir: Path) -> bool:
    config = json.loads((model_dir / "genai_config.json").read_text())
    return "dynamic_batching" in config.get("engine", {})


def og_config(model_dir: Path, device: str) -> og.Config:
    """The model's config on `device`, the way inferwire's loader sets the provider."""
    config = og.Config(str(model_dir))
    config.clear_providers()
    if device == "cuda":
        config.append_provider("cuda")
    return config


class ModelEngine(DirectEngine):
    """bench/streams.py's `DirectEngine` (same `run`) on another model folder and device."""

    def __init__(self, model_dir: Path, device: str, max_batch_size: int) -> None:
        config = og_config(model_dir, device)
        if not is_dynamic(model_dir):
            batch = {"static_batching": {"max_batch_size": max_batch_size}}
            config.overlay(json.dumps({"engine": batch}))
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)
        self.engine = og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(max(64, 4 * max_batch_size))


def generator_run(
    model: og.Model, tokenizer: og.Tokenizer, prompt: str, max_tokens: int
) -> BatchRun:
    """One request through an `og.Generator` loop, as inferwire's per-request path does."""
    started = time.perf_counter()
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    pieces: list[str] = []
    first = 0.0
    tokens = 0
    while not generator.is_done():
        generator.generate_next_token()
        pieces.append(stream.decode(int(generator.get_next_tokens()[0])))
        tokens += 1
        if not first:
            first = time.perf_counter()
    end = time.perf_counter()
    del generator
    return BatchRun(
        [StreamRun("".join(pieces), tokens, first - started, end - started)], end - started
    )


@contextlib.contextmanager
def serving(
    model_dir: Path, device: str, max_concurrency: int, extra: dict[str, Any] | None = None
) -> Iterator[ServerProcess]:
    """`inferwire serve --config` with the model, `batching: auto` and `extra` options."""
    options = {"path": str(model_dir), "device": device, "batching": "auto", **(extra or {})}
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(
            f"models:\n  - name: {MODEL_NAME}\n    load_on_startup: true\n"
            f"    max_concurrency: {max_concurrency}\n    max_queue: {4 * max_concurrency}\n"
            f"    options: {json.dumps(options)}\n"
        )
        server = start_serving_server(
            "--config", str(config), program=(sys.executable, "-m", "inferwire.cli")
        )
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


async def gateway_batches(target: str, prompts: list[list[str]], max_tokens: int) -> list[BatchRun]:
    """Each entry of `prompts` is one batch of streams started together."""
    batches = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        for batch in prompts:
            batches.append(await gateway_batch(stub, batch, max_tokens, MODEL_NAME))
    return batches


def _result(
    variant: str, path: str, streams: int, batches: Sequence[BatchRun], cpu: dict[str, float]
) -> dict[str, Any]:
    tokens = [run.tokens for batch in batches for run in batch.runs]
    return {
        "variant": variant,
        "path": path,
        "streams": streams,
        **summarize(batches),
        "tokens_per_request": [min(tokens), max(tokens)],
        "cpu_us_per_token": cpu,
    }


def measure_variant(
    variant: str, model_dir: Path, options: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The direct paths, then the gateway, at every stream count; text agreement per count."""
    results = []
    direct_texts: dict[int, list[BatchRun]] = {}
    me = os.getpid()
    dynamic = is_dynamic(model_dir)
    # A static engine is made for each batch size; a dynamic one (paged) serves them all.
    engine: ModelEngine | None = None
    for streams in options.streams:
        if engine is None or not dynamic:
            engine = None
            gc.collect()
            engine = ModelEngine(
                model_dir, options.device, max(options.streams) if dynamic else streams
            )
        batches_prompts = [prompts_for(streams, r) for r in range(options.repeats)]
        engine.run(prompts_for(streams), WARM_UP_TOKENS)  # kernels, arenas, the batch's shape
        with CpuMeter(me) as meter:
            batches = [engine.run(p, options.max_tokens) for p in batches_prompts]
        tokens = sum(b.tokens for b in batches)
        results.append(_result(variant, "og.Engine", streams, batches, meter.usage.per(tokens)))
        direct_texts[streams] = batches
        if streams == 1 and not dynamic:
            generator_batches = []
            with CpuMeter(me) as meter:
                for prompts in batches_prompts:
                    generator_batches.append(
                        generator_run(
                            engine.model, engine.tokenizer, prompts[0], options.max_tokens
                        )
                    )
            tokens = sum(b.tokens for b in generator_batches)
            results.append(
                _result(variant, "og.Generator", 1, generator_batches, meter.usage.per(tokens))
            )
    engine = None
    gc.collect()  # free the device memory before the server takes its share
    agreement = {}
    with serving(model_dir, options.device, max(options.streams), options.server_options) as server:
        for streams in options.streams:
            batches_prompts = [prompts_for(streams, r) for r in range(options.repeats)]
            asyncio.run(gateway_batches(server.target, [prompts_for(streams)], WARM_UP_TOKENS))
            with CpuMeter(server.process.pid) as meter:
                batches = asyncio.run(
                    gateway_batches(server.target, batches_prompts, options.max_tokens)
                )
            tokens = sum(b.tokens for b in batches)
            results.append(_result(variant, "inferwire", streams, batches, meter.usage.per(tokens)))
            agreement[str(streams)] = compare_texts(direct_texts[streams], batches)
    return results, agreement


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "onnxruntime_genai": og.__version__,
        "cuda_available_to_genai": og.is_cuda_available(),
        "load_average": os.getloadavg(),
    }
    if shutil.which("nvidia-smi"):
        query = "name,memory.total,driver_version"
        gpu = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        info["gpu"] = gpu.stdout.strip()
    return info


def read_timings(path: Path | None) -> dict[str, float]:
    """Lines of `NAME SECONDS` written by gpu_check.sh."""
    if path is None:
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {name: float(seconds) for name, seconds in pairs}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="an exported model to measure (repeatable)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--precision", required=True)
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="for the one-stream bound")
    parser.add_argument(
        "--timings", type=Path, help="the build steps' seconds (NAME SECONDS lines)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--smollm2", type=Path, help="scripts/gpu_check/smollm2.py's smollm2.json, to fold in"
    )
    parser.add_argument(
        "--server-options",
        type=json.loads,
        default={},
        help='more options for the served model, JSON (e.g. {"engine_process": true})',
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    bytes_per_weight = {"fp32": 4, "fp16": 2, "bf16": 2}.get(options.precision)
    step_bytes = decode_step_bytes(options.shape, bytes_per_weight) if bytes_per_weight else None
    report: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
        "machine": machine(),
        "decode_step_weight_bytes": step_bytes,
        "one_stream_bound_tokens_per_s": (
            options.bandwidth_tbs * 1e12 / step_bytes if step_bytes else None
        ),
        "timings_s": read_timings(options.timings),
        "variants": {},
        "results": [],
    }
    if options.smollm2 is not None and options.smollm2.is_file():
        report["smollm2"] = json.loads(options.smollm2.read_text())
    for spec in options.variant:
        name, _, directory = spec.partition("=")
        model_dir = Path(directory)
        started = time.perf_counter()
        results, agreement = measure_variant(name, model_dir, options)
        report["results"].extend(results)
        report["variants"][name] = {
            "dir": directory,
            "dynamic_batching": is_dynamic(model_dir),
            "onnx_bytes": sum(p.stat().st_size for p in model_dir.glob("*.onnx*")),
            "text_agreement_direct_vs_inferwire": agreement,
            "measure_s": time.perf_counter() - started,
        }
        write_report(report, options.out)  # after each variant: a later failure keeps it
    print((options.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
