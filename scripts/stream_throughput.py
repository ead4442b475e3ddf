"""Tokens/s of InferStream through the gateway against og.Engine driven directly.

    python scripts/stream_throughput.py [--streams 1 16] [--tokens 256] [--repeat 3]
        [--batching engine|per_request] [--profile FILE]

The gateway runs as a real `inferwire serve` process on 127.0.0.1:0 serving the
bundled model; the client is this process (grpc.aio). The direct baseline drives
`og.Engine` in this process with the same prompts, greedy, decoding every token to
text with a TokenizerStream. Each figure is the median of `--repeat` runs. With
`--profile`, the server runs under pyinstrument (its event-loop thread) and the
text report is written to FILE when the server stops.

This is a measuring tool for the issue notes, not the benchmark suite (`bench/`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import onnxruntime_genai as og

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

PROMPTS = ["Once upon a time", "Hello", "The king said", "In the morning", "What is", "My lord"]


def prompt(i: int) -> str:
    return PROMPTS[i % len(PROMPTS)]


_ENGINES: dict[int, tuple[og.Engine, og.Tokenizer]] = {}


def engine_for(streams: int) -> tuple[og.Engine, og.Tokenizer]:
    """A warmed og.Engine whose static batch takes `streams` requests (cached)."""
    if streams not in _ENGINES:
        config = og.Config(str(builtin_model_path()))
        config.clear_providers()
        overlay = {"engine": {"static_batching": {"max_batch_size": streams}}}
        config.overlay(json.dumps(overlay))
        model = og.Model(config)
        engine, tokenizer = og.Engine(model), og.Tokenizer(model)
        _ENGINES[streams] = (engine, tokenizer)
        run_engine(engine, tokenizer, 1, 8)  # first-run initialisation, not measured
    return _ENGINES[streams]


def run_engine(engine: og.Engine, tokenizer: og.Tokenizer, streams: int, tokens: int) -> int:
    buffer = engine.create_event_buffer(max(64, 4 * streams))
    detokenizers = {}
    for i in range(streams):
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(tokens)
        request.begin_turn(np.array(tokenizer.encode(prompt(i)), dtype=np.int32), turn)
        detokenizers[request] = tokenizer.create_stream()
    generated = 0
    while engine.has_pending_requests():
        engine.run(buffer)
        for event in buffer:
            if event.flags & og.EngineEventFlags.TOKEN:
                generated += 1
                detokenizers[event.request].decode(event.token)
    for request in detokenizers:
        request.close()
    return generated


def direct_engine(streams: int, tokens: int) -> float:
    """Aggregate tokens/s of og.Engine with `streams` requests submitted together, greedy,
    each token decoded to text as the gateway does."""
    engine, tokenizer = engine_for(streams)
    started = time.perf_counter()
    generated = run_engine(engine, tokenizer, streams, tokens)
    return generated / (time.perf_counter() - started)


def start_server(config_file: Path, profile: Path | None) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "pyinstrument", "-r", "text", "-o", str(profile)]
    command += ["-m", "inferwire.cli", "serve", "-c", str(config_file), "-a", "127.0.0.1:0"]
    env = {**os.environ, "INFERWIRE_SERVER__METRICS_ADDRESS": ""}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    port: list[int] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if '"listening"' in line:
                port.append(json.loads(line)["port"])
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(120):
        process.kill()
        raise SystemExit("the server did not start")
    return process, port[0]


async def gateway(target: str, streams: int, tokens: int) -> float:
    """Aggregate tokens/s of `streams` concurrent InferStream calls."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def one(i: int) -> int:
            call = stub.InferStream(
                pb.InferStreamRequest(
                    model="demo",
                    prompt=prompt(i),
                    parameters=pb.GenerationParameters(max_tokens=tokens, temperature=0),
                )
            )
            last = None
            async for message in call:
                last = message
            assert last is not None
            return last.usage.completion_tokens

        for _ in range(100):  # warm the channel and the engine; wait for the start-up load
            try:
                await one(0)
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
        started = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batching", choices=["engine", "per_request"], default=None)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()

    options: dict[str, object] = {"path": "builtin"}
    if args.batching is not None:
        options["batching"] = args.batching
    # The bundled model stops at its end-of-sequence token; a small repetition of the
    # prompts keeps generations long, but counts are what each stream really produced.
    config = {
        "models": [
            {
                "name": "demo",
                "load_on_startup": True,
                "max_concurrency": max(args.streams),
                "options": options,
            }
        ]
    }
    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / "inferwire.yaml"
        config_file.write_text(json.dumps(config))
        process, port = start_server(config_file, args.profile)
        try:
            time.sleep(1.0)  # the start-up load
            for streams in args.streams:
                through = [
                    asyncio.run(gateway(f"127.0.0.1:{port}", streams, args.tokens))
                    for _ in range(args.repeat)
                ]
                direct = [direct_engine(streams, args.tokens) for _ in range(args.repeat)]
                g, d = statistics.median(through), statistics.median(direct)
                print(
                    f"streams={streams:3d} gateway {g:8.0f} tok/s  og.Engine direct {d:8.0f} "
                    f"tok/s  ratio {g / d:.2f}  (runs: gateway {[round(x) for x in through]}, "
                    f"direct {[round(x) for x in direct]})",
                    flush=True,
                )
        finally:
            process.send_signal(2)  # SIGINT: a clean stop, so pyinstrument writes its report
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
