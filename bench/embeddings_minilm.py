"""all-MiniLM-L6-v2 served by inferwire's onnxruntime-encoder backend against
sentence-transformers' own offline `encode` of the same model, on the same core and threads.

- Equality: TEXTS (1,000 varied texts: the tokenizer corpus, shuffled runs of sentences from
  a few words to past the 256-token window, sent with truncate) embedded by the server and
  by sentence-transformers (fp32): each cosine, min and mean.
- Throughput: 32 concurrent gRPC clients each sending one text a request, the 1,000 texts
  taken in turn, against sentence-transformers' `encode` of the same texts in batches of 32
  (its own length sorting included). Both compute on CPU 0 with one thread (the server:
  `threads: 1`, its event loop on the same core; sentence-transformers:
  torch.set_num_threads(1), pinned by taskset); the load (this process) on CPU 1. Texts
  per second, and CPU ms per text of the computing process (/proc).
- Latency: one client sending one text at a time (p50 over LATENCY_TEXTS) against one
  `encode([text])` at a time.
The two take turns, the first alternating between rounds; each cell keeps its best round.

    .venv/bin/python -m bench embeddings_minilm
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.common import (
    RunOptions,
    ScenarioResult,
    Series,
    at_least,
    at_most,
    percentile,
    write_plot,
)
from bench.common import ratio as divide
from bench.peers_servers import pinned
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import INFERWIRE, start_serving_server, stop_server_process

NAME = "embeddings_minilm"
REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".cache" / "models" / "minilm"
SOURCE = REPO / ".cache" / "minilm" / "all-MiniLM-L6-v2"
CLIENTS, BATCH = 32, 32
ENGINE_CPU, LOAD_CPU = 0, 1
_WORDS = (  # noqa: SIM905
    "river bridge market library harbour museum bakery tower garden station theatre the a of "
    "and in on with under after before quickly slowly bright dark old new city village rain "
    "sun winter summer engineer doctor teacher children music paper stone glass 42 1999 3.5"
).split()


def make_texts(count: int, seed: int = 7) -> list[str]:
    """`count` distinct texts: the tokenizer corpus first, then runs of random words of 1 to
    300 words (a quarter over the window), some with Unicode and digits."""
    from tests.realmodel.corpus import CORPUS

    rng = random.Random(seed)
    texts = [t for t in dict.fromkeys(CORPUS) if t.strip()][:count]
    extras = ["naïve café", "日本語のテキスト", "emoji 😀", "x = f(y) ** 2", "Zürich"]
    while len(texts) < count:
        length = rng.choice([rng.randint(1, 12), rng.randint(12, 60), rng.randint(60, 300)])
        words = [rng.choice(_WORDS) for _ in range(length)]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(extras))
        text = " ".join(words).capitalize() + "."
        if text not in texts:
            texts.append(text)
    return texts


def cosines(served: np.ndarray, reference: np.ndarray) -> np.ndarray:
    served = served / np.linalg.norm(served, axis=1, keepdims=True)
    reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return np.asarray((served * reference).sum(axis=1))


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- sentence-transformers, in a process of its own on ENGINE_CPU ------------------------


def offline_main(texts_file: str, latency_texts: int, out: str) -> None:
    """`python -m bench.embeddings_minilm TEXTS LATENCY OUT` (under taskset): encode the
    texts in batches of BATCH (throughput, CPU), then one at a time (latency)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    texts = json.loads(Path(texts_file).read_text())
    model = SentenceTransformer(str(SOURCE), device="cpu")
    model.encode(texts[:BATCH], batch_size=BATCH)  # warm-up
    started, cpu0 = time.perf_counter(), time.process_time()
    vectors = model.encode(texts, batch_size=BATCH, normalize_embeddings=True)
    duration, cpu = time.perf_counter() - started, time.process_time() - cpu0
    latencies = []
    for text in texts[:latency_texts]:
        sent = time.perf_counter()
        model.encode([text])
        latencies.append((time.perf_counter() - sent) * 1e3)
    cell = _cell(len(texts), duration, cpu, latencies)
    np.save(out + ".npy", np.asarray(vectors, dtype=np.float32))
    Path(out).write_text(json.dumps(cell))


def _cell(texts: int, duration: float, cpu: float, latencies: list[float]) -> dict[str, Any]:
    return {
        "texts": texts,
        "duration_s": round(duration, 3),
        "texts_per_s": round(texts / duration, 2),
        "cpu_ms_per_text": round(cpu * 1000 / texts, 3),
        "latency_p50_ms": round(percentile(latencies, 0.5), 2),
        "latency_p99_ms": round(percentile(latencies, 0.99), 2),
    }


def run_offline(texts: list[str], latency_texts: int) -> tuple[dict[str, Any], np.ndarray]:
    with tempfile.TemporaryDirectory() as scratch:
        texts_file, out = Path(scratch) / "texts.json", Path(scratch) / "offline.json"
        texts_file.write_text(json.dumps(texts))
        command = [
            *pinned([ENGINE_CPU]),
            sys.executable,
            "-m",
            "bench.embeddings_minilm",
            str(texts_file),
            str(latency_texts),
            str(out),
        ]
        subprocess.run(command, check=True, cwd=REPO, stdout=sys.stderr)
        return json.loads(out.read_text()), np.load(str(out) + ".npy")


# ---- inferwire -------------------------------------------------------------------------


async def _drive(target: str, pid: int, texts: list[str], latency_texts: int) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def embed(inputs: list[str]) -> list[list[float]]:
            request = pb.EmbedRequest(model="minilm", inputs=inputs, truncate=True)
            reply = await stub.Embed(request)
            return [list(e.values) for e in reply.embeddings]

        await asyncio.gather(*(embed([t]) for t in texts[:CLIENTS]))  # warm-up
        # Equality: the texts in requests of BATCH.
        served = [
            v for at in range(0, len(texts), BATCH) for v in await embed(texts[at : at + BATCH])
        ]
        queue = iter(range(len(texts)))

        async def client() -> None:
            for index in queue:
                await embed([texts[index]])

        started, cpu0 = time.perf_counter(), _process_cpu_s(pid)
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        duration, cpu = time.perf_counter() - started, _process_cpu_s(pid) - cpu0
        latencies = []
        for text in texts[:latency_texts]:
            sent = time.perf_counter()
            await embed([text])
            latencies.append((time.perf_counter() - sent) * 1e3)
    cell = _cell(len(texts), duration, cpu, latencies)
    return {**cell, "vectors": np.asarray(served, dtype=np.float32)}


def run_inferwire(texts: list[str], latency_texts: int) -> dict[str, Any]:
    entry = {
        "name": "minilm",
        "backend": "onnxruntime-encoder",
        "load_on_startup": True,
        "max_concurrency": CLIENTS,
        "max_queue": 4 * CLIENTS,
        "options": {"path": str(MODEL), "threads": 1, "max_batch_inputs": BATCH},
    }
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(json.dumps({"models": [entry]}))
        program = [*pinned([ENGINE_CPU]), str(INFERWIRE)]
        server = start_serving_server(
            "--config",
            str(config),
            "--metrics-address",
            "",
            "--http-address",
            "",
            program=program,
        )
        try:
            return asyncio.run(_drive(server.target, server.process.pid, texts, latency_texts))
        finally:
            stop_server_process(server, graceful=True)


# ---- the scenario ----------------------------------------------------------------------


def run(options: RunOptions) -> ScenarioResult:
    subprocess.run([sys.executable, str(REPO / "scripts" / "minilm.py")], check=True)
    os.sched_setaffinity(0, {LOAD_CPU})
    texts = make_texts(options.size(1000, 96))
    latency_texts = options.size(200, 16)
    rounds = 1 if options.quick else 2
    cells: dict[str, list[dict[str, Any]]] = {"inferwire": [], "sentence_transformers": []}
    served = reference = np.zeros((0, 384), dtype=np.float32)
    for round_index in range(rounds):
        order = ("inferwire", "sentence_transformers")[:: 1 if round_index % 2 == 0 else -1]
        for engine in order:
            if engine == "inferwire":
                made = run_inferwire(texts, latency_texts)
                served = made.pop("vectors")
            else:
                made, reference = run_offline(texts, latency_texts)
            cells[engine].append({**made, "round": round_index})
            print(json.dumps({"engine": engine, **cells[engine][-1]}), flush=True)
    return result(options, texts, cells, cosines(served, reference))


def _best(cells: list[dict[str, Any]]) -> dict[str, Any]:
    fastest = max(cells, key=lambda c: c["texts_per_s"])
    return {**fastest, "latency_p50_ms": min(c["latency_p50_ms"] for c in cells)}


def result(
    options: RunOptions,
    texts: list[str],
    cells: dict[str, list[dict[str, Any]]],
    cosine: np.ndarray,
) -> ScenarioResult:
    ours, theirs = _best(cells["inferwire"]), _best(cells["sentence_transformers"])
    ratios = {
        "throughput": divide(ours["texts_per_s"], theirs["texts_per_s"]),
        "latency_p50": divide(ours["latency_p50_ms"], theirs["latency_p50_ms"]),
        "cpu_per_text": divide(ours["cpu_ms_per_text"], theirs["cpu_ms_per_text"]),
    }
    targets = [
        at_least(
            f"cosine with sentence-transformers, min of {len(texts)} texts (fp32)",
            float(cosine.min()),
            0.9999,
        ),
        at_least(
            f"texts/s, {CLIENTS} single-text clients x offline encode (batches of {BATCH})",
            ratios["throughput"],
            0.9,
        ),
        at_most("one client's p50 latency x one offline encode", ratios["latency_p50"], 1.2),
    ]
    labels = {
        "inferwire": f"inferwire, {CLIENTS} gRPC clients / 1 client",
        "sentence_transformers": f"sentence-transformers encode, batch {BATCH} / 1 text",
    }
    rows = [
        [
            labels[e],
            f"{c['texts_per_s']:.1f}",
            f"{c['cpu_ms_per_text']:.2f}",
            f"{c['latency_p50_ms']:.1f}",
            f"{c['latency_p99_ms']:.1f}",
        ]
        for e, c in (("inferwire", ours), ("sentence_transformers", theirs))
    ]
    rounds = range(max(len(v) for v in cells.values()))
    series = [
        Series(
            labels[e],
            [float(r + 1) for r in rounds],
            [c["texts_per_s"] for c in cells[e]],
            baseline=e != "inferwire",
        )
        for e in cells
    ]
    plot = write_plot(
        options,
        NAME,
        series,
        xlabel="round",
        ylabel="texts/s",
        title="all-MiniLM-L6-v2 on one CPU core",
    )
    lengths = sorted(len(t) for t in texts)
    notes = [
        f"Cosine with sentence-transformers over {len(texts)} texts: min {cosine.min():.6f}, "
        f"mean {cosine.mean():.6f} (characters per text: median {lengths[len(lengths) // 2]}, "
        f"max {lengths[-1]}; over the window cut to it on both sides).",
        f"Both on CPU {ENGINE_CPU} with one compute thread; the load on CPU {LOAD_CPU}. "
        "CPU ms per text: the computing process's (/proc; the server's event loop, gRPC and "
        "its step loop included).",
        "A cell is its best round by texts/s; latency p50 the best round's; every round in "
        "the JSON.",
        f"Plot: {plot.name}",
    ]
    return ScenarioResult(
        name=NAME,
        title="Embeddings: all-MiniLM-L6-v2 served against sentence-transformers' encode",
        baseline=f"sentence-transformers' offline encode in batches of {BATCH}, same core "
        "and threads",
        data={
            "cells": cells,
            "cosine_min": float(cosine.min()),
            "cosine_mean": float(cosine.mean()),
            "texts": len(texts),
        },
        ratios=ratios,
        table_header=["engine", "texts/s", "CPU ms / text", "p50 ms", "p99 ms"],
        table_rows=rows,
        targets=targets,
        notes=notes,
    )


if __name__ == "__main__":
    offline_main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
