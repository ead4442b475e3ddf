"""inferwire against the server a user would pick instead, measured by the field's own
load tool: llama.cpp's `llama-server` on the same weights (the committed GGUF, made from
the bundled model by scripts/demo_gguf.py), and NVIDIA's aiperf over the OpenAI HTTP API.

- Setup (bench/peers_setup.py, cached under .cache/peers/): llama-server built from the
  llama-cpp-python sdist's llama.cpp, aiperf in its own venv, the GGUF's sha256.
- Checks (bench/peers_checks.py): both servers tokenize a corpus sample to the same ids;
  the same greedy prompts give the same first tokens.
- Load: aiperf against the servers' `/v1/completions` and `/v1/chat/completions`,
  streaming, greedy, INPUT_TOKENS in and OUTPUT_TOKENS out (`ignore_eos`; each request's
  usage is checked to be the full length), at concurrency 1, 8 and 32; every server has
  32 slots (llama-server `--parallel 32`, inferwire `max_concurrency: 32`) of SLOT_TOKENS
  at every level. inferwire runs twice: on the same GGUF with its llama-cpp backend
  (`inferwire`, what a CPU deployment runs), and as `inferwire serve` runs the model's ONNX
  Runtime GenAI folder (`inferwire_ort`: `batching: auto`, the continuous path on a CPU
  model). The servers take turns, the first of each cell rotating, so drift on a shared
  machine falls on all.
- Cores: the servers run on one half of the CPUs, aiperf, ghz and this process on the
  other (`taskset`), and the servers' compute threads are that half's CPUs, so that the
  ratio compares the servers and not how the scheduler mixed them with the load tool.
- Multi-turn (bench/peers_multiturn.py): conversations whose every turn carries the whole
  history, the time to first token of each turn, on every server.
- CPU from /proc over aiperf's profiling window (bench/peers_aiperf.py): each server's
  per output token (inferwire's by thread group), aiperf's own (it shares the cores), and
  what the rest of the machine used meanwhile.
- gRPC: ghz on inferwire's `InferStream` with the same prompt length, output length and
  concurrency (aiperf speaks HTTP only), so the table shows HTTP next to gRPC on the same
  server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import peers_multiturn, peers_report
from bench.common import RunOptions, ScenarioResult
from bench.peers_aiperf import CpuSampler, aiperf_command, parse_run, summarize_runs
from bench.peers_checks import corpus_sample, greedy_check, tokenization_check
from bench.peers_servers import (
    exact_prompt,
    ghz_stream,
    inferwire,
    inferwire_llama,
    llama_server,
    pinned,
    split_cores,
)
from bench.peers_setup import CACHE, setup, sha256_of
from inferwire.backends.ort_genai import builtin_model_path

NAME = "peers"
CONCURRENCY = (1, 8, 32)
ENDPOINTS = ("completions", "chat")
# inferwire on the GGUF with its llama-cpp backend, inferwire as `inferwire serve` runs the
# ONNX Runtime GenAI folder (batching: auto, the continuous path on a CPU model), and
# llama-server. (`batching: engine`, og.Engine's static batches, made 0.78-1.38x the
# per-request path's tokens/s with TTFT p99 up to 48 s: the performance notebook.)
SERVERS = ("inferwire", "inferwire_ort", "llama_cpp")
INPUT_TOKENS = 64
OUTPUT_TOKENS = 128
# Per slot: room for the multi-turn conversations' whole history (under 900 tokens).
SLOT_TOKENS = 1024
SLOTS = max(CONCURRENCY)


@dataclass(frozen=True)
class PeerModel:
    """The weights both servers run: inferwire's model directory, llama.cpp's GGUF."""

    name: str  # what both servers serve it as
    ort_path: Path  # inferwire's (ONNX Runtime GenAI) model directory; its tokenizer too
    config_path: str  # `options.path` in inferwire's configuration
    gguf: Path
    repeat_penalty: float  # genai_config.json's, which llama-server is given too
    description: str  # for the plot's title
    # Requests per cell at each concurrency, and rounds: a 135M model's token costs ~20x
    # the demo's, so its run is smaller to stay near the demo run's length (~10 minutes).
    requests: tuple[tuple[int, int], ...] = ((1, 24), (8, 64), (32, 128))
    rounds: int = 1
    # Multi-turn rounds, each with conversations of its own, the servers in a rotated
    # order: on the demo model a turn's first token takes 15-150 ms, and one round of 16
    # later turns moved inferwire's p50 from 0.6x to 1.1x llama-server's between runs.
    multiturn_rounds: int = 1


def demo_model(gguf: Path) -> PeerModel:
    return PeerModel(
        "demo",
        builtin_model_path(),
        "builtin",
        gguf,
        1.2,
        "bundled demo model; llama.cpp: its Q8_0 GGUF",
        multiturn_rounds=4,
    )


def _requests(model: PeerModel, concurrency: int, quick: bool) -> int:
    if quick:
        return max(2, concurrency)
    return dict(model.requests)[concurrency]


def _machine_busy_us() -> float:
    """Every CPU's busy time so far (/proc/stat), µs."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) * 1e6 / os.sysconf("SC_CLK_TCK")


def _accounting(
    sampler: CpuSampler, server: str, tool: str, start_ns: int, end_ns: int, load: float
) -> dict[str, Any]:
    """The CPU of one measured window: the server's by group, the load tool's, and the
    share of the machine that neither they, the idle peer nor this process used."""
    server_cpu = sampler.between(server, start_ns, end_ns)
    tool_cpu = sampler.between(tool, start_ns, end_ns).get("total", 0.0)
    ours = server_cpu.get("total", 0.0) + tool_cpu
    for name in (*SERVERS, "bench"):
        if name != server:
            ours += sampler.between(name, start_ns, end_ns).get("total", 0.0)
    busy = sampler.between("machine", start_ns, end_ns).get("total", 0.0)
    # /proc/stat's busy time is every CPU's; this process is pinned to the load tool's
    # half by now, so its affinity would count half the machine.
    wall_us = (end_ns - start_ns) / 1e3 * (os.cpu_count() or 1)
    return {
        "server_cpu_us": server_cpu,
        "tool_cpu_us": tool_cpu,
        "load_before": load,
        "other_cpu_share": max(0.0, busy - ours) / wall_us if wall_us else 0.0,
    }


def _aiperf_cell(
    sampler: CpuSampler,
    aiperf: Path,
    url: str,
    server: str,
    endpoint: str,
    concurrency: int,
    requests: int,
    scratch: Path,
    tag: str,
    model: PeerModel,
    cpus: list[int],
) -> dict[str, Any]:
    artifacts = scratch / tag
    command = pinned(cpus) + aiperf_command(
        aiperf, url, endpoint, concurrency, requests, INPUT_TOKENS, OUTPUT_TOKENS,
        model.ort_path, artifacts, model=model.name,
    )  # fmt: skip
    load = os.getloadavg()[0]
    with (scratch / f"{tag}.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        sampler.add_tree(tag, process.pid)
        code = process.wait(timeout=900)
    sampler.sample_now()
    if code != 0:
        raise RuntimeError(f"aiperf exited {code}: {(scratch / f'{tag}.log').read_text()[-3000:]}")
    run = parse_run(artifacts)
    return {"run": run, **_accounting(sampler, server, tag, run.start_ns, run.end_ns, load)}


def _ghz_cell(
    sampler: CpuSampler,
    target: str,
    prompt: str,
    concurrency: int,
    calls: int,
    tag: str,
    model: str,
    cpus: list[int],
) -> dict[str, Any]:
    load = os.getloadavg()[0]
    ghz_stream(target, prompt, 8, concurrency, max(concurrency, 4), model=model, cpus=cpus)
    run = ghz_stream(
        target, prompt, OUTPUT_TOKENS, concurrency, calls,
        on_start=lambda pid: sampler.add_tree(tag, pid), model=model, cpus=cpus,
        on_exit=sampler.sample_now,
    )  # fmt: skip
    return {"run": run, **_accounting(sampler, "inferwire", tag, run.start_ns, run.end_ns, load)}


def _merge(cells: list[dict[str, Any]], tokens: int, wall_s: float) -> dict[str, Any]:
    """CPU of several cells of one kind, per output token."""
    server: dict[str, float] = {}
    for cell in cells:
        for group, us in cell["server_cpu_us"].items():
            server[group] = server.get(group, 0.0) + us
    tool = sum(cell["tool_cpu_us"] for cell in cells)
    return {
        "server_cpu_us_per_token": {g: us / tokens for g, us in server.items()} if tokens else {},
        "tool_cpu_us_per_token": tool / tokens if tokens else 0.0,
        "tool_cpu_share_of_a_core": tool / 1e6 / wall_s if wall_s else 0.0,
        "load_before": [round(cell["load_before"], 2) for cell in cells],
        "other_cpu_share_max": max(cell["other_cpu_share"] for cell in cells),
    }


def measure(options: RunOptions, model: PeerModel | None = None) -> dict[str, Any]:
    tools = setup()
    model = model or demo_model(tools.gguf)
    rounds = options.size(model.rounds, 1)
    server_cpus, tool_cpus = split_cores()
    every_cpu = os.sched_getaffinity(0)
    os.sched_setaffinity(0, tool_cpus)  # this process, its sampler and its clients
    try:
        return _measure(options, model, tools, rounds, server_cpus, tool_cpus)
    finally:
        os.sched_setaffinity(0, every_cpu)  # the next scenario splits the CPUs again


def _measure(
    options: RunOptions,
    model: PeerModel,
    tools: Any,
    rounds: int,
    server_cpus: list[int],
    tool_cpus: list[int],
) -> dict[str, Any]:
    threads = len(server_cpus)
    data: dict[str, Any] = {"setup": tools.steps, "gguf_sha256": sha256_of(model.gguf)}
    data["cores"] = {"servers": server_cpus, "load_tool": tool_cpus}
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-")))
        llama = stack.enter_context(
            llama_server(
                tools.llama_server, model.gguf, SLOTS, SLOT_TOKENS, threads,
                CACHE / f"llama-server-{model.name}.log",
                repeat_penalty=model.repeat_penalty, alias=model.name, cpus=server_cpus,
            )
        )  # fmt: skip
        ours = stack.enter_context(
            inferwire_llama(
                model.gguf, SLOTS, SLOT_TOKENS, threads, model.repeat_penalty, model.name,
                server_cpus,
            )
        )  # fmt: skip
        ort = stack.enter_context(
            inferwire(SLOTS, model=model.name, path=model.config_path, cpus=server_cpus)
        )
        texts = corpus_sample(tools.corpus_sdist)
        data["tokenization"] = tokenization_check(model.ort_path, llama.url, texts)
        data["greedy"] = greedy_check(model.ort_path, llama.url)
        data["llama_server_command"] = [
            Path(part).name if part in (str(model.gguf), str(tools.llama_server)) else part
            for part in llama.command
        ]
        urls = {"inferwire": ours.http_url, "inferwire_ort": ort.http_url, "llama_cpp": llama.url}
        import onnxruntime_genai as og

        tokenizer = og.Tokenizer(og.Model(str(model.ort_path)))
        prompt = exact_prompt(tokenizer, texts, INPUT_TOKENS)
        pids = {"inferwire": ours.process.pid, "inferwire_ort": ort.process.pid}
        sampler = stack.enter_context(
            CpuSampler(servers={**pids, "llama_cpp": llama.pid, "bench": os.getpid()})
        )
        sampler.add_machine("machine", _machine_busy_us)
        cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        step = 0
        for round_index in range(rounds):
            for concurrency in CONCURRENCY:
                requests = _requests(model, concurrency, options.quick)
                for endpoint in ENDPOINTS:
                    turn = (round_index + step) % len(SERVERS)
                    order = SERVERS[turn:] + SERVERS[:turn]
                    step += 1
                    for server in order:
                        tag = f"{server}-{endpoint}-{concurrency}-{round_index}"
                        cell = _aiperf_cell(
                            sampler, tools.aiperf, urls[server], server, endpoint,
                            concurrency, requests, scratch, tag, model, tool_cpus,
                        )  # fmt: skip
                        cells.setdefault((server, endpoint, concurrency), []).append(cell)
                        print(
                            f"  {tag}: {cell['run'].tokens / cell['run'].wall_s:,.0f} "
                            f"tokens/s, load {cell['load_before']:.2f}",
                            flush=True,
                        )
                tag = f"grpc-{concurrency}-{round_index}"
                cell = _ghz_cell(
                    sampler, ours.target, prompt, concurrency, requests, tag, model.name,
                    tool_cpus,
                )  # fmt: skip
                cells.setdefault(("inferwire", "grpc", concurrency), []).append(cell)
        data["multiturn"] = _multiturn(urls, model, texts, options.size(model.multiturn_rounds, 1))
        for server, result in data["multiturn"].items():
            print(f"  multi-turn {server}: {result['ttft_p50_ms_by_turn']}", flush=True)
    data["points"] = _points(cells)
    data["prompt_tokens"] = INPUT_TOKENS
    data["output_tokens"] = OUTPUT_TOKENS
    data["slots"] = SLOTS
    data["threads"] = threads
    data["model"] = {"name": model.name, "gguf": model.gguf.name, "about": model.description}
    return data


def _multiturn(
    urls: dict[str, str], model: PeerModel, texts: list[str], rounds: int
) -> dict[str, Any]:
    """Each server's multi-turn figures, its rounds pooled; the servers take turns."""
    runs: dict[str, list[list[dict[str, Any]]]] = {server: [] for server in SERVERS}
    seconds = dict.fromkeys(SERVERS, 0.0)
    for round_index in range(rounds):
        conversations = peers_multiturn.user_messages(texts, round_index)
        turn = round_index % len(SERVERS)
        for server in SERVERS[turn:] + SERVERS[:turn]:
            played, wall_s = peers_multiturn.play(urls[server], model.name, conversations)
            runs[server] += played
            seconds[server] += wall_s
    return {server: peers_multiturn.summary(runs[server], seconds[server]) for server in SERVERS}


def _points(cells: dict[tuple[str, str, int], list[dict[str, Any]]]) -> dict[str, Any]:
    points: dict[str, Any] = {}
    for (server, endpoint, concurrency), group in cells.items():
        key = f"{server}/{endpoint}/{concurrency}"
        if endpoint == "grpc":
            calls = sum(c["run"].calls for c in group)
            wall = sum(c["run"].total_s for c in group)
            tokens = calls * OUTPUT_TOKENS
            summary = {
                "requests": calls,
                "tokens": tokens,
                "wall_s": wall,
                "tokens_per_s": tokens / wall if wall else 0.0,
                "latency_p50_ms": max(c["run"].p50_ms for c in group),
                "latency_p99_ms": max(c["run"].p99_ms for c in group),
            }
        else:
            summary = summarize_runs([c["run"] for c in group])
            tokens, wall = summary["tokens"], summary["wall_s"]
        points[key] = {"server": server, "endpoint": endpoint, "concurrency": concurrency,
                       **summary, **_merge(group, tokens, wall)}  # fmt: skip
    return points


def run(options: RunOptions, model: PeerModel | None = None, name: str = NAME) -> ScenarioResult:
    if shutil.which("cmake") is None and not options.quick:
        raise RuntimeError("cmake is needed to build llama-server (apt-get install cmake g++)")
    started = time.perf_counter()
    data = measure(options, model)
    data["scenario_seconds"] = round(time.perf_counter() - started, 1)
    return peers_report.result(options, name, data, CONCURRENCY, ENDPOINTS)
