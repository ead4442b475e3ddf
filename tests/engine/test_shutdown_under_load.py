"""SIGTERM to a real `inferwire serve` with 16 streams in flight: each finishes in full
within the grace period, new calls are refused, and the process exits 0; HTTP streams
drain with the gRPC ones."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import grpc
import httpx

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures
from tests.support.engine import SLOW_READER_OPTIONS
from tests.support.process import start_serving_server, stop_server_process
from tests.support.waiting import read_rest

STREAMS = 16
MAX_TOKENS = 300
GRACE_S = 30
# Every stream holds a slot, so none waits in the queue behind a stream we do not read.
CONFIG = f"models:\n  - {{name: demo, load_on_startup: true, max_concurrency: {STREAMS}}}\n"


async def refusals_until_unavailable(
    stub: inference_pb2_grpc.InferenceServiceStub,
) -> list[grpc.StatusCode]:
    """ListModels every 50 ms until a call is refused UNAVAILABLE (at most 200 tries): the
    codes of the calls refused on the way."""
    refusals: list[grpc.StatusCode] = []
    for _ in range(200):
        try:
            await stub.ListModels(pb.ListModelsRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            refusals.append(error.code())
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                break
        await asyncio.sleep(0.05)
    return refusals


async def test_sigterm_during_16_streams_finishes_each_refuses_new_calls_and_exits_zero(
    tmp_path,
):
    config = tmp_path / "inferwire.yaml"
    config.write_text(CONFIG)
    server = start_serving_server("--config", str(config), "--grace-period", str(GRACE_S))
    try:
        async with (
            grpc.aio.insecure_channel(server.target) as channel,
            grpc.aio.insecure_channel(server.target, options=SLOW_READER_OPTIONS) as slow,
        ):
            streaming = inference_pb2_grpc.InferenceServiceStub(slow)
            request = pb.InferStreamRequest(
                model="demo",
                prompt="Hello",
                parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0),
            )
            calls = [streaming.InferStream(request, timeout=GRACE_S + 30) for _ in range(STREAMS)]
            # Each stream has begun; flow control now holds it until it is read again.
            firsts = await asyncio.gather(*(call.read() for call in calls))

            server.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            refusals = await refusals_until_unavailable(stub)
            assert refusals and refusals[-1] == grpc.StatusCode.UNAVAILABLE, refusals
            # gRPC core cancels a call it had received but not yet handed to the server
            # when its shutdown began (CI saw one): only that one call, at the boundary.
            assert refusals[:-1] in ([], [grpc.StatusCode.CANCELLED]), refusals

            rests = await asyncio.gather(*(read_rest(call) for call in calls))
            drained_s = time.monotonic() - signalled
            texts = set()
            for first, rest in zip(firsts, rests, strict=True):
                assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
                assert rest[-1].usage.completion_tokens == MAX_TOKENS
                texts.add("".join(m.text for m in [first, *rest]))
            assert len(texts) == 1 and texts != {""}  # greedy: every stream the same, in full
        exit_code = await asyncio.to_thread(server.process.wait, GRACE_S + 10)
        figures.record(
            "shutdown under load",
            f"{STREAMS} streams of {MAX_TOKENS} tokens finished {drained_s:.1f} s after SIGTERM "
            f"(grace {GRACE_S} s); exit code {exit_code}",
        )
        assert exit_code == 0
    finally:
        stop_server_process(server)


async def test_sigterm_drains_http_streams_with_grpc_ones(tmp_path):
    config = tmp_path / "inferwire.yaml"
    config.write_text(CONFIG)
    server = start_serving_server("--config", str(config), "--grace-period", str(GRACE_S))
    body = {"model": "demo", "prompt": "Hello", "max_tokens": MAX_TOKENS, "temperature": 0}
    try:
        async with (
            httpx.AsyncClient(base_url=server.http_url, timeout=GRACE_S + 30) as client,
            grpc.aio.insecure_channel(server.target, options=SLOW_READER_OPTIONS) as slow,
        ):
            grpc_call = inference_pb2_grpc.InferenceServiceStub(slow).InferStream(
                pb.InferStreamRequest(
                    model="demo",
                    prompt="Hello",
                    parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0),
                ),
                timeout=GRACE_S + 30,
            )
            await grpc_call.read()
            async with client.stream(
                "POST", "/v1/completions", json={**body, "stream": True}
            ) as reply:
                lines = reply.aiter_lines()
                first = await anext(lines)
                assert first.startswith("data: {")
                server.process.send_signal(signal.SIGTERM)
                events = [line async for line in lines if line]
            assert events[-1] == "data: [DONE]"
            finish = json.loads(events[-2].removeprefix("data: "))["choices"][0]["finish_reason"]
            assert finish == "length"
            rest = await read_rest(grpc_call)
            assert rest[-1].usage.completion_tokens == MAX_TOKENS
        assert await asyncio.to_thread(server.process.wait, GRACE_S + 10) == 0
    finally:
        stop_server_process(server)
