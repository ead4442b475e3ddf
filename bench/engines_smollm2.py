"""The CPU engines on SmolLM2-135M-Instruct in one closed loop: inferwire's continuous path
on both kernels (`kernels: both`: ONNX Runtime's on the int4 import for a lone stream,
OpenVINO's on the GGUF it came from for a batch; through `inferwire serve`, over gRPC and
over HTTP)
against llama.cpp's `llama-server` on the Q4_1 GGUF the import came from (over HTTP, as
its users call it), OpenVINO GenAI's continuous-batching pipeline on the same GGUF,
driven directly (no server around it: the most a server on it could make), and
onnxruntime-genai's og.Generator on the same int4 import, driven directly
(bench/peers_og.py: ONNX Runtime's own loop over the file the continuous path steps).

The same load on both, as bench/peers_openvino.py defines it: at concurrency C, C requests
always in flight, each a 56-64-token prompt (its SENTENCES, no chat template) from a pool
taken in turn, 128 greedy tokens with EOS ignored, at least 2C+8 requests and
MIN_SECONDS; TTFT from submit to the first token. Each engine computes on CPU 0 with one
thread (inferwire: `threads: 1`, the event loop on the same core; llama-server:
`--threads 1`, 32 slots of 256 tokens; OpenVINO: INFERENCE_NUM_THREADS 1, pinned; og:
intra_op_num_threads 1, its generators stepped in turn), the load
(this process) on CPU 1; over HTTP, OpenAI's streamed /v1/completions with
`ignore_eos`. The engines take
turns, the first alternating between rounds, and each cell keeps its best round (noise
only slows a cell). CPU per output token is the engine's process's (/proc).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench import closed_loop, engines_multiturn, peers_setup
from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    at_most,
    percentile,
    ratio,
    write_plot,
)
from bench.peers_og import run_og
from bench.peers_servers import llama_server, pinned
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from scripts.smollm2 import GGUF, MODELS, REPO
from tests.support.process import INFERWIRE, start_serving_server, stop_server_process

NAME = "engines_smollm2"
CONCURRENCY = (1, 8, 32)
NEW_TOKENS = 128
SLOT_TOKENS = 256  # a prompt and its answer, as OpenVINO's --seq-tokens 224 rounds up
OPENVINO = "openvino-genai==2026.4.1.0"
OPENVINO_VENV = REPO / ".cache" / "peers" / "openvino-venv"
ENGINE_CPU, LOAD_CPU = 0, 1


def make_prompts(count: int, seed: int) -> list[str]:
    """closed_loop's prompts, counted on SmolLM2's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODELS / "smollm2" / "tokenizer.json"))
    return closed_loop.prompt_texts(count, seed, lambda text: len(tokenizer.encode(text).ids))


OneRequest = Callable[[str], Awaitable[tuple[float | None, int]]]


def grpc_request(stub: Any) -> OneRequest:
    """One streamed request over gRPC: (when its first message came, its output tokens)."""
    parameters = pb.GenerationParameters(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)

    async def one(prompt: str) -> tuple[float | None, int]:
        first, tokens = None, 0
        request = pb.InferStreamRequest(model="smollm2", prompt=prompt, parameters=parameters)
        async for message in stub.InferStream(request):
            if first is None:
                first = time.perf_counter()
            if message.HasField("usage"):
                tokens = message.usage.completion_tokens
        return first, tokens

    return one


def http_request(client: httpx.AsyncClient, url: str) -> OneRequest:
    """One request to an OpenAI /v1/completions stream: (its first token's time, tokens:
    the usage's, else one a chunk)."""

    async def one(prompt: str) -> tuple[float | None, int]:
        body = {
            "model": "smollm2", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        first, chunks, usage = None, 0, None
        async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
        return first, (usage or {}).get("completion_tokens") or chunks

    return one


async def _cell(
    one: OneRequest, pid: int, prompts: list[str], concurrency: int, min_seconds: float
) -> dict[str, Any]:
    minimum, submitted, tokens, ttfts = 2 * concurrency + 8, 0, 0, []
    start, own0 = time.perf_counter(), time.process_time()
    cpu0, busy0 = closed_loop.process_cpu_s(pid), closed_loop.machine_busy_s()

    async def worker() -> None:
        nonlocal submitted, tokens
        while submitted < minimum or time.perf_counter() - start < min_seconds:
            prompt = prompts[submitted % len(prompts)]
            submitted += 1
            sent = time.perf_counter()
            first, made = await one(prompt)
            tokens += made
            ttfts.append(((first or time.perf_counter()) - sent) * 1e3)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    duration = time.perf_counter() - start
    cpu = closed_loop.process_cpu_s(pid) - cpu0
    other = closed_loop.machine_busy_s() - busy0 - cpu - (time.process_time() - own0)
    return {
        "concurrency": concurrency,
        "requests": submitted,
        "output_tokens": tokens,
        "expected_tokens": submitted * NEW_TOKENS,
        "duration_s": round(duration, 3),
        "tokens_per_s": round(tokens / duration, 2),
        "ttft_p50_ms": round(percentile(ttfts, 0.5), 1),
        "ttft_p99_ms": round(percentile(ttfts, 0.99), 1),
        "cpu_ms_per_token": round(cpu * 1000 / tokens, 3),
        "own_cores": round(cpu / duration, 2),
        "other_cores": round(other / duration, 2),
    }


async def _drive(
    engine: str, one: OneRequest, pid: int, min_seconds: float
) -> list[dict[str, Any]]:
    prompts, warmups = make_prompts(64, seed=1), make_prompts(8, seed=2)
    cells = []
    for concurrency in CONCURRENCY:
        await _cell(one, pid, warmups, min(concurrency, 8), 0)  # warm-up
        cells.append(await _cell(one, pid, prompts, concurrency, min_seconds))
        print(json.dumps({"engine": engine, **cells[-1]}), flush=True)
    return cells


async def _drive_inferwire(
    target: str, url: str, pid: int, min_seconds: float, doors: tuple[str, ...]
) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel, _http_client() as client:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        ones = {"grpc": grpc_request(stub), "http": http_request(client, url)}
        return {
            f"inferwire_{door}": await _drive(f"inferwire_{door}", ones[door], pid, min_seconds)
            for door in doors
        }


def _http_client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    return httpx.AsyncClient(timeout=600, limits=limits)


def run_inferwire(
    min_seconds: float, kernels: str = "both", doors: tuple[str, ...] = ("grpc", "http")
) -> dict[str, list[dict[str, Any]]]:
    entry = {
        "name": "smollm2",
        "load_on_startup": True,
        "max_concurrency": max(CONCURRENCY),
        "max_queue": 4 * max(CONCURRENCY),
        "options": {
            "path": str(MODELS / "smollm2"),
            "threads": 1,
            "slot_tokens": SLOT_TOKENS,
            "stream_interval_ms": 2,
            "kernels": kernels,
        },
    }
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(json.dumps({"models": [entry]}))
        program = [*pinned([ENGINE_CPU]), str(INFERWIRE)]
        server = start_serving_server(
            "--config", str(config), "--metrics-address", "", program=program
        )
        try:
            return asyncio.run(
                _drive_inferwire(
                    server.target, server.http_url, server.process.pid, min_seconds, doors
                )
            )
        finally:
            stop_server_process(server, graceful=True)


def run_llama_server(min_seconds: float) -> list[dict[str, Any]]:
    tools = peers_setup.setup()
    with tempfile.TemporaryDirectory() as scratch:
        serving = llama_server(
            tools.llama_server,
            GGUF,
            max(CONCURRENCY),
            SLOT_TOKENS,
            1,
            Path(scratch) / "llama-server.log",
            repeat_penalty=1.0,  # the import's search block: none
            alias="smollm2",
            cpus=[ENGINE_CPU],
        )
        with serving as server:

            async def drive() -> list[dict[str, Any]]:
                async with _http_client() as client:
                    one = http_request(client, server.url)
                    return await _drive("llama_server", one, server.pid, min_seconds)

            return asyncio.run(drive())


def openvino_python() -> Path:
    python = OPENVINO_VENV / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(OPENVINO_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", OPENVINO], check=True)
    return python


def run_openvino(min_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "openvino.json"
        command = [
            *pinned([ENGINE_CPU]),
            str(openvino_python()),
            "-m", "bench.peers_openvino",
            "--gguf", str(GGUF),
            "--concurrency", *map(str, CONCURRENCY),
            "--threads", "1",
            "--new-tokens", str(NEW_TOKENS),
            "--min-seconds", str(min_seconds),
            "--seq-tokens", str(SLOT_TOKENS),
            "--retries", "0",
            "--out", str(out),
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=sys.stderr, cwd=REPO)
        return dict(json.loads(out.read_text()))


ENGINES = (
    "inferwire_grpc",
    "inferwire_http",
    "llama_server",
    "openvino",
    "og",
)
LABELS = {
    "inferwire_grpc": "inferwire, continuous path, both kernels (gRPC)",
    "inferwire_http": "inferwire, continuous path, both kernels (HTTP)",
    "llama_server": "llama-server (HTTP)",
    "openvino": "OpenVINO GenAI CB pipeline, direct",
    "og": "onnxruntime-genai og.Generator, direct",
}
# The ratio keys: each peer's name in the JSON's `ratios`.
PEER_KEYS = {"llama_server": "llama_cpp", "openvino": "openvino", "og": "og"}
DIRECT = ("openvino", "og")  # engines driven in-process, with no server around them


def _best(cells: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    same = [c for c in cells if c["concurrency"] == concurrency]
    return max(same, key=lambda c: c["tokens_per_s"])


def run(options: RunOptions) -> ScenarioResult:
    subprocess.run([sys.executable, str(REPO / "scripts" / "smollm2.py")], check=True)
    peers_setup.setup()  # llama-server built (cached) before anything is timed
    openvino_python()
    os.sched_setaffinity(0, {LOAD_CPU})
    min_seconds = 3.0 if options.quick else 20.0
    rounds = 1 if options.quick else 2
    cells: dict[str, list[dict[str, Any]]] = {engine: [] for engine in ENGINES}
    openvino_report: dict[str, Any] = {}
    turns = ("inferwire", "llama_server", "openvino", "og")
    for round_index in range(rounds):
        shift = round_index % len(turns)  # the first of a round rotates
        for engine in turns[shift:] + turns[:shift]:
            if engine == "inferwire":
                for name, made in run_inferwire(min_seconds).items():
                    cells[name] += [{**c, "round": round_index} for c in made]
            elif engine == "llama_server":
                made = run_llama_server(min_seconds)
                cells["llama_server"] += [{**c, "round": round_index} for c in made]
            elif engine == "og":
                made = run_og(MODELS / "smollm2", ENGINE_CPU, CONCURRENCY, NEW_TOKENS, min_seconds)
                cells["og"] += [{**c, "round": round_index} for c in made["cells"]]
            else:
                openvino_report = run_openvino(min_seconds)
                made = openvino_report["cells"]
                cells["openvino"] += [{**c, "round": round_index} for c in made]
    multiturn = engines_multiturn.run(rounds, ENGINE_CPU)
    return _result(options, cells, openvino_report, multiturn)


def _result(
    options: RunOptions,
    cells: dict[str, list[dict[str, Any]]],
    openvino: dict[str, Any],
    multiturn: dict[str, Any],
) -> ScenarioResult:
    ratios: dict[str, float] = {}
    rows, targets = [], []
    for c in CONCURRENCY:
        best = {engine: _best(cells[engine], c) for engine in ENGINES}
        top_peer = max(PEER_KEYS, key=lambda e: best[e]["tokens_per_s"])
        direct = min(DIRECT, key=lambda e: best[e]["ttft_p50_ms"])
        for door in ("grpc", "http"):
            ours = best[f"inferwire_{door}"]
            for peer, key in PEER_KEYS.items():
                theirs = best[peer]
                for measure in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
                    name = f"{door}_vs_{key}_{measure.removesuffix('_ms')}_at_{c}"
                    ratios[name] = ratio(ours[measure], theirs[measure])
            vs_best = ratio(ours["tokens_per_s"], best[top_peer]["tokens_per_s"])
            targets += [
                at_least(f"{door} tokens/s x the best peer's ({top_peer}) at {c}", vs_best, 0.9),
                at_least(
                    f"{door} tokens/s x llama-server's at {c}",
                    ratios[f"{door}_vs_llama_cpp_tokens_per_s_at_{c}"],
                    1.5,
                ),
                at_most(
                    f"{door} TTFT p50 x llama-server's at {c}",
                    ratios[f"{door}_vs_llama_cpp_ttft_p50_at_{c}"],
                    1.0,
                ),
                at_most(
                    f"{door} TTFT p50 x the best direct engine's ({direct}) at {c}",
                    ratios[f"{door}_vs_{PEER_KEYS[direct]}_ttft_p50_at_{c}"],
                    1.2,
                ),
            ]
        rows += [
            [
                str(c),
                LABELS[engine],
                f"{best[engine]['tokens_per_s']:.1f}",
                f"{best[engine]['ttft_p50_ms']:.0f}",
                f"{best[engine]['ttft_p99_ms']:.0f}",
                f"{best[engine]['cpu_ms_per_token']:.2f}",
                f"{best[engine]['other_cores']:.2f}",
            ]
            for engine in ENGINES
        ]
    multiturn_ratios, multiturn_targets, multiturn_rows = engines_multiturn.judged(multiturn)
    ratios.update(multiturn_ratios)
    targets += multiturn_targets
    rows += multiturn_rows
    xs = [float(c) for c in CONCURRENCY]
    series = [
        Series(
            LABELS[engine],
            xs,
            [_best(cells[engine], c)["tokens_per_s"] for c in CONCURRENCY],
            baseline=not engine.startswith("inferwire"),
        )
        for engine in ENGINES
    ]
    plot = write_plot(
        options,
        NAME,
        series,
        xlabel="concurrent requests",
        ylabel="output tokens/s",
        title="SmolLM2-135M on one CPU core",
        log_x=True,
    )
    machine = openvino.get("machine", {})
    notes = [
        f"CPU {machine.get('model_name', '?')}, flags {' '.join(machine.get('flags', []))}; "
        "each engine on CPU 0 with one compute thread, the load (this process) on CPU 1.",
        "Kernels: inferwire, for a lone stream ONNX Runtime's MatMulNBits (int4 weights, "
        "int8 compute where the CPU has it) and GroupQueryAttention, for a batch OpenVINO's "
        "paged model of the GGUF (u4 weights, f32 compute and KV cache); llama.cpp, its "
        "Q4_1 kernels for this CPU (ggml's CPU backend, built with -march=native); OpenVINO: "
        f"{json.dumps(openvino.get('kernels', {}).get('primitives', {}))}",
        "og: onnxruntime-genai's og.Generator on the same ONNX file, driven directly; a "
        "generator cannot share a step, so its streams take turns (its one-stream rate at "
        "every concurrency, and TTFT waiting for the others' steps).",
        "A cell is its best of the rounds (tokens/s); every round's cells are in the JSON.",
        f"Plot: {plot.name}",
    ]
    return ScenarioResult(
        name=NAME,
        title="CPU engines on SmolLM2-135M, closed loop (about 60 tokens in, 128 out, greedy)",
        baseline="llama-server on the same GGUF, OpenVINO GenAI's continuous-batching "
        "pipeline on it and onnxruntime-genai's og.Generator on the int4 import, both driven "
        "directly",
        data={"cells": cells, "openvino_report": openvino, "multiturn": multiturn},
        ratios=ratios,
        table_header=[
            "concurrency",
            "engine",
            "tokens/s",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "CPU ms / token",
            "others' cores",
        ],
        table_rows=rows,
        targets=targets,
        notes=notes,
    )
