"""CPU per token: what the gateway's process spends per streamed token, by thread, against
the two floors it cannot beat, all in one run.

- `og.Engine` driven directly in this process (bench/streams.py `DirectEngine`, static
  batch of N rows, tokens decoded to text): CPU of this whole process while only the engine
  runs. This is the engine's own cost per token.
- A bare grpc.aio server (bench/stream_floor_server.py) streaming one small
  `InferStreamResponse` per token on the same method path, read by the same client: its
  process's CPU per message. This is grpc.aio's own cost per streamed token.
- `inferwire serve` with `batching: engine` (its scheduler in the server's process, and
  in a process of its own: `engine_process: true`) and with `batching: per_request`, the
  same greedy prompts: server CPU per token by thread group (bench/cpu.py), the engine
  process's included.

At 1, 16 and 64 concurrent streams; rounds alternate the four sides so that drift on a
shared machine hits all alike. "Engine-side" CPU of the gateway is its engine threads
(`iw-*`: the scheduler, or the per-request generator workers) plus ONNX Runtime's
intra-op pool (`other`): the work the direct process does (stepping, decoding), compared
with that whole process. The event loop's CPU is compared with the bare server's whole
process (its event loop plus grpc's threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench.baseline_servers import baseline_server
from bench.common import RunOptions, ScenarioResult, Series, at_least, at_most, ratio, write_plot
from bench.cpu import GROUPS, CpuMeter, CpuUsage
from bench.streams import (
    BatchRun,
    DirectEngine,
    compare_texts,
    gateway_batch,
    gateway_server,
    prompts_for,
    summarize,
)
from inferwire.v1 import inference_pb2_grpc

NAME = "cpu_per_token"
STREAMS = (1, 16, 64)
PATHS = ("engine", "engine_process", "per_request")
SIDES = ("direct", "floor", *PATHS)


def _max_tokens(options: RunOptions, streams: int) -> int:
    if streams == 1:
        return options.size(256, 16)
    return options.size(64, 8)


@dataclass
class _Side:
    """What one side did at one stream count, over all rounds."""

    batches: list[BatchRun] = field(default_factory=list)
    usage: CpuUsage = field(default_factory=lambda: CpuUsage(0.0, dict.fromkeys(GROUPS, 0.0)))

    def add(self, measured: tuple[BatchRun, CpuUsage]) -> None:
        batch, usage = measured
        self.batches.append(batch)
        groups = {g: self.usage.by_group[g] + usage.by_group.get(g, 0.0) for g in GROUPS}
        self.usage = CpuUsage(self.usage.total_us + usage.total_us, groups)


async def _streamed(
    target: str, pid: int, prompts: list[str], max_tokens: int
) -> tuple[BatchRun, CpuUsage]:
    """One batch of streams against `target`, after a warm-up; (BatchRun, server CpuUsage)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await gateway_batch(stub, prompts, min(max_tokens, 8))  # warm-up: channel, streams
        with CpuMeter(pid, children=True) as meter:  # an engine process is the server's
            batch = await gateway_batch(stub, prompts, max_tokens)
    return batch, meter.usage


def _direct(engine: DirectEngine, prompts: list[str], max_tokens: int) -> tuple[BatchRun, CpuUsage]:
    with CpuMeter(os.getpid()) as meter:
        batch = engine.run(prompts, max_tokens)
    return batch, meter.usage


def _point(sides: dict[str, _Side]) -> dict[str, dict[str, Any]]:
    point: dict[str, dict[str, Any]] = {}
    for name, side in sides.items():
        summary = summarize(side.batches)
        point[name] = {**summary, "cpu_us_per_token": side.usage.per(summary["tokens"])}
    direct = point["direct"]
    for path in PATHS:
        measured = point[path]
        cpu = measured["cpu_us_per_token"]
        measured["engine_side_us_per_token"] = cpu["engine"] + cpu["other"] + cpu["engine_process"]
        measured["tokens_ratio"] = ratio(
            measured["aggregate_tokens_per_s"], direct["aggregate_tokens_per_s"]
        )
        measured["same_text_share"] = compare_texts(sides["direct"].batches, sides[path].batches)
    return point


def measure(options: RunOptions) -> dict[int, dict[str, dict[str, Any]]]:
    rounds = options.size(3, 1)
    points: dict[int, dict[str, dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        floor = stack.enter_context(baseline_server("bench.stream_floor_server"))
        floor_pid, floor_target = floor.pid, floor.target
        gateways = {
            path: stack.enter_context(
                gateway_server(
                    max(STREAMS),
                    batching="engine" if path == "engine_process" else path,
                    engine_process=path == "engine_process",
                )
            )
            for path in PATHS
        }
        for streams in STREAMS:
            max_tokens = _max_tokens(options, streams)
            engine = DirectEngine(max_batch_size=streams)
            engine.run(prompts_for(streams), min(max_tokens, 8))  # warm-up
            sides = {side: _Side() for side in SIDES}
            for round_index in range(rounds):
                prompts = prompts_for(streams, offset=round_index)
                # Every other round backwards, so that drift hits every side alike.
                for side in SIDES if round_index % 2 == 0 else SIDES[::-1]:
                    if side == "direct":
                        measured = _direct(engine, prompts, max_tokens)
                    else:
                        pid, target = (
                            (floor_pid, floor_target)
                            if side == "floor"
                            else (gateways[side].process.pid, gateways[side].target)
                        )
                        measured = asyncio.run(_streamed(target, pid, prompts, max_tokens))
                    sides[side].add(measured)
            del engine
            points[streams] = _point(sides)
    return points


def _row(streams: int, label: str, side: dict[str, Any], direct_tps: float) -> list[str]:
    cpu = side["cpu_us_per_token"]
    return [
        str(streams),
        label,
        f"{side['aggregate_tokens_per_s']:,.0f}",
        f"{ratio(side['aggregate_tokens_per_s'], direct_tps):.2f}",
        f"{cpu['total']:.0f}",
        *(f"{cpu[g]:.0f}" for g in GROUPS),
    ]


LABELS = {
    "direct": "og.Engine directly (whole process)",
    "floor": "bare grpc.aio stream (µs per message)",
    "engine": "inferwire, batching: engine",
    "engine_process": "inferwire, batching: engine, engine_process",
    "per_request": "inferwire, batching: per_request",
}


def run(options: RunOptions) -> ScenarioResult:
    points = measure(options)
    rows = [
        _row(n, LABELS[side], p[side], p["direct"]["aggregate_tokens_per_s"])
        for n, p in points.items()
        for side in SIDES
    ]
    floor = {n: p["floor"]["cpu_us_per_token"]["total"] for n, p in points.items()}
    engine_at = {n: p["engine"] for n, p in points.items()}
    process_at = {n: p["engine_process"] for n, p in points.items()}
    loop_1 = ratio(engine_at[1]["cpu_us_per_token"]["event_loop"], floor[1])
    loop_64 = ratio(engine_at[64]["cpu_us_per_token"]["event_loop"], floor[64])
    engine_side_1 = ratio(
        engine_at[1]["engine_side_us_per_token"], points[1]["direct"]["cpu_us_per_token"]["total"]
    )
    xs = [float(n) for n in STREAMS]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                LABELS[side], xs, [points[n][side]["cpu_us_per_token"]["total"] for n in STREAMS]
            )
            for side in PATHS
        ]
        + [
            Series(
                LABELS[side],
                xs,
                [points[n][side]["cpu_us_per_token"]["total"] for n in STREAMS],
                baseline=True,
            )
            for side in ("direct", "floor")
        ],
        xlabel="concurrent streams",
        ylabel="server CPU µs per token",
        title="CPU per streamed token, greedy",
        log_x=True,
    )
    ratios = {
        f"tokens_per_s_{path}_at_{n}": points[n][path]["tokens_ratio"]
        for path in PATHS
        for n in STREAMS
    }
    return ScenarioResult(
        name=NAME,
        title="CPU per token: inferwire's server process by thread, against og.Engine "
        "directly and a bare grpc.aio stream",
        baseline="og.Engine driven in-process (static batch = N), and a bare grpc.aio server "
        "streaming one small message per token",
        data={
            "max_tokens": {str(n): _max_tokens(options, n) for n in STREAMS},
            "rounds": options.size(3, 1),
            "points": {str(n): p for n, p in points.items()},
            "plot": plot.name,
        },
        ratios=ratios,
        table_header=[
            "streams",
            "side",
            "tokens/s",
            "vs direct",
            "CPU µs/token",
            *(f"{g} µs" for g in GROUPS),
        ],
        table_rows=rows,
        targets=[
            at_most(
                "Event-loop CPU per token, 1 stream, × the bare grpc.aio server's per message",
                loop_1,
                1.2,
            ),
            at_most(
                "Event-loop CPU per token, 64 streams, × the bare server's per message at 64",
                loop_64,
                0.5,
            ),
            at_most(
                "Engine-side CPU per token (iw-* + ORT pool), 1 stream, × og.Engine directly",
                engine_side_1,
                1.1,
            ),
            at_least(
                "InferStream tokens/s, 1 stream, vs og.Engine directly",
                engine_at[1]["tokens_ratio"],
                0.9,
            ),
            at_least(
                "Aggregate tokens/s, 16 streams, batching: engine, vs og.Engine at 16",
                engine_at[16]["tokens_ratio"],
                0.8,
            ),
            at_least(
                "InferStream tokens/s, 1 stream, engine_process, vs og.Engine directly",
                process_at[1]["tokens_ratio"],
                0.9,
            ),
            at_least(
                "Aggregate tokens/s, 16 streams, engine_process, vs og.Engine at 16",
                process_at[16]["tokens_ratio"],
                0.8,
            ),
        ],
        notes=[
            "CPU from /proc per thread (bench/cpu.py): event_loop is the main thread; engine "
            "the threads inferwire names iw-* (engine scheduler, generator workers); other "
            "is ONNX Runtime's intra-op pool; engine_process every thread of the server's "
            "child process (engine_process: true); exited is threads that ended mid-run.",
            "The direct engine runs in this process's main thread, so its whole cost shows "
            "under event_loop and other; the bare server's under event_loop and grpc.",
            "Same greedy prompts on every side; share of requests with the direct engine's "
            "text: "
            + ", ".join(
                f"{n} streams {p[path]['same_text_share']:.0%} ({path})"
                for n, p in points.items()
                for path in PATHS
            ),
        ],
    )
