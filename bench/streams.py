"""Generation on the bundled model two ways, measured alike: `og.Engine` driven directly
in this process, and `InferStream` through a real `inferwire serve` over loopback.

Both decode every token to text and both are greedy, so the same prompt yields the same
text on both paths, which `compare_texts` checks: the two sides did the same work. A static
`og.Engine` refuses per-request seeds ("A per-turn seed requires an Engine configured for
dynamic batching", docs/ort_genai_batching.md), so seeds play no part here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime_genai as og

from bench.common import percentile
from inferwire.backends.ort_genai import builtin_model_path
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

PROMPTS = (
    "Hello",
    "The weather today",
    "Once upon a time",
    "The quick brown fox",
    "In the beginning",
    "My favourite food is",
    "The train left the station",
    "She opened the door and",
)
GATEWAY_MODEL = "demo"


@dataclass
class StreamRun:
    """One request: what it produced and when."""

    text: str
    tokens: int
    ttft_s: float
    total_s: float


@dataclass
class BatchRun:
    """`len(runs)` requests started together; wall time until the last one ended."""

    runs: list[StreamRun]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(run.tokens for run in self.runs)


def summarize(batches: Sequence[BatchRun]) -> dict[str, Any]:
    """Aggregate tokens/s (all tokens over all wall time), per-stream tokens/s, TTFT."""
    runs = [run for batch in batches for run in batch.runs]
    ttfts = [run.ttft_s * 1e3 for run in runs]
    return {
        "requests": len(runs),
        "tokens": sum(run.tokens for run in runs),
        "aggregate_tokens_per_s": sum(b.tokens for b in batches) / sum(b.wall_s for b in batches),
        "median_stream_tokens_per_s": statistics.median(
            run.tokens / run.total_s for run in runs if run.total_s
        ),
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
    }


STREAM_TABLE_HEADER = [
    "path",
    "tokens/s",
    "median stream tokens/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "requests",
]


def stream_table_rows(paths: Sequence[tuple[str, dict[str, Any]]]) -> list[list[str]]:
    """One row of STREAM_TABLE_HEADER per (label, `summarize` result)."""
    return [
        [
            label,
            f"{s['aggregate_tokens_per_s']:,.0f}",
            f"{s['median_stream_tokens_per_s']:,.0f}",
            f"{s['ttft_p50_ms']:.2f}",
            f"{s['ttft_p99_ms']:.2f}",
            str(s["requests"]),
        ]
        for label, s in paths
    ]


def compare_texts(direct: Sequence[BatchRun], gateway: Sequence[BatchRun]) -> float:
    """The share of requests whose text is the same on both paths (greedy: expect 1.0)."""
    pairs = [
        (a.text, b.text)
        for da, gb in zip(direct, gateway, strict=True)
        for a, b in zip(da.runs, gb.runs, strict=True)
    ]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else 0.0


class DirectEngine:
    """The bundled model in `og.Engine`, static batching with `max_batch_size` rows."""

    def __init__(self, max_batch_size: int) -> None:
        config = og.Config(str(builtin_model_path()))
        config.overlay(
            json.dumps({"engine": {"static_batching": {"max_batch_size": max_batch_size}}})
        )
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)
        self.engine = og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(max(64, 4 * max_batch_size))

    def run(self, prompts: Sequence[str], max_tokens: int) -> BatchRun:
        """Submit every prompt at once and step the engine until all have finished."""
        started = time.perf_counter()
        state: dict[int, tuple[og.Request, Any, list[str], list[float]]] = {}
        for prompt in prompts:
            ids = np.array(self.tokenizer.encode(prompt), dtype=np.int32)
            request = self.engine.create_request()
            turn = og.TurnOptions(request)
            turn.set_max_generated_tokens(max_tokens)
            request.begin_turn(ids, turn)
            # text pieces; [first token time, end time, token count]
            state[id(request)] = (request, self.tokenizer.create_stream(), [], [0.0, 0.0, 0])
        order = list(state)
        while self.engine.has_pending_requests():
            for event in self.engine.run(self.buffer):
                _, stream, pieces, marks = state[id(event.request)]
                now = time.perf_counter()
                if event.flags & og.EngineEventFlags.TOKEN:
                    pieces.append(stream.decode(int(event.token)))
                    marks[2] += 1
                    if marks[0] == 0.0:
                        marks[0] = now
                if event.flags & og.EngineEventFlags.TURN_FINISHED:
                    marks[1] = now
        wall = time.perf_counter() - started
        runs = []
        for key in order:
            request, _, pieces, (first, end, tokens) = state[key]
            request.close()
            runs.append(StreamRun("".join(pieces), int(tokens), first - started, end - started))
        return BatchRun(runs, wall)


@contextlib.contextmanager
def gateway_server(
    max_concurrency: int,
    batching: str = "engine",
    model: str = GATEWAY_MODEL,
    path: str = "builtin",
    engine_process: bool = False,
) -> Iterator[ServerProcess]:
    """`inferwire serve` with the bundled model as `demo` (or the model at `path` as
    `model`), room for `max_concurrency` streams; `batching` and `engine_process` as the
    backend's options (the default, engine, is the path comparable with og.Engine driven
    directly)."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(
            f"models:\n  - name: {model}\n    load_on_startup: true\n"
            f"    max_concurrency: {max_concurrency}\n    max_queue: {4 * max_concurrency}\n"
            f"    options: {{path: '{path}', device: cpu, batching: {batching},"
            f" engine_process: {str(engine_process).lower()}}}\n"
        )
        server = start_serving_server("--config", str(config))
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


async def _one_stream(
    stub: inference_pb2_grpc.InferenceServiceStub,
    prompt: str,
    max_tokens: int,
    started: float,
    model: str,
) -> StreamRun:
    request = pb.InferStreamRequest(
        model=model,
        prompt=prompt,
        parameters=pb.GenerationParameters(max_tokens=max_tokens, temperature=0.0),
    )
    pieces: list[str] = []
    first = 0.0
    tokens = 0
    async for message in stub.InferStream(request):
        if message.text:
            if not first:
                first = time.perf_counter()
            pieces.append(message.text)
        if message.HasField("usage"):
            tokens = message.usage.completion_tokens
    return StreamRun("".join(pieces), tokens, first - started, time.perf_counter() - started)


async def gateway_batch(
    stub: inference_pb2_grpc.InferenceServiceStub,
    prompts: Sequence[str],
    max_tokens: int,
    model: str = GATEWAY_MODEL,
) -> BatchRun:
    """Start one InferStream per prompt at once; wait for all of them."""
    started = time.perf_counter()
    runs = await asyncio.gather(
        *(_one_stream(stub, p, max_tokens, started, model) for p in prompts)
    )
    return BatchRun(list(runs), time.perf_counter() - started)


def gateway_channel(server: ServerProcess) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(server.target)


def prompts_for(count: int, offset: int = 0) -> list[str]:
    return [PROMPTS[(offset + i) % len(PROMPTS)] for i in range(count)]
