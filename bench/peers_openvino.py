"""OpenVINO GenAI as a peer engine, driven directly (no server), on a GGUF file.

Builds `openvino_genai.ContinuousBatchingPipeline` on the CPU from the GGUF (OpenVINO GenAI
reads GGUF itself; Q4_1 weights stay u4), prefix caching on, KV cache blocks for the largest
concurrency at --seq-tokens each, --threads compute threads (one stream, pinned). Per
concurrency C, a closed loop: C requests always in flight, each 56-64 prompt tokens (ids, no
chat template) from --prompt-pool distinct prompts taken in turn across all cells, then
--new-tokens greedy tokens with EOS ignored; a warm-up on other prompts, then at least
2*C+8 requests and --min-seconds of submitting. A cell reports output tokens/s (first submit
to last finish), TTFT p50/p99 (add_request to the step after which its first token reads),
this process's CPU ms per output token (/proc/self/stat utime+stime, all threads), and what
the rest of the machine used meanwhile (/proc/stat); before each cell it waits (bounded) for
the others to go quiet, and reruns a cell they disturbed (--retries). --llm-single adds plain
`LLMPipeline` on one stream, both attention backends. Also reported: the CPU's ISA flags,
OpenVINO's CPU properties, and the kernels the CPU plugin picks for this model (the IR the
GGUF converts to, compiled stateful: the CB pipeline does not expose its compiled model).

Runs in its own venv (`pip install openvino-genai`), from the repository root, and never
imports inferwire (bench/closed_loop.py is standard library only):

    taskset -c 1 .cache/peers/openvino-venv/bin/python -m bench.peers_openvino \\
        --gguf .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --concurrency 1 8 32 --threads 1 --repeat 2 --llm-single --out FILE.json
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ov_genai

from bench import closed_loop

FLAGS = re.compile(r"avx2|avx512f|avx512_(bf16|vnni)|avx_vnni|amx_\w+")  # amx_*: whichever exist
KV_BLOCK_TOKENS = 32  # the CPU plugin's paged-attention block size
REQUEST_IDS = itertools.count()


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    info = dict(line.split(":", 1) for line in lscpu if ":" in line)
    flags = info.get("Flags", "").split()
    return {
        "model_name": info.get("Model name", "").strip(),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "flags": [flag for flag in flags if FLAGS.fullmatch(flag)],
        "amx": any(flag.startswith("amx") for flag in flags),
    }


def make_prompts(tokenizer: ov_genai.Tokenizer, count: int, seed: int) -> list[np.ndarray]:
    """closed_loop's prompts, as this tokenizer's ids."""

    def ids(text: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(text).input_ids.data[0], dtype=np.int64)

    texts = closed_loop.prompt_texts(count, seed, lambda text: len(ids(text)))
    return [ids(text).reshape(1, -1) for text in texts]


def greedy(new_tokens: int) -> ov_genai.GenerationConfig:
    return ov_genai.GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, ignore_eos=True, do_sample=False
    )


def run_cell(pipe, prompts, next_prompt, concurrency, new_tokens, min_seconds) -> tuple[dict, int]:
    """The closed loop at one concurrency; returns the cell and the next prompt index."""
    config, minimum = greedy(new_tokens), 2 * concurrency + 8
    active, ttfts, tokens, submitted, steps = {}, [], 0, 0, 0
    cpu0, busy0, start = (
        closed_loop.process_cpu_s(),
        closed_loop.machine_busy_s(),
        time.perf_counter(),
    )

    def submit() -> None:
        nonlocal submitted, next_prompt
        ids = prompts[next_prompt % len(prompts)]
        handle = pipe.add_request(next(REQUEST_IDS), ov.Tensor(ids), config)
        active[handle] = [time.perf_counter(), None]  # submitted at, first token at
        submitted, next_prompt = submitted + 1, next_prompt + 1

    for _ in range(concurrency):
        submit()
    while active:
        pipe.step()
        steps, now = steps + 1, time.perf_counter()
        for handle in list(active):
            done = handle.get_status() != ov_genai.GenerationStatus.RUNNING
            if handle.can_read():
                tokens += sum(len(out.generated_ids) for out in handle.read().values())
                if active[handle][1] is None:
                    active[handle][1] = now
                    ttfts.append(now - active[handle][0])
            if done:
                del active[handle]
                if submitted < minimum or now - start < min_seconds:
                    submit()
    duration = time.perf_counter() - start
    cpu = closed_loop.process_cpu_s() - cpu0
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
        "max_cache_usage_pct": round(pipe.get_metrics().max_cache_usage, 1),
    }, next_prompt


def kernels(gguf: Path, props: dict) -> dict:
    """The CPU plugin's choices for the IR the GGUF converts to, after a prefill and a decode."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / gguf.name).symlink_to(gguf.resolve())
        ov_genai.LLMPipeline(
            str(Path(folder) / gguf.name),
            "CPU",
            enable_save_ov_model=True,
            ATTENTION_BACKEND="SDPA",
        )
        compiled = ov.Core().compile_model(str(Path(folder) / "openvino_model.xml"), "CPU", props)
    request, ids = compiled.create_infer_request(), np.arange(1, 9, dtype=np.int64)[None]
    for past, step in ((0, ids), (8, ids[:, :1])):  # a prefill of 8 tokens, then a decode
        positions = np.arange(past, past + step.shape[1])[None]
        mask = np.ones((1, past + step.shape[1]), np.int64)
        feed = {"input_ids": step, "attention_mask": mask, "position_ids": positions}
        request.infer({**feed, "beam_idx": np.zeros(1, dtype=np.int32)})
    chosen = collections.Counter()
    for op in compiled.get_runtime_model().get_ops():
        rt = op.get_rt_info()
        kind = rt["layerType"].astype(str)
        if kind in ("FullyConnected", "MatMul", "ScaledDotProductAttention", "RMS", "RoPE"):
            primitive, precision = rt["primitiveType"].astype(str), rt["runtimePrecision"]
            chosen[f"{kind} {primitive} {precision.astype(str)}"] += 1
    names = set(compiled.get_property("SUPPORTED_PROPERTIES")) - {"SUPPORTED_PROPERTIES"}
    compiled_properties = {name: str(compiled.get_property(name)) for name in sorted(names)}
    return {"compiled": compiled_properties, "primitives": dict(chosen.most_common())}


def llm_single(gguf: Path, props: dict, prompt: np.ndarray, new_tokens: int, reps: int) -> dict:
    """Plain LLMPipeline, one stream, per attention backend: tokens/s over each whole call."""
    results = {}
    for backend in ("SDPA", "PA"):
        pipe = ov_genai.LLMPipeline(str(gguf), "CPU", ATTENTION_BACKEND=backend, **props)
        pipe.generate(ov.Tensor(prompt), greedy(16))  # warm-up
        results[backend] = []
        for _ in range(reps):
            cpu0, busy0, t0 = (
                closed_loop.process_cpu_s(),
                closed_loop.machine_busy_s(),
                time.perf_counter(),
            )
            out = pipe.generate(ov.Tensor(prompt), greedy(new_tokens))
            wall, cpu, tokens = (
                time.perf_counter() - t0,
                closed_loop.process_cpu_s() - cpu0,
                len(out.tokens[0]),
            )
            results[backend].append(
                {
                    "tokens": tokens,
                    "tokens_per_s": round(tokens / wall, 2),
                    "ttft_ms": round(out.perf_metrics.get_ttft().mean, 1),
                    "tpot_ms": round(out.perf_metrics.get_tpot().mean, 2),
                    "cpu_ms_per_token": round(cpu * 1000 / tokens, 3),
                    "other_cores": round((closed_loop.machine_busy_s() - busy0 - cpu) / wall, 2),
                }
            )
        del pipe
    return results


def wait_for_quiet(max_other: float, max_wait_s: float) -> dict:
    """Wait (bounded) until the rest of the machine uses under `max_other` cores over 3 s."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy0, t0 = closed_loop.machine_busy_s(), time.perf_counter()
        time.sleep(3)
        other = (closed_loop.machine_busy_s() - busy0) / (time.perf_counter() - t0)
        if other < max_other or time.monotonic() > deadline:
            loadavg = [round(x, 2) for x in os.getloadavg()]
            return {"loadavg": loadavg, "other_cores": round(other, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--min-seconds", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the concurrency list")
    parser.add_argument("--prompt-pool", type=int, default=64, help="prompts, used in turn")
    parser.add_argument("--seq-tokens", type=int, default=224, help="KV cache room per sequence")
    parser.add_argument("--max-other", type=float, default=0.3, help="cores others may use")
    parser.add_argument("--max-wait", type=float, default=120.0, help="seconds, per wait")
    parser.add_argument("--retries", type=int, default=2, help="reruns of a disturbed cell")
    parser.add_argument("--llm-single", action="store_true", help="also LLMPipeline, one stream")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    props = {"INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    props.update(ENABLE_HYPER_THREADING=False, ENABLE_CPU_PINNING=True)
    core, plugin_names = ov.Core(), ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES")
    plugin = {name: str(core.get_property("CPU", name)) for name in plugin_names}
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = True
    scheduler.max_num_seqs = max(args.concurrency)
    scheduler.num_kv_blocks = max(args.concurrency) * math.ceil(args.seq_tokens / KV_BLOCK_TOKENS)
    t0 = time.perf_counter()
    pipe = ov_genai.ContinuousBatchingPipeline(str(args.gguf), scheduler, "CPU", props, props)
    load_s = time.perf_counter() - t0
    prompts = make_prompts(pipe.get_tokenizer(), args.prompt_pool, seed=1)
    warmups = make_prompts(pipe.get_tokenizer(), 8, seed=2)
    report = {
        "engine": "openvino_genai.ContinuousBatchingPipeline",
        "versions": {"python": sys.version.split()[0], "openvino": ov.get_version()},
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "properties": props,
        "cpu_plugin": plugin,
        "scheduler": scheduler.to_string(),
        "pipeline_load_s": round(load_s, 2),
        "prompt_tokens": sorted({p.shape[1] for p in prompts}),
        "threads_in_process": len(os.listdir("/proc/self/task")),
        "cells": [],
    }
    report["versions"]["openvino_genai"] = ov_genai.get_version()
    print(json.dumps({k: v for k, v in report.items() if k != "cells"}, indent=1), flush=True)
    next_prompt = 0
    for round_index, concurrency in itertools.product(range(args.repeat), args.concurrency):
        for attempt in range(args.retries + 1):
            before = wait_for_quiet(args.max_other, args.max_wait)
            run_cell(pipe, warmups, 0, min(concurrency, 8), 16, 0)  # warm-up
            cell, next_prompt = run_cell(
                pipe, prompts, next_prompt, concurrency, args.new_tokens, args.min_seconds
            )
            cell.update(round=round_index, attempt=attempt, before=before)
            report["cells"].append(cell)
            print(json.dumps(cell), flush=True)
            if cell["other_cores"] < args.max_other:
                break
    report["kv_cache_bytes"] = pipe.get_metrics().cache_size_in_bytes
    del pipe
    report["kernels"] = kernels(args.gguf, props)
    print(json.dumps(report["kernels"], indent=1), flush=True)
    if args.llm_single:
        report["llm_single_before"] = wait_for_quiet(args.max_other, args.max_wait)
        single = llm_single(args.gguf, props, prompts[0], args.new_tokens, reps=3)
        report["llm_pipeline_single"] = single
        print(json.dumps(single, indent=1))
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
