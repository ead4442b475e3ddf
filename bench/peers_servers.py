"""The two servers of the `peers` scenario as their users run them, and ghz on gRPC.

- `llama_server`: llama.cpp's `llama-server` on the committed GGUF, CPU only, with the
  sampling of the bundled model (`--repeat-penalty 1.2` over the whole sequence, as ONNX
  Runtime GenAI applies it: `--repeat-last-n` the slot's length, since this llama.cpp
  refuses -1), `--jinja` for the GGUF's
  chat template, `--parallel` slots and `-c` = slots × (input + output tokens), the
  compute threads given, `--metrics`.
- `inferwire_llama`: `inferwire serve` with the same GGUF on its llama-cpp backend
  (continuous batching, a prompt cache per slot), the same slots, slot length, threads and
  repetition penalty as llama-server.
- `inferwire`: `inferwire serve` with the model's ONNX Runtime GenAI folder (by default
  `batching: auto`, which is the continuous path on a CPU model), `max_concurrency` = the
  slots.
- `split_cores` and `pinned`: the servers on one half of the CPUs, the load tool (and this
  process) on the other, so that a ratio compares the servers, not the scheduler's mix.
- `ghz_stream`: ghz on inferwire's gRPC `InferStream` (reflection), the same prompt length,
  output length and concurrency, so the HTTP figures have their gRPC twin.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.baseline_servers import stop_process
from bench.ghz_infer import ghz_path
from bench.streams import gateway_server
from tests.support.process import (
    INFERWIRE,
    ServerProcess,
    start_serving_server,
    stop_server_process,
)

REPEAT_PENALTY = 1.2  # scripts/demo_model/export.py's, in genai_config.json


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def split_cores() -> tuple[list[int], list[int]]:
    """The CPUs for the servers and those for the load tool: halves of this process's."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("peers needs 2 CPUs: one for the servers, one for the load tool")
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def pinned(cpus: list[int]) -> list[str]:
    """A command prefix that runs a program (and every thread it starts) on `cpus`."""
    return ["taskset", "-c", ",".join(str(c) for c in cpus)]


# llama-server's default --cache-ram (common.h's cache_ram_mib): conversations saved from its
# slots to host memory; inferwire's llama-cpp backend gets the same room.
LLAMA_SERVER_CACHE_RAM_MIB = 8192


@dataclass(frozen=True)
class LlamaServer:
    pid: int
    url: str
    command: list[str]


def llama_server_command(
    binary: Path,
    gguf: Path,
    port: int,
    slots: int,
    slot_tokens: int,
    threads: int,
    repeat_penalty: float = REPEAT_PENALTY,
    alias: str = "demo",
) -> list[str]:
    """`repeat_penalty`: the model's own (genai_config.json's `repetition_penalty`)."""
    return [
        str(binary),
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(slots),
        "--ctx-size", str(slots * slot_tokens),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--repeat-penalty", str(repeat_penalty),
        # The whole sequence: this llama.cpp refuses -1 ("invalid repeat-last-n = -1"), and
        # a slot's length covers every request's prompt and output.
        "--repeat-last-n", str(slot_tokens),
        "--jinja",
        "--metrics",
        "--no-webui",
        "--alias", alias,
    ]  # fmt: skip


@contextlib.contextmanager
def llama_server(
    binary: Path,
    gguf: Path,
    slots: int,
    slot_tokens: int,
    threads: int,
    log: Path,
    repeat_penalty: float = REPEAT_PENALTY,
    alias: str = "demo",
    cpus: list[int] | None = None,
) -> Iterator[LlamaServer]:
    """llama-server on a free loopback port, ready (GET /health 200); stopped by PID."""
    port = _free_port()
    command = llama_server_command(
        binary, gguf, port, slots, slot_tokens, threads, repeat_penalty, alias
    )
    if cpus is not None:
        command = [*pinned(cpus), *command]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited {process.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not ready in 120 s:\n{log.read_text()}")
            time.sleep(0.2)
        yield LlamaServer(process.pid, url, command)
    finally:
        stop_process(process, timeout_s=15)


@contextlib.contextmanager
def inferwire(
    slots: int,
    batching: str = "auto",
    model: str = "demo",
    path: str = "builtin",
    cpus: list[int] | None = None,
) -> Iterator[ServerProcess]:
    if cpus is None:
        with gateway_server(slots, batching=batching, model=model, path=path) as server:
            yield server
        return
    options = {"path": path, "device": "cpu", "batching": batching}
    with _serving(model, "onnxruntime-genai", slots, options, cpus) as server:
        yield server


@contextlib.contextmanager
def inferwire_llama(
    gguf: Path,
    slots: int,
    slot_tokens: int,
    threads: int,
    repeat_penalty: float,
    model: str,
    cpus: list[int],
) -> Iterator[ServerProcess]:
    """The GGUF on inferwire's llama-cpp backend, sized and sampling as llama-server."""
    options = {
        "path": str(gguf),
        "slot_tokens": slot_tokens,
        "threads": threads,
        "repetition_penalty": repeat_penalty,
        "prompt_cache_ram_mib": LLAMA_SERVER_CACHE_RAM_MIB,
    }
    with _serving(model, "llama-cpp", slots, options, cpus) as server:
        yield server


@contextlib.contextmanager
def _serving(
    model: str, backend: str, slots: int, options: dict[str, Any], cpus: list[int]
) -> Iterator[ServerProcess]:
    entry = {
        "name": model, "backend": backend, "load_on_startup": True,
        "max_concurrency": slots, "max_queue": 4 * slots, "options": options,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(json.dumps({"models": [entry]}))
        program = [*pinned(cpus), str(INFERWIRE)]
        server = start_serving_server("--config", str(config), program=program)
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


def exact_prompt(tokenizer: Any, texts: list[str], length: int) -> str:
    """A corpus passage of exactly `length` tokens (re-encoded, as a server would)."""
    for text in texts:
        ids = list(tokenizer.encode(text))
        for start in range(0, max(0, len(ids) - length), 7):
            prompt = str(tokenizer.decode(ids[start : start + length]))
            if len(tokenizer.encode(prompt)) == length:
                return prompt
    raise RuntimeError(f"no passage of exactly {length} tokens")


@dataclass
class GhzRun:
    start_ns: int
    end_ns: int
    calls: int
    total_s: float
    p50_ms: float
    p99_ms: float
    pid: int


def ghz_stream(
    target: str,
    prompt: str,
    output_tokens: int,
    concurrency: int,
    calls: int,
    on_start: Any = None,
    model: str = "demo",
    cpus: list[int] | None = None,
    on_exit: Any = None,
) -> GhzRun:
    """ghz, `calls` InferStream calls at `concurrency`, one connection; any failure raises.
    `on_start(pid)` is called once ghz runs, and `on_exit()` once it has ended but before
    it is reaped, while /proc still shows its final CPU time (to sample its CPU)."""
    data = {
        "model": model,
        "prompt": prompt,
        "parameters": {"max_tokens": output_tokens, "temperature": 0, "ignore_eos": True},
    }
    command = [
        str(ghz_path()), "--insecure", "--format=json",
        "--call=inferwire.v1.InferenceService.InferStream",
        f"--data={json.dumps(data)}",
        f"--concurrency={concurrency}", f"--total={calls}", "--connections=1",
        # ghz's default deadline is 20 s a call: 32 streams of 128 tokens from a 135M
        # model at ~80 tokens/s take ~50 s each. The run's own bound is communicate's.
        "--timeout=0",
        target,
    ]  # fmt: skip
    if cpus is not None:
        command = [*pinned(cpus), *command]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start_ns = time.time_ns()
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        if on_start is not None:
            on_start(process.pid)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped
        end_ns = time.time_ns()
        if on_exit is not None:
            on_exit()
        process.wait()
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise RuntimeError(f"ghz failed: {stderr or stdout}")
    report = json.loads(stdout)
    codes = report.get("statusCodeDistribution", {})
    if set(codes) != {"OK"}:
        raise RuntimeError(f"ghz saw failures: {codes} {report.get('errorDistribution')}")
    percentiles = {d["percentage"]: d["latency"] / 1e6 for d in report["latencyDistribution"]}
    return GhzRun(
        start_ns, end_ns, int(report["count"]), report["total"] / 1e9,
        percentiles.get(50, 0.0), percentiles.get(99, 0.0), process.pid,
    )  # fmt: skip
