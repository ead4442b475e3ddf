"""Gateway capacity: the gateway alone, with the simulator backend as its model.

Each simulated stream offers 50 tokens/s (`inter_token_ms: 20`) on an absolute schedule,
token i due `time_to_first_token + i * inter_token` after the stream started, so a slow
gateway shows as tokens arriving late (and fewer per second), never as a slowed
schedule. 16, 64, 256 and 512 `InferStream` streams run at once from this one asyncio
process; their starts are spread over the first eighth of a stream's length (1 s in a
full run), so the offered load is steady: neither one burst of admissions nor one burst
of tokens every 20 ms.

Measured in a window in the middle of the streams' schedule, when every stream is
running: tokens delivered per second against offered (streams x 50); the added
inter-token latency, each token's arrival against its schedule less the stream's best
(its smallest lateness: the request's trip and admission, which are the added TTFT);
and the CPU of the server (by thread group, bench/cpu.py) and of this client. Tokens are
counted from the words of each message's text (every simulator token is one word with a
leading space), checked against the stream's final usage, so deltas the gateway
coalesced into one message count as the tokens they carry.

Streams go over one channel (one HTTP/2 connection) per 64 streams: a connection per few
dozen streams is what many clients behind a load balancer look like. All channels share this
process's one event loop and grpc completion queue, so more of them cost the client
little.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

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
from bench.cpu import CpuSnapshot, snapshot, usage_between
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

NAME = "gateway_capacity"
LEVELS = (16, 64, 256, 512)
INTER_TOKEN_MS = 20.0  # 50 tokens/s per stream
TIME_TO_FIRST_TOKEN_MS = 20.0
STREAMS_PER_CHANNEL = 64
MODEL = "sim"
TARGET_STREAMS = 256
CLIENT_BUSY = 0.8  # this client's event loop busier than this: it may be what limits


@contextlib.contextmanager
def simulator_server(max_streams: int) -> Iterator[ServerProcess]:
    """`inferwire serve` with one simulator model with room for `max_streams` streams."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(
            f"models:\n  - name: {MODEL}\n    backend: simulator\n    load_on_startup: true\n"
            f"    max_concurrency: {max_streams}\n    max_queue: {max_streams}\n"
            f"    options: {{time_to_first_token_ms: {TIME_TO_FIRST_TOKEN_MS}, "
            f"inter_token_ms: {INTER_TOKEN_MS}}}\n"
        )
        server = start_serving_server("--config", str(config))
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


@dataclass
class StreamTrace:
    """One stream as the client saw it."""

    sent: float = 0.0  # perf_counter() when the call was made
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens)
    usage_tokens: int = 0  # the final message's completion_tokens

    @property
    def counted_tokens(self) -> int:
        return sum(tokens for _, tokens in self.arrivals)


async def _one_stream(
    stub: inference_pb2_grpc.InferenceServiceStub, delay_s: float, max_tokens: int, index: int
) -> StreamTrace:
    await asyncio.sleep(delay_s)
    request = pb.InferStreamRequest(
        model=MODEL,
        prompt=f"stream {index}",
        parameters=pb.GenerationParameters(max_tokens=max_tokens, seed=index),
    )
    trace = StreamTrace(sent=time.perf_counter())
    arrivals = trace.arrivals
    async for message in stub.InferStream(request):
        now = time.perf_counter()
        if message.text:
            arrivals.append((now, message.text.count(" ")))
        if message.HasField("usage"):
            trace.usage_tokens = message.usage.completion_tokens
    return trace


@dataclass
class Window:
    """The steady middle of a run, and the CPU both processes used in it."""

    start: float
    end: float
    server: tuple[CpuSnapshot, CpuSnapshot] | None = None
    client: tuple[CpuSnapshot, CpuSnapshot] | None = None


async def _meter(window: Window, server_pid: int) -> None:
    pids = (server_pid, os.getpid())
    await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
    before = await asyncio.to_thread(lambda: [snapshot(pid) for pid in pids])
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    after = await asyncio.to_thread(lambda: [snapshot(pid) for pid in pids])
    window.server, window.client = (before[0], after[0]), (before[1], after[1])


async def run_level(server: ServerProcess, streams: int, max_tokens: int) -> dict[str, Any]:
    """`streams` streams of `max_tokens` tokens at once; what the steady window saw."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own each
    channels = [
        grpc.aio.insecure_channel(server.target, options=options)
        for _ in range(math.ceil(streams / STREAMS_PER_CHANNEL))
    ]
    try:
        stubs = [inference_pb2_grpc.InferenceServiceStub(channel) for channel in channels]
        await asyncio.gather(*(_one_stream(stub, 0.0, 2, 0) for stub in stubs))  # connect
        itl, ttft = INTER_TOKEN_MS / 1e3, TIME_TO_FIRST_TOKEN_MS / 1e3
        span = (max_tokens - 1) * itl
        ramp = span / 8  # the streams' starts are spread over this
        started = time.perf_counter()
        window = Window(started + ramp + ttft + 0.2 * span, started + ttft + 0.8 * span)
        meter = asyncio.create_task(_meter(window, server.process.pid))
        traces = await asyncio.gather(
            *(
                _one_stream(stubs[i % len(stubs)], i * ramp / streams, max_tokens, i)
                for i in range(streams)
            )
        )
        await meter
    finally:
        for channel in channels:
            await channel.close()
    return _summarize(traces, window, streams, server.process.pid)


def _summarize(
    traces: Sequence[StreamTrace], window: Window, streams: int, server_pid: int
) -> dict[str, Any]:
    itl, ttft = INTER_TOKEN_MS / 1e3, TIME_TO_FIRST_TOKEN_MS / 1e3
    delivered = messages = 0
    added_ms: list[float] = []
    late_ms: list[float] = []  # against the schedule from the client's send time
    first_token_late_ms: list[float] = []
    for trace in traces:
        if not trace.arrivals:
            continue
        lateness: list[float] = []  # of every token, and whether its due time is in the window
        in_window: list[bool] = []
        index = 0
        for arrived, tokens in trace.arrivals:
            if window.start <= arrived < window.end:
                delivered += tokens
                messages += 1
            for token in range(index, index + tokens):
                due = trace.sent + ttft + token * itl
                lateness.append(arrived - due)
                in_window.append(window.start <= due < window.end)
            index += tokens
        best = min(lateness)
        for late, counted in zip(lateness, in_window, strict=True):
            if counted:
                added_ms.append((late - best) * 1e3)
                late_ms.append(late * 1e3)
        first_token_late_ms.append(lateness[0] * 1e3)
    seconds = window.end - window.start
    assert window.server is not None and window.client is not None
    server_cpu = usage_between(server_pid, *window.server)
    client_cpu = usage_between(os.getpid(), *window.client)
    offered = streams * 1e3 / INTER_TOKEN_MS
    return {
        "streams": streams,
        "window_s": seconds,
        "offered_tokens_per_s": offered,
        "delivered_tokens_per_s": delivered / seconds,
        "delivered_vs_offered": ratio(delivered / seconds, offered),
        "messages_per_token": ratio(messages, delivered),
        "added_itl_p50_ms": percentile(added_ms, 0.5),
        "added_itl_p99_ms": percentile(added_ms, 0.99),
        "late_vs_send_p50_ms": percentile(late_ms, 0.5),
        "late_vs_send_p99_ms": percentile(late_ms, 0.99),
        "added_ttft_p50_ms": percentile(first_token_late_ms, 0.5),
        "added_ttft_p99_ms": percentile(first_token_late_ms, 0.99),
        "token_count_mismatches": sum(t.counted_tokens != t.usage_tokens for t in traces),
        "server_cpu_us_per_token": server_cpu.per(delivered),
        "server_cpu_us_per_message": server_cpu.per(messages),
        "server_cores_busy": server_cpu.total_us / 1e6 / seconds,
        "client_cores_busy": client_cpu.total_us / 1e6 / seconds,
        "client_cpu_us_per_token": client_cpu.per(delivered)["total"],
        "client_event_loop_busy": client_cpu.by_group["event_loop"] / 1e6 / seconds,
    }


async def wakeup_cpu_us(wakeups: int, period_s: float = 0.005) -> float:
    """CPU µs this process spends per wake-up of an idle event loop (a bare asyncio.sleep):
    at few streams every token costs the server about one, whatever the gateway does."""
    started = time.process_time()
    for _ in range(wakeups):
        await asyncio.sleep(period_s)
    return (time.process_time() - started) / wakeups * 1e6


def run(options: RunOptions) -> ScenarioResult:
    # Full: streams of 8 s (400 tokens); quick: 1 s, enough for a window of ~0.5 s.
    max_tokens = options.size(400, 50)
    wakeup_us = asyncio.run(wakeup_cpu_us(options.size(400, 40)))
    points: dict[int, dict[str, Any]] = {}
    with simulator_server(max(LEVELS)) as server:
        for streams in LEVELS:
            points[streams] = asyncio.run(run_level(server, streams, max_tokens))
    kept_up = [n for n in LEVELS if points[n]["delivered_vs_offered"] >= 0.99]
    capacity = max(kept_up, default=0)
    at_target = points[TARGET_STREAMS]
    xs = [float(n) for n in LEVELS]
    plot = write_plot(
        options,
        NAME,
        [
            Series("delivered", xs, [points[n]["delivered_tokens_per_s"] for n in LEVELS]),
            Series(
                "offered (streams x 50)",
                xs,
                [points[n]["offered_tokens_per_s"] for n in LEVELS],
                baseline=True,
            ),
        ],
        xlabel="concurrent InferStream streams",
        ylabel="tokens/s",
        title="Simulator at 50 tokens/s per stream: delivered vs offered",
        log_x=True,
    )
    busy_client = [n for n in LEVELS if points[n]["client_event_loop_busy"] > CLIENT_BUSY]
    return ScenarioResult(
        name=NAME,
        title="Gateway capacity: simulator streams at 50 tokens/s, delivered vs offered",
        baseline="the simulator's own schedule (streams x 50 tokens/s, token i due at "
        "ttft + i x 20 ms)",
        data={
            "max_tokens": max_tokens,
            "inter_token_ms": INTER_TOKEN_MS,
            "time_to_first_token_ms": TIME_TO_FIRST_TOKEN_MS,
            "streams_per_channel": STREAMS_PER_CHANNEL,
            "largest_streams_delivering_0_99": capacity,
            "idle_loop_wakeup_cpu_us": wakeup_us,
            "points": {str(n): p for n, p in points.items()},
            "plot": plot.name,
        },
        ratios={
            f"delivered_vs_offered_at_{n}": p["delivered_vs_offered"] for n, p in points.items()
        },
        table_header=[
            "streams",
            "offered tok/s",
            "delivered tok/s",
            "delivered / offered",
            "added ITL p50 ms",
            "added ITL p99 ms",
            "added TTFT p50 ms",
            "messages / token",
            "server CPU µs/token (event loop, grpc, other)",
            "server CPU µs/message",
            "server cores",
            "client cores",
        ],
        table_rows=[_row(p) for p in points.values()],
        targets=[
            at_least(
                "simulator, 256 streams x 50 tokens/s: delivered / offered",
                at_target["delivered_vs_offered"],
                0.99,
            ),
            at_most(
                "simulator, 256 streams x 50 tokens/s: added ITL p99 (ms)",
                at_target["added_itl_p99_ms"],
                5.0,
            ),
        ],
        notes=[
            f"Largest stream count delivering >= 0.99 of offered: {capacity or 'none'}.",
            f"An idle event loop's wake-up (a bare asyncio.sleep) cost {wakeup_us:.0f} CPU µs "
            "here: at few streams each token costs about one, so read the CPU per token at "
            "256 and 512 streams.",
            f"One client process, one asyncio loop, {STREAMS_PER_CHANNEL} streams per "
            "channel (a connection each); its CPU is the 'client cores' column.",
            "Client event loop over "
            f"{CLIENT_BUSY:.0%} busy (it may be what limits) at: "
            + (", ".join(map(str, busy_client)) if busy_client else "none"),
            "Streams whose tokens counted from their text disagreed with their usage: "
            f"{sum(p['token_count_mismatches'] for p in points.values())}.",
        ],
    )


def _row(p: dict[str, Any]) -> list[str]:
    cpu = p["server_cpu_us_per_token"]
    return [
        str(p["streams"]),
        f"{p['offered_tokens_per_s']:,.0f}",
        f"{p['delivered_tokens_per_s']:,.0f}",
        f"{p['delivered_vs_offered']:.3f}",
        f"{p['added_itl_p50_ms']:.2f}",
        f"{p['added_itl_p99_ms']:.2f}",
        f"{p['added_ttft_p50_ms']:.2f}",
        f"{p['messages_per_token']:.2f}",
        f"{cpu['total']:.0f} ({cpu['event_loop']:.0f}, {cpu['grpc']:.0f}, {cpu['other']:.0f})",
        f"{p['server_cpu_us_per_message']['total']:.0f}",
        f"{p['server_cores_busy']:.2f}",
        f"{p['client_cores_busy']:.2f}",
    ]
