"""onnxruntime-genai's `og.Generator` as a peer engine, driven directly (no server), on
inferwire's int4 import of SmolLM2: what ONNX Runtime's own generation loop makes of the
same ONNX file that inferwire's continuous path steps.

The closed loop of bench/peers_openvino.py: at concurrency C, C requests always in flight,
each a 56-64-token prompt (token ids, no chat template) from a pool taken in turn, then
--new-tokens greedy tokens with EOS ignored (min_length = max_length); at least 2*C+8
requests and --min-seconds of submitting. An og.Generator cannot share a step with
another, so the C generators are stepped in turn, one token each (what a server on
og.Generator alone does with C streams on one thread). TTFT: from submit to its first
token, which waits for the steps of the others ahead of it. --threads sets ONNX Runtime's
intra-op threads (the session's `intra_op_num_threads`); run it pinned (taskset).

Never imports inferwire:

    taskset -c 0 .venv/bin/python -m bench.peers_og --model .cache/models/smollm2 \\
        --concurrency 1 8 32 --threads 1 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from bench import closed_loop


def make_prompts(tokenizer: og.Tokenizer, count: int, seed: int) -> list[np.ndarray]:
    """closed_loop's prompts, as this tokenizer's ids."""
    texts = closed_loop.prompt_texts(count, seed, lambda text: len(tokenizer.encode(text)))
    return [np.asarray(tokenizer.encode(text), dtype=np.int32) for text in texts]


def load(model_dir: Path, threads: int) -> og.Model:
    config = og.Config(str(model_dir))
    config.clear_providers()
    options = {"session_options": {"intra_op_num_threads": threads}}
    config.overlay(json.dumps({"model": {"decoder": options}}))
    return og.Model(config)


class Stream:
    """One request: its generator, when it was submitted and when its first token came."""

    def __init__(self, model: og.Model, prompt: np.ndarray, new_tokens: int) -> None:
        self.submitted, self.first = time.perf_counter(), 0.0
        params = og.GeneratorParams(model)
        length = len(prompt) + new_tokens
        params.set_search_options(do_sample=False, max_length=length, min_length=length)
        self.generator = og.Generator(model, params)
        self.generator.append_tokens(prompt)
        self.tokens = 0


def run_cell(
    model: og.Model,
    prompts: list[np.ndarray],
    next_prompt: int,
    concurrency: int,
    new_tokens: int,
    min_seconds: float,
) -> tuple[dict[str, Any], int]:
    """The closed loop at one concurrency; returns the cell and the next prompt index."""
    minimum, ttfts, tokens, submitted, steps = 2 * concurrency + 8, [], 0, 0, 0
    cpu0, busy0, start = (
        closed_loop.process_cpu_s(),
        closed_loop.machine_busy_s(),
        time.perf_counter(),
    )
    active: deque[Stream] = deque()

    def submit() -> None:
        nonlocal submitted, next_prompt
        active.append(Stream(model, prompts[next_prompt % len(prompts)], new_tokens))
        submitted, next_prompt = submitted + 1, next_prompt + 1

    for _ in range(concurrency):
        submit()
    while active:
        stream = active.popleft()
        stream.generator.generate_next_token()
        stream.tokens, tokens, steps = stream.tokens + 1, tokens + 1, steps + 1
        now = time.perf_counter()
        if stream.tokens == 1:
            ttfts.append(now - stream.submitted)
        if stream.generator.is_done() or stream.tokens >= new_tokens:
            del stream
            if submitted < minimum or now - start < min_seconds:
                submit()
        else:
            active.append(stream)
    duration, cpu = time.perf_counter() - start, closed_loop.process_cpu_s() - cpu0
    other = closed_loop.machine_busy_s() - busy0 - cpu
    ttft_ms = np.asarray(ttfts) * 1000
    return {
        "concurrency": concurrency,
        "requests": submitted,
        "output_tokens": tokens,
        "expected_tokens": submitted * new_tokens,
        "duration_s": round(duration, 3),
        "tokens_per_s": round(tokens / duration, 2),
        "ttft_p50_ms": round(float(np.percentile(ttft_ms, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft_ms, 99)), 1),
        "cpu_ms_per_token": round(cpu * 1000 / tokens, 3),
        "own_cores": round(cpu / duration, 2),
        "other_cores": round(other / duration, 2),
        "steps": steps,
    }, next_prompt


def run_og(
    model_dir: Path, cpu: int, concurrency: tuple[int, ...], new_tokens: int, min_seconds: float
) -> dict[str, Any]:
    """This driver in a process of its own on CPU `cpu` with one thread; its report."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "og.json"
        command = [
            "taskset", "-c", str(cpu), sys.executable, "-m", "bench.peers_og",
            "--model", str(model_dir),
            "--concurrency", *map(str, concurrency),
            "--threads", "1",
            "--new-tokens", str(new_tokens),
            "--min-seconds", str(min_seconds),
            "--out", str(out),
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=sys.stderr, cwd=Path(__file__).parents[1])
        return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--min-seconds", type=float, default=20.0)
    parser.add_argument("--prompt-pool", type=int, default=64, help="prompts, used in turn")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    t0 = time.perf_counter()
    model = load(args.model, args.threads)
    tokenizer = og.Tokenizer(model)
    report: dict[str, Any] = {
        "engine": "onnxruntime_genai.Generator",
        "versions": {"python": sys.version.split()[0], "onnxruntime_genai": og.__version__},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "affinity": sorted(os.sched_getaffinity(0)),
        "model_load_s": round(time.perf_counter() - t0, 2),
        "cells": [],
    }
    prompts = make_prompts(tokenizer, args.prompt_pool, seed=1)
    warmups = make_prompts(tokenizer, 8, seed=2)
    next_prompt = 0
    for concurrency in args.concurrency:
        run_cell(model, warmups, 0, min(concurrency, 4), 16, 0)  # warm-up
        cell, next_prompt = run_cell(
            model, prompts, next_prompt, concurrency, args.new_tokens, args.min_seconds
        )
        report["cells"].append(cell)
        print(json.dumps(cell), flush=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
