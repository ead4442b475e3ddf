"""What the HTTP door costs per streamed token, next to the gRPC door and the two floors.

- A bare Starlette/uvicorn SSE server (bench/sse_floor_server.py): one chat chunk per
  event; its whole process's CPU per event is what Starlette and uvicorn need.
- A bare grpc.aio stream (bench/stream_floor_server.py): its CPU per message.
- One `inferwire serve` with the bundled model on the per-request path: the same greedy
  prompts as chat streams over HTTP (Server-Sent Events, `include_usage`) and as
  `InferStream` over gRPC; the event loop's CPU per token (bench/cpu.py), which is where
  both doors run, and the messages per token (several tokens share an event when they come
  within `stream_interval_ms`).

At 1 and 16 concurrent streams, in rounds that alternate the order of the four sides so
that drift on a shared machine hits all alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx

from bench.baseline_servers import baseline_server
from bench.common import RunOptions, ScenarioResult, Series, at_most, ratio, write_plot
from bench.cpu import GROUPS, CpuMeter, CpuUsage
from bench.streams import gateway_server, prompts_for
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

NAME = "http_overhead"
STREAMS = (1, 16)
SIDES = ("sse_floor", "grpc_floor", "http", "grpc")
LABELS = {
    "sse_floor": "bare Starlette/uvicorn SSE (µs per event, whole process)",
    "grpc_floor": "bare grpc.aio stream (µs per message, whole process)",
    "http": "inferwire, OpenAI chat stream over HTTP (event loop)",
    "grpc": "inferwire, InferStream over gRPC (event loop)",
}


@dataclass
class _Side:
    tokens: int = 0
    messages: int = 0
    wall_s: float = 0.0
    usage: CpuUsage = field(default_factory=lambda: CpuUsage(0.0, dict.fromkeys(GROUPS, 0.0)))

    def add(self, tokens: int, messages: int, wall_s: float, usage: CpuUsage) -> None:
        self.tokens += tokens
        self.messages += messages
        self.wall_s += wall_s
        groups = {g: self.usage.by_group[g] + usage.by_group.get(g, 0.0) for g in GROUPS}
        self.usage = CpuUsage(self.usage.total_us + usage.total_us, groups)


async def _sse_batch(url: str, prompts: list[str], max_tokens: int) -> tuple[int, int]:
    """One chat stream per prompt at once; (tokens from the usage chunks, events)."""
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:

        async def one(prompt: str) -> tuple[int, int]:
            body = {
                "model": "demo",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            tokens = events = 0
            async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    events += 1
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return tokens, events

        results = await asyncio.gather(*(one(p) for p in prompts))
    return sum(t for t, _ in results), sum(e for _, e in results)


Measured = tuple[int, int, float, CpuUsage]  # tokens, messages, wall seconds, server CPU


async def _measured_http(url: str, pid: int, prompts: list[str], max_tokens: int) -> Measured:
    await _sse_batch(url, prompts, min(max_tokens, 8))  # warm-up: connections, streams
    started = time.perf_counter()
    with CpuMeter(pid) as meter:
        tokens, events = await _sse_batch(url, prompts, max_tokens)
    return tokens, events, time.perf_counter() - started, meter.usage


async def _grpc_batch(
    stub: inference_pb2_grpc.InferenceServiceStub, prompts: list[str], max_tokens: int
) -> tuple[int, int]:
    """One InferStream per prompt at once; (tokens from the last messages, messages)."""

    async def one(prompt: str) -> tuple[int, int]:
        parameters = pb.GenerationParameters(max_tokens=max_tokens, temperature=0)
        request = pb.InferStreamRequest(model="demo", prompt=prompt, parameters=parameters)
        tokens = messages = 0
        async for message in stub.InferStream(request):
            messages += 1
            if message.HasField("usage"):
                tokens = message.usage.completion_tokens
        return tokens, messages

    results = await asyncio.gather(*(one(p) for p in prompts))
    return sum(t for t, _ in results), sum(m for _, m in results)


async def _measured_grpc(target: str, pid: int, prompts: list[str], max_tokens: int) -> Measured:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await _grpc_batch(stub, prompts, min(max_tokens, 8))
        started = time.perf_counter()
        with CpuMeter(pid) as meter:
            tokens, messages = await _grpc_batch(stub, prompts, max_tokens)
    return tokens, messages, time.perf_counter() - started, meter.usage


def measure(options: RunOptions) -> dict[int, dict[str, dict[str, Any]]]:
    # Enough work per side that a floor's few milliseconds of CPU per round add up.
    rounds = options.size(6, 1)
    points: dict[int, dict[str, dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        sse = stack.enter_context(baseline_server("bench.sse_floor_server"))
        stream = stack.enter_context(baseline_server("bench.stream_floor_server"))
        gateway = stack.enter_context(gateway_server(max(STREAMS), batching="per_request"))
        pid, http_url = gateway.process.pid, gateway.http_url
        for streams in STREAMS:
            max_tokens = options.size(256 if streams == 1 else 128, 8)
            sides = {side: _Side() for side in SIDES}
            for round_index in range(rounds):
                prompts = prompts_for(streams, offset=round_index)
                for side in SIDES if round_index % 2 == 0 else SIDES[::-1]:
                    if side == "sse_floor":
                        run = _measured_http(f"http://{sse.target}", sse.pid, prompts, max_tokens)
                    elif side == "http":
                        run = _measured_http(http_url, pid, prompts, max_tokens)
                    elif side == "grpc_floor":
                        run = _measured_grpc(stream.target, stream.pid, prompts, max_tokens)
                    else:
                        run = _measured_grpc(gateway.target, pid, prompts, max_tokens)
                    sides[side].add(*asyncio.run(run))
            points[streams] = {name: _summary(side) for name, side in sides.items()}
    return points


def _summary(side: _Side) -> dict[str, Any]:
    return {
        "tokens": side.tokens,
        "messages": side.messages,
        "tokens_per_s": side.tokens / side.wall_s if side.wall_s else 0.0,
        "cpu_us_per_token": side.usage.per(side.tokens),
    }


def _per_token(point: dict[str, dict[str, Any]], side: str) -> float:
    cpu = point[side]["cpu_us_per_token"]
    return float(cpu["total"] if side.endswith("floor") else cpu["event_loop"])


def run(options: RunOptions) -> ScenarioResult:
    points = measure(options)
    rows = [
        [
            str(n),
            LABELS[side],
            f"{p[side]['tokens_per_s']:,.0f}",
            f"{_per_token(p, side):.1f}",
            f"{p[side]['cpu_us_per_token']['total']:.1f}",
            f"{p[side]['messages'] / max(p[side]['tokens'], 1):.2f}",
        ]
        for n, p in points.items()
        for side in SIDES
    ]
    ratios = {}
    for n, p in points.items():
        ratios[f"http_loop_vs_sse_floor_at_{n}"] = ratio(
            _per_token(p, "http"), _per_token(p, "sse_floor")
        )
        ratios[f"http_loop_vs_grpc_loop_at_{n}"] = ratio(
            _per_token(p, "http"), _per_token(p, "grpc")
        )
    xs = [float(n) for n in STREAMS]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                LABELS[side],
                xs,
                [_per_token(points[n], side) for n in STREAMS],
                baseline=side.endswith("floor"),
            )
            for side in SIDES
        ],
        xlabel="concurrent streams",
        ylabel="CPU µs per streamed token",
        title="HTTP (SSE) and gRPC streaming: CPU per token",
        log_x=True,
    )
    return ScenarioResult(
        name=NAME,
        title="The HTTP door per streamed token: inferwire's event loop over SSE and over gRPC, "
        "against bare Starlette/uvicorn and grpc.aio servers",
        baseline="bare Starlette/uvicorn streaming one SSE chat chunk per token, and a bare "
        "grpc.aio server streaming one message per token",
        data={"points": {str(n): p for n, p in points.items()}, "plot": plot.name},
        ratios=ratios,
        table_header=[
            "streams",
            "side",
            "tokens/s",
            "CPU µs/token (loop; floors: process)",
            "process CPU µs/token",
            "messages/token",
        ],
        table_rows=rows,
        targets=[
            at_most(
                "HTTP stream: event-loop CPU per token × the bare SSE server's per event, 1 stream",
                ratios["http_loop_vs_sse_floor_at_1"],
                1.2,
            ),
            at_most(
                "HTTP stream: event-loop CPU per token × the bare SSE server's per event, 16 "
                "streams",
                ratios["http_loop_vs_sse_floor_at_16"],
                1.5,
            ),
            at_most(
                "HTTP stream: event-loop CPU per token × gRPC InferStream's, 1 stream",
                ratios["http_loop_vs_grpc_loop_at_1"],
                1.3,
            ),
        ],
        notes=[
            "The floors' figures are their whole process (event loop and every other thread); "
            "inferwire's are its event loop, where both doors, the core and the hand-over from "
            "the engine thread run.",
            "Tokens are counted from each stream's usage (HTTP: the include_usage chunk; gRPC: the "
            "last message); messages per token below 1 means tokens shared a message "
            "(stream_interval_ms).",
        ],
    )
