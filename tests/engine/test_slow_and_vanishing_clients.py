"""Slow and vanishing clients against a real `inferwire serve` (`server_process`): a slow
reader holds a long stream without the server's memory growing (flow control pauses the
engine), and a client killed mid-stream frees its slot and stops generation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import grpc

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures
from tests.support.engine import SLOW_READER_OPTIONS
from tests.support.process import ServerProcess, wait_serving
from tests.support.waiting import model_health, wait_until

MAX_TOKENS = 1000
RSS_SAMPLES = 20
# Generous: a server that buffered the stream would grow by the whole generation per
# second of slow reading; a paused one stays within allocator noise.
RSS_GROWTH_BOUND_MIB = 16.0
LONG = pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0)
# A client that starts a stream, says so, and waits to be killed.
VANISHING_CLIENT = """
import sys, time, grpc
from inferwire.v1 import inference_pb2 as pb, inference_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1], options=[("grpc.http2.lookahead_bytes", 1024)])
call = inference_pb2_grpc.InferenceServiceStub(channel).InferStream(pb.InferStreamRequest(
    model="demo", prompt="Hello", request_id="vanishing",
    parameters=pb.GenerationParameters(max_tokens=1000, temperature=0)))
next(call)
print("started", flush=True)
time.sleep(600)
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def request_record(server: ServerProcess, request_id: str) -> dict | None:
    for line in server.log_lines:
        if f'"{request_id}"' in line and '"request finished"' in line:
            return json.loads(line)
    return None


async def finished_record(server: ServerProcess, request_id: str) -> dict:
    """The request's log record, once the server has written it."""

    async def logged() -> bool:
        return request_record(server, request_id) is not None

    await wait_until(logged, timeout_s=20)
    record = request_record(server, request_id)
    assert record is not None
    return record


async def ttft_ms(stub, count: int = 5) -> list[float]:
    times = []
    for _ in range(count):
        request = pb.InferRequest(model="demo", prompt="The", parameters=pb.GenerationParameters(
            max_tokens=8, temperature=0))  # fmt: skip
        times.append((await stub.Infer(request, timeout=10)).timing.time_to_first_token_ms)
    return times


async def test_a_slow_reader_holds_a_long_stream_without_the_server_growing(server_process):
    served = server_process
    await asyncio.to_thread(wait_serving, served)
    async with (
        grpc.aio.insecure_channel(served.target) as channel,
        grpc.aio.insecure_channel(served.target, options=SLOW_READER_OPTIONS) as slow,
    ):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        before = await ttft_ms(stub)
        call = inference_pb2_grpc.InferenceServiceStub(slow).InferStream(
            pb.InferStreamRequest(
                model="demo", prompt="Hello", request_id="slow-reader", parameters=LONG
            ),
            timeout=60,
        )
        await call.read()
        samples, during = [], []
        for _ in range(RSS_SAMPLES):
            samples.append(rss_mib(served.process.pid))
            during += await ttft_ms(stub, count=1)
            await call.read()  # one message now and then: far slower than generation
            await asyncio.sleep(0.1)
        call.cancel()
    generated = (await finished_record(served, "slow-reader"))["completion_tokens"]
    growth = max(samples) - samples[0]
    figures.record(
        "slow reader",
        f"server RSS {samples[0]:.1f} MiB at the start, max {max(samples):.1f}, last "
        f"{samples[-1]:.1f} over {RSS_SAMPLES} samples (growth {growth:.1f} MiB); "
        f"the stream's tokens generated {generated} of {MAX_TOKENS}; other clients' TTFT median "
        f"{statistics.median(before):.1f} ms before, {statistics.median(during):.1f} ms during",
    )
    assert growth < RSS_GROWTH_BOUND_MIB
    # Flow control paused the engine: far fewer tokens than the stream asked for.
    assert generated < MAX_TOKENS // 2


async def test_a_client_killed_mid_stream_frees_its_slot_and_stops_generation(server_process):
    served = server_process
    await asyncio.to_thread(wait_serving, served)
    client = subprocess.Popen(
        [sys.executable, "-c", VANISHING_CLIENT, served.target],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    try:
        assert client.stdout is not None
        assert await asyncio.to_thread(client.stdout.readline) == "started\n"
        async with grpc.aio.insecure_channel(served.target) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            assert (await model_health(stub, "demo")).inflight == 1
            client.send_signal(signal.SIGKILL)
            record = await finished_record(served, "vanishing")
            assert record["code"] == "CANCELLED"
            assert record["completion_tokens"] < MAX_TOKENS // 2
            assert record["tokens_after_cancel"] <= 1

            async def freed() -> bool:
                return (await model_health(stub, "demo")).inflight == 0

            await wait_until(freed)
    finally:
        client.kill()
        client.wait(timeout=10)
