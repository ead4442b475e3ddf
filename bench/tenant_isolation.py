"""Tenant isolation: a quiet interactive tenant's time to first token beside a noisy one.

One `inferwire serve` process per configuration, the bundled model on the engine path
with few slots, so that the noise queues. The noisy tenant keeps 32 streams going; the
quiet one sends one stream at a time. Measured with and without the noise, in two
configurations under the same load:
- tenants: a tokens file naming two tenants, `chat` (interactive) and `nightly` (batch):
  the quiet tenant's requests go ahead of every queued batch request (docs/tenants.md);
- FIFO: no tokens file, so both callers are the same anonymous tenant and the model's
  queue is first come, first served (inferwire before tenants).
Reported, not asserted: the quiet tenant's TTFT p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
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
SLOTS = 4
NOISY_STREAMS = 32
QUIET_TOKEN, NOISY_TOKEN = "bench-quiet-token", "bench-noisy-token"


@contextlib.contextmanager
def isolation_server(with_tenants: bool) -> Iterator[ServerProcess]:
    """`inferwire serve` with `demo` on SLOTS slots; with tenants, a tokens file naming them."""
    with tempfile.TemporaryDirectory() as scratch:
        config: dict[str, Any] = {
            "models": [
                {
                    "name": GATEWAY_MODEL,
                    "load_on_startup": True,
                    "max_concurrency": SLOTS,
                    "max_queue": 4 * NOISY_STREAMS,
                    "options": {"path": "builtin", "device": "cpu", "batching": "engine"},
                }
            ]
        }
        if with_tenants:
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
        server = start_serving_server("--config", str(path))
        try:
            yield server
        finally:
            stop_server_process(server, graceful=True)


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _first_token_s(
    stub: inference_pb2_grpc.InferenceServiceStub, prompt: str, max_tokens: int, token: str
) -> float:
    """Seconds from sending a stream to its first text; the stream is read to its end."""
    started = time.perf_counter()
    first = 0.0
    request = pb.InferStreamRequest(
        model=GATEWAY_MODEL,
        prompt=prompt,
        parameters=pb.GenerationParameters(max_tokens=max_tokens, temperature=0.0),
    )
    async for message in stub.InferStream(request, metadata=_metadata(token)):
        if message.text and not first:
            first = time.perf_counter()
    return (first or time.perf_counter()) - started


async def _quiet_with_noise(
    target: str, noise: bool, quiet_requests: int, quiet_tokens: int, noisy_tokens: int
) -> list[float]:
    """The quiet tenant's TTFTs (ms), one stream at a time, while the noisy one keeps
    NOISY_STREAMS streams going (when `noise`)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await _first_token_s(stub, "Hello", quiet_tokens, QUIET_TOKEN)  # warm-up
        stop = asyncio.Event()

        async def noisy_worker(index: int) -> None:
            while not stop.is_set():
                prompt = prompts_for(1, index)[0]
                await _first_token_s(stub, prompt, noisy_tokens, NOISY_TOKEN)

        workers = (
            [asyncio.create_task(noisy_worker(i)) for i in range(NOISY_STREAMS)] if noise else []
        )
        try:
            if noise:
                await asyncio.sleep(1.0)  # let the noise fill the slots and the queue
            ttfts = []
            for i in range(quiet_requests):
                prompt = prompts_for(1, i)[0]
                ttfts.append(await _first_token_s(stub, prompt, quiet_tokens, QUIET_TOKEN) * 1e3)
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
    return ttfts


def _summary(ttfts: list[float]) -> dict[str, float]:
    return {
        "requests": len(ttfts),
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
    }


def run(options: RunOptions) -> ScenarioResult:
    quiet_requests = options.size(30, 3)
    quiet_tokens = options.size(16, 4)
    noisy_tokens = options.size(64, 8)
    points: dict[str, dict[str, dict[str, float]]] = {}
    for label, with_tenants in (("tenants", True), ("fifo", False)):
        with isolation_server(with_tenants) as server:
            points[label] = {
                load: _summary(
                    asyncio.run(
                        _quiet_with_noise(
                            server.target, noise, quiet_requests, quiet_tokens, noisy_tokens
                        )
                    )
                )
                for load, noise in (("quiet_alone", False), ("with_noise", True))
            }
    loads = ("quiet_alone", "with_noise")
    xs = [0.0, float(NOISY_STREAMS)]
    plot = write_plot(
        options,
        NAME,
        [
            Series(
                "inferwire with tenants", xs, [points["tenants"][x]["ttft_p50_ms"] for x in loads]
            ),
            Series(
                "inferwire, one FIFO queue",
                xs,
                [points["fifo"][x]["ttft_p50_ms"] for x in loads],
                baseline=True,
            ),
        ],
        xlabel="noisy tenant's concurrent streams",
        ylabel="quiet tenant's TTFT p50 (ms)",
        title=f"Tenant isolation: {SLOTS} slots, one quiet stream beside {NOISY_STREAMS} noisy",
    )
    rows = [
        [
            label,
            load.replace("_", " "),
            f"{points[label][load]['ttft_p50_ms']:.1f}",
            f"{points[label][load]['ttft_p99_ms']:.1f}",
        ]
        for label in points
        for load in loads
    ]
    noisy_tenants = points["tenants"]["with_noise"]["ttft_p50_ms"]
    noisy_fifo = points["fifo"]["with_noise"]["ttft_p50_ms"]
    return ScenarioResult(
        name=NAME,
        title="Tenant isolation: a quiet interactive tenant's TTFT beside a noisy batch tenant",
        baseline="the same server and load with one FIFO queue (no tenants)",
        data={
            "slots": SLOTS,
            "noisy_streams": NOISY_STREAMS,
            "quiet_requests": quiet_requests,
            "quiet_max_tokens": quiet_tokens,
            "noisy_max_tokens": noisy_tokens,
            "points": points,
            "plot": plot.name,
        },
        ratios={"quiet_ttft_p50_with_noise": ratio(noisy_tenants, noisy_fifo)},
        table_header=["queue", "load", "quiet TTFT p50 ms", "quiet TTFT p99 ms"],
        table_rows=rows,
        targets=[],
        notes=[
            f"The noisy tenant keeps {NOISY_STREAMS} streams of {noisy_tokens} tokens going; "
            f"the quiet one sends {quiet_requests} streams of {quiet_tokens} tokens, one at "
            f"a time; the model runs {SLOTS} at once (engine batching).",
            "With tenants the quiet tenant is interactive and the noisy one batch; FIFO "
            "has no tokens file, so both are the same anonymous tenant.",
        ],
    )
