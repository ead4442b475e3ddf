"""Tenant isolation: a quiet interactive tenant's queue time and time to first token
beside a noisy batch tenant.

One `inferwire serve` process per configuration, the bundled model on the engine path
with few slots, so that the noise queues. The quiet tenant sends one stream at a time;
the noisy one keeps streams going, in two shapes:
- short noise: 32 streams of 64 tokens on 4 slots (the scenario's first figure);
- long noise: 16 streams of 600 tokens on 2 slots (issue 36: every slot held by a long
  batch stream, which is never preempted).
Measured with and without the noise, in these configurations under the same load:
- tenants + reserve: a tokens file naming two tenants, `chat` (interactive) and `nightly`
  (batch); the model keeps its default reserve of one interactive slot (docs/tenants.md);
- tenants, no reserve: the same with `reserved_concurrency: {}`: the quiet tenant goes to
  the head of the queue but waits for a running stream to end;
- FIFO (short noise only: behind 16 streams of 600 tokens a quiet request would wait
  minutes): no tokens file, so both callers are the same anonymous tenant and the
  model's queue is first come, first served (inferwire before tenants).
Reported, not asserted: the quiet tenant's `timing.queue_ms` and TTFT, p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import RunOptions, ScenarioResult, Series, percentile, ratio, write_plot
from bench.streams import GATEWAY_MODEL, prompts_for
from inferwire.core.auth import hash_token
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

NAME = "tenant_isolation"
QUIET_TOKEN, NOISY_TOKEN = "bench-quiet-token", "bench-noisy-token"
RESERVE, NO_RESERVE, FIFO = "tenants + reserve", "tenants, no reserve", "fifo"
LOADS = ("quiet_alone", "with_noise")


@dataclasses.dataclass(frozen=True)
class Noise:
    """One shape of noise: the model's slots, the noisy streams and their length."""

    name: str
    slots: int
    streams: int
    tokens: int
    queues: tuple[str, ...]


def noises(options: RunOptions) -> tuple[Noise, ...]:
    return (
        Noise("short", 4, 32, options.size(64, 8), (RESERVE, NO_RESERVE, FIFO)),
        Noise("long", 2, 16, options.size(600, 60), (RESERVE, NO_RESERVE)),
    )


@contextlib.contextmanager
def isolation_server(
    slots: int, queue_places: int, queue: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """`inferwire serve` with `demo` on `slots` slots; with tenants, a tokens file naming
    them, and the model's default reserve unless `queue` is NO_RESERVE."""
    with tempfile.TemporaryDirectory() as scratch:
        model: dict[str, Any] = {
            "name": GATEWAY_MODEL,
            "load_on_startup": True,
            "max_concurrency": slots,
            "max_queue": queue_places,
            "options": {"path": "builtin", "device": "cpu", "batching": "engine"},
        }
        if queue == NO_RESERVE:
            model["reserved_concurrency"] = {}
        config: dict[str, Any] = {"models": [model]}
        if queue != FIFO:
            tokens = Path(scratch) / "tokens.yaml"
            tokens.write_text(
                yaml.safe_dump(
                    [
                        {"name": n, "sha256": hash_token(t), "scopes": ["infer"], "tenant": tenant}
                        for n, t, tenant in (
                            ("quiet", QUIET_TOKEN, "chat"),
                            ("noisy", NOISY_TOKEN, "nightly"),
                        )
                    ]
                )
            )
            config["server"] = {
                "tenants": [
                    {"name": "chat", "priority": "interactive"},
                    {"name": "nightly", "priority": "batch"},
                ],
                "auth": {"tokens_file": str(tokens)},
            }
        path = Path(scratch) / "inferwire.yaml"
        path.write_text(yaml.safe_dump(config))
        server = start_serving_server("--config", str(path), env=env)
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclasses.dataclass(frozen=True)
class Streamed:
    """One stream read to its end: when it was sent, got its first text and ended
    (time.perf_counter()), its `timing.queue_ms` and its completion tokens."""

    sent: float
    first: float
    ended: float
    queue_ms: float
    tokens: int

    @property
    def ttft_ms(self) -> float:
        return (self.first - self.sent) * 1e3

    def tokens_within(self, start: float, end: float) -> float:
        """Its tokens generated between `start` and `end`, taken as evenly spread from
        its first text to its end."""
        span = self.ended - self.first
        if span <= 0:
            return float(self.tokens) if start <= self.ended <= end else 0.0
        overlap = max(0.0, min(end, self.ended) - max(start, self.first))
        return self.tokens * overlap / span


async def _stream(
    stub: inference_pb2_grpc.InferenceServiceStub, prompt: str, max_tokens: int, token: str
) -> Streamed:
    started = time.perf_counter()
    first = 0.0
    request = pb.InferStreamRequest(
        model=GATEWAY_MODEL,
        prompt=prompt,
        parameters=pb.GenerationParameters(max_tokens=max_tokens, temperature=0.0),
    )
    last = pb.InferStreamResponse()
    async for message in stub.InferStream(request, metadata=_metadata(token)):
        if message.text and not first:
            first = time.perf_counter()
        last = message
    ended = time.perf_counter()
    return Streamed(
        started, first or ended, ended, last.timing.queue_ms, last.usage.completion_tokens
    )


@dataclasses.dataclass
class QuietRun:
    """The quiet tenant's TTFTs and queue times (ms), and the noise's tokens/s meanwhile."""

    ttfts: list[float]
    queues: list[float]
    noisy_tokens_per_s: float = 0.0

    def summary(self) -> dict[str, float]:
        return {
            "requests": len(self.ttfts),
            "queue_p50_ms": percentile(self.queues, 0.5),
            "queue_p99_ms": percentile(self.queues, 0.99),
            "ttft_p50_ms": percentile(self.ttfts, 0.5),
            "ttft_p99_ms": percentile(self.ttfts, 0.99),
            "noisy_tokens_per_s": self.noisy_tokens_per_s,
        }


async def quiet_with_noise(
    server: ServerProcess,
    noise: Noise | None,
    quiet_requests: int,
    quiet_tokens: int,
    pause_s: float = 0.0,
) -> QuietRun:
    """The quiet tenant's streams, one at a time (`pause_s` apart), while the noisy one
    keeps `noise.streams` streams going (none: alone); and the noise's tokens/s meanwhile."""
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await _stream(stub, "Hello", quiet_tokens, QUIET_TOKEN)  # warm-up
        stop = asyncio.Event()
        noisy: list[Streamed] = []

        async def noisy_worker(index: int, streams: Noise) -> None:
            while not stop.is_set():
                prompt = prompts_for(1, index)[0]
                noisy.append(await _stream(stub, prompt, streams.tokens, NOISY_TOKEN))

        workers = (
            []
            if noise is None
            else [asyncio.create_task(noisy_worker(i, noise)) for i in range(noise.streams)]
        )
        run = QuietRun([], [])
        try:
            if noise is not None:
                await asyncio.sleep(1.0)  # let the noise fill the slots and the queue
            started = time.perf_counter()
            for i in range(quiet_requests):
                prompt = prompts_for(1, i)[0]
                quiet = await _stream(stub, prompt, quiet_tokens, QUIET_TOKEN)
                run.ttfts.append(quiet.ttft_ms)
                run.queues.append(quiet.queue_ms)
                await asyncio.sleep(pause_s)
            ended = time.perf_counter()
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
    if noise is not None:
        tokens = sum(s.tokens_within(started, ended) for s in noisy)
        run.noisy_tokens_per_s = tokens / (ended - started)
    return run


def measure(
    noise: Noise,
    queue: str,
    quiet_requests: int,
    quiet_tokens: int,
    env: dict[str, str] | None = None,
    pause_s: float = 0.0,
) -> dict[str, dict[str, float]]:
    """The quiet tenant alone and with `noise`, on one server configured as `queue`."""
    with isolation_server(noise.slots, 4 * noise.streams, queue, env) as server:
        return {
            load: asyncio.run(
                quiet_with_noise(
                    server,
                    noise if load == "with_noise" else None,
                    quiet_requests,
                    quiet_tokens,
                    pause_s,
                )
            ).summary()
            for load in LOADS
        }


def run(options: RunOptions) -> ScenarioResult:
    quiet_requests = options.size(30, 3)
    quiet_tokens = options.size(16, 4)
    shapes = noises(options)
    points: dict[str, dict[str, dict[str, dict[str, float]]]] = {
        noise.name: {
            queue: measure(noise, queue, quiet_requests, quiet_tokens) for queue in noise.queues
        }
        for noise in shapes
    }

    def line(queue: str, baseline: bool = False) -> Series:
        having = [n for n in shapes if queue in n.queues]
        return Series(
            queue,
            [float(n.tokens) for n in having],
            [points[n.name][queue]["with_noise"]["ttft_p50_ms"] for n in having],
            baseline=baseline,
        )

    plot = write_plot(
        options,
        NAME,
        [line(RESERVE), line(NO_RESERVE), line(FIFO, baseline=True)],
        xlabel="noisy streams' tokens (64: 32 streams on 4 slots; 600: 16 on 2 slots)",
        ylabel="quiet tenant's TTFT p50 with the noise (ms)",
        title="Tenant isolation: one quiet interactive stream beside batch noise",
    )
    rows = [
        [
            f"{noise.name} ({noise.streams} x {noise.tokens} tokens, {noise.slots} slots)",
            queue,
            load.replace("_", " "),
            *(
                f"{points[noise.name][queue][load][key]:.1f}"
                for key in ("queue_p50_ms", "queue_p99_ms", "ttft_p50_ms", "ttft_p99_ms")
            ),
            f"{points[noise.name][queue][load]['noisy_tokens_per_s']:.0f}"
            if load == "with_noise"
            else "",
        ]
        for noise in shapes
        for queue in noise.queues
        for load in LOADS
    ]

    def noisy_p50(shape: str, queue: str) -> float:
        return points[shape][queue]["with_noise"]["ttft_p50_ms"]

    return ScenarioResult(
        name=NAME,
        title="Tenant isolation: a quiet interactive tenant's queue and TTFT beside a noisy "
        "batch tenant",
        baseline="the same server and load with one FIFO queue (no tenants); for long noise, "
        "tenants without reserve",
        data={
            "noises": [dataclasses.asdict(noise) for noise in shapes],
            "quiet_requests": quiet_requests,
            "quiet_max_tokens": quiet_tokens,
            "points": points,
            "plot": plot.name,
        },
        ratios={
            "quiet_ttft_p50_with_noise": ratio(
                noisy_p50("short", RESERVE), noisy_p50("short", FIFO)
            ),
            "quiet_ttft_p50_long_noise_reserve": ratio(
                noisy_p50("long", RESERVE), noisy_p50("long", NO_RESERVE)
            ),
        },
        table_header=[
            "noise",
            "queue",
            "load",
            "quiet queue p50 ms",
            "quiet queue p99 ms",
            "quiet TTFT p50 ms",
            "quiet TTFT p99 ms",
            "noisy tokens/s",
        ],
        table_rows=rows,
        targets=[],
        notes=[
            f"The quiet tenant sends {quiet_requests} streams of {quiet_tokens} tokens, one "
            "at a time; the noisy tenant keeps its streams going meanwhile (engine batching).",
            "With tenants the quiet tenant is interactive and the noisy one batch; with "
            "reserve the model keeps its default interactive slot, so batch holds one slot "
            "fewer; FIFO has no tokens file, so both are the same anonymous tenant.",
            "queue: the quiet requests' timing.queue_ms (waiting for a slot); TTFT: from "
            "sending to the first text, seen by the client. noisy tokens/s: the tokens of "
            "the noisy streams generated while the quiet tenant ran (each stream's tokens "
            "taken as evenly spread from its first text to its end), over that time.",
        ],
    )
