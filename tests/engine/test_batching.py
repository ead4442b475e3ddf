"""The engine path (og.Engine batching) against the per-request generator, on the bundled model.

A server of its own serves the bundled model four times: `batched`, `patient` and
`steady` (batching: engine; `steady` is never preempted) and `solo` (per_request), so
the two paths run the same weights, and twice more (`held_*`) with a long
`stream_interval_ms`. A test checks that the default, auto, is per_request on this CPU model.
Every test runs twice: with the engine's scheduler in the server's process, and in a process
of its own (`engine_process: true`, engine_process.py), whose items cross a socket.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import onnxruntime_genai as og
import pytest

from inferwire.backends.ort_genai.backend import builtin_model_path
from inferwire.backends.ort_genai.generator import LOOKAHEAD_DELTAS
from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import SLOW_READER_OPTIONS
from tests.support.waiting import read_rest, wait_until

PROMPTS = ["Once upon a time", "Hello", "The king said", "In the morning", "What is", "My lord"]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module", params=[False, True], ids=["in_process", "engine_process"])
def engine_process(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module")
async def batching_server(engine_process: bool) -> AsyncIterator[InferwireServer]:
    builtin = {"path": "builtin", "engine_process": engine_process}
    server = InferwireServer(
        load_settings(
            server={"address": "127.0.0.1:0", "metrics_address": "", "grace_period_s": 2},
            models=[
                {
                    "name": "batched",
                    "load_on_startup": True,
                    "max_concurrency": 8,
                    "options": {**builtin, "batching": "engine"},
                },
                {
                    # Never preempted: its rows keep the batch they started in.
                    "name": "steady",
                    "load_on_startup": True,
                    "max_concurrency": 8,
                    "options": {**builtin, "batching": "engine", "static_batch_steps": 0},
                },
                {
                    # Preempted only when waiting requests would double its batch.
                    "name": "patient",
                    "load_on_startup": True,
                    "max_concurrency": 8,
                    "options": {**builtin, "batching": "engine", "static_batch_steps": 1_000_000},
                },
                {
                    "name": "solo",
                    "load_on_startup": True,
                    "max_concurrency": 8,
                    "options": {**builtin, "batching": "per_request"},
                },
                *(
                    {
                        "name": f"held_{batching}",
                        "load_on_startup": True,
                        "options": {**builtin, "batching": batching, "stream_interval_ms": 1000},
                    }
                    for batching in ("engine", "per_request")
                ),
            ],
        )
    )
    await server.start()
    yield server
    await server.stop(grace_s=1)


@pytest.fixture(scope="module")
async def batching_stub(batching_server) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{batching_server.port}") as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


async def stream(stub, model: str, prompt: str, request_id: str = "", **parameters):
    """The text, the final message and the message count of one InferStream."""
    call = stub.InferStream(
        pb.InferStreamRequest(
            model=model,
            prompt=prompt,
            request_id=request_id,
            parameters=pb.GenerationParameters(**parameters),
        )
    )
    messages = [message async for message in call]
    return "".join(m.text for m in messages), messages[-1], len(messages)


async def test_concurrent_greedy_streams_equal_their_solo_and_per_request_results(
    batching_stub,
):
    """On `steady`, so the streams stay in the batch they start in (a preemption would
    re-form it; see the cancellation test)."""
    alone = [await stream(batching_stub, "steady", p, max_tokens=40, **GREEDY) for p in PROMPTS]
    per_request = [await stream(batching_stub, "solo", p, max_tokens=40, **GREEDY) for p in PROMPTS]
    together = await asyncio.gather(
        *(stream(batching_stub, "steady", p, max_tokens=40, **GREEDY) for p in PROMPTS)
    )
    for (text, end, _), (solo_text, solo_end, _), (gen_text, gen_end, _) in zip(
        together, alone, per_request, strict=True
    ):
        assert text == solo_text == gen_text
        assert end.usage == solo_end.usage == gen_end.usage
        assert end.finish_reason == solo_end.finish_reason == gen_end.finish_reason
        assert text


@pytest.mark.parametrize(
    ("held", "every_token"), [("held_engine", "steady"), ("held_per_request", "solo")]
)
async def test_a_long_stream_interval_sends_the_same_text_in_fewer_messages(
    batching_stub, held, every_token
):
    """With stream_interval_ms 1000, a stream is its first token, then a message a second or
    whenever the path's look-ahead fills (8 deltas on the per-request path, 16 on the
    engine's), then what was held with the end, and the final message: a bound that holds
    however fast the machine is, where every token would be a message without it."""
    reference, reference_end, _ = await stream(
        batching_stub, every_token, "Once upon a time", max_tokens=48, **GREEDY
    )
    started = time.monotonic()
    text, end, count = await stream(
        batching_stub, held, "Once upon a time", max_tokens=48, **GREEDY
    )
    elapsed_s = time.monotonic() - started
    assert text == reference
    assert end.usage.completion_tokens == reference_end.usage.completion_tokens > 8
    assert count <= 3 + elapsed_s + end.usage.completion_tokens / LOOKAHEAD_DELTAS


async def test_concurrent_sampled_streams_honour_max_tokens_and_stop(batching_stub):
    sampled = {"temperature": 0.9, "top_p": 0.95, "top_k": 40}
    limits = [3, 9, 17, 33, 5, 12]
    bounded = await asyncio.gather(
        *(
            stream(batching_stub, "batched", p, max_tokens=n, **sampled)
            for p, n in zip(PROMPTS, limits, strict=True)
        )
    )
    stopped = await asyncio.gather(
        *(
            stream(batching_stub, "batched", p, max_tokens=64, stop=["e"], **sampled)
            for p in PROMPTS
        )
    )
    for (text, end, _), limit in zip(bounded, limits, strict=True):
        assert 0 < end.usage.completion_tokens <= limit
        if end.finish_reason == pb.FINISH_REASON_LENGTH:
            assert end.usage.completion_tokens == limit
        else:
            assert end.finish_reason == pb.FINISH_REASON_STOP
        text.encode("utf-8")  # well-formed: no lone surrogates from split characters
    for text, end, _ in stopped:
        assert "e" not in text
        assert end.finish_reason in (pb.FINISH_REASON_STOP_SEQUENCE, pb.FINISH_REASON_STOP)
    assert any(end.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE for _, end, _ in stopped)


async def test_cancelling_one_request_mid_batch_stops_it_and_leaves_the_others_intact(
    batching_stub, request_log
):
    """The victim and the others start in one batch (on `steady`, so no preemption re-forms
    it: a re-prefilled row changes its batch-mates' padding, and with it low-order float
    bits that can flip a greedy near-tie; see docs/ort_genai_batching.md)."""
    others = PROMPTS[:4]
    alone = [await stream(batching_stub, "steady", p, max_tokens=80, **GREEDY) for p in others]
    victim = batching_stub.InferStream(
        pb.InferStreamRequest(
            model="steady",
            prompt="Hello",
            request_id="batch-victim",
            parameters=pb.GenerationParameters(max_tokens=1000, **GREEDY),
        )
    )
    running = [
        asyncio.ensure_future(stream(batching_stub, "steady", p, max_tokens=80, **GREEDY))
        for p in others
    ]
    for _ in range(3):
        await victim.read()
    victim.cancel()
    together = await asyncio.gather(*running)
    assert [text for text, _, _ in together] == [text for text, _, _ in alone]

    async def logged() -> bool:
        return request_log.for_request("batch-victim") is not None

    await wait_until(logged)
    record = request_log.for_request("batch-victim")
    assert record.outcome == "cancelled"
    assert record.tokens_after_cancel <= 1
    assert 3 <= record.completion_tokens < 200


async def test_seeded_requests_take_the_per_request_path_and_reproduce(batching_stub):
    seeded = {"temperature": 0.9, "top_k": 40, "seed": 1234, "max_tokens": 32}
    # Alongside engine traffic, so the engine is busy while the seeded requests run.
    busy = [
        asyncio.ensure_future(stream(batching_stub, "batched", p, max_tokens=64, **GREEDY))
        for p in PROMPTS[:3]
    ]
    first, second = await asyncio.gather(
        stream(batching_stub, "batched", "Once upon a time", **seeded),
        stream(batching_stub, "batched", "Once upon a time", **seeded),
    )
    await asyncio.gather(*busy)
    per_request, _, _ = await stream(batching_stub, "solo", "Once upon a time", **seeded)
    assert first[0] == second[0] == per_request
    other_seed, _, _ = await stream(
        batching_stub, "batched", "Once upon a time", **{**seeded, "seed": 99}
    )
    assert other_seed != first[0]


async def test_a_stalled_reader_is_parked_and_resumes_where_it_left_off(
    batching_server, batching_stub, request_log
):
    """A row of a shared batch cannot wait for its reader: it is preempted with a bounded
    buffer, the others go on, and once read again it continues token for token."""
    alone, alone_end, _ = await stream(batching_stub, "batched", "Hello", max_tokens=400, **GREEDY)
    target = f"127.0.0.1:{batching_server.port}"
    async with grpc.aio.insecure_channel(target, options=SLOW_READER_OPTIONS) as slow:
        stalled = inference_pb2_grpc.InferenceServiceStub(slow).InferStream(
            pb.InferStreamRequest(
                model="batched",
                prompt="Hello",
                request_id="stalled-reader",
                parameters=pb.GenerationParameters(max_tokens=400, **GREEDY),
            )
        )
        first = await stalled.read()
        others = await asyncio.gather(
            *(stream(batching_stub, "batched", p, max_tokens=200, **GREEDY) for p in PROMPTS)
        )
        assert all(end.usage.completion_tokens > 0 for _, end, _ in others)
        rest = await read_rest(stalled)
    assert first.text + "".join(m.text for m in rest) == alone
    assert rest[-1].usage == alone_end.usage


@pytest.mark.parametrize("model", ["batched", "patient"])
async def test_a_short_request_is_not_held_behind_a_long_batch(
    batching_stub, request_log, model: str
):
    """A static engine batch is preempted for waiting requests, so a short request
    finishes while a long one still runs: on `batched` after static_batch_steps, and on
    `patient` (a million steps) because one waiting request doubles a batch of one."""
    long_call = batching_stub.InferStream(
        pb.InferStreamRequest(
            model=model,
            prompt="Hello",
            request_id=f"long-runner-{model}",
            parameters=pb.GenerationParameters(max_tokens=1000, **GREEDY),
        )
    )
    await long_call.read()
    short = await batching_stub.Infer(
        pb.InferRequest(
            model=model, prompt="My lord", parameters=pb.GenerationParameters(max_tokens=8)
        )
    )
    assert short.usage.completion_tokens > 0
    long_call.cancel()

    async def logged() -> bool:
        return request_log.for_request(f"long-runner-{model}") is not None

    await wait_until(logged)
    # Still running when the short one had finished: it was cancelled, not completed.
    assert request_log.for_request(f"long-runner-{model}").outcome == "cancelled"


async def test_the_default_on_a_cpu_model_is_the_continuous_path(
    batching_stub, engine_process: bool
):
    """`batching: auto` on the CPU is the continuous path (every feature, one session's
    steps); og.Engine serves only when asked. Health says which path serves each model."""
    server = InferwireServer(
        load_settings(
            server={"address": "127.0.0.1:0", "metrics_address": "", "grace_period_s": 2},
            models=[{"name": "plain", "load_on_startup": True, "options": {"path": "builtin"}}],
        )
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            plain = await stub.Health(pb.HealthRequest(model="plain"))
    finally:
        await server.stop(grace_s=1)
    assert plain.models[0].detail.startswith("in-process on cpu, continuous batching of ")
    batched = await batching_stub.Health(pb.HealthRequest(model="batched"))
    width = _rows_og_engine_steps(8)
    rows = "" if width == 8 else f", {width} rows a step"
    where = "engine process" if engine_process else "in-process"
    expected = f"{where} on cpu, og.Engine static batching of up to 8{rows}"
    assert batched.models[0].detail == expected


def _rows_og_engine_steps(max_batch_size: int) -> int:
    """The rows one step of a static og.Engine configured for `max_batch_size` takes when
    that many requests wait, counted here on og.Engine itself (0.18 steps 4)."""
    config = og.Config(str(builtin_model_path()))
    config.overlay(json.dumps({"engine": {"static_batching": {"max_batch_size": max_batch_size}}}))
    engine = og.Engine(og.Model(config))
    events = engine.create_event_buffer(64)
    requests = []
    for _ in range(max_batch_size):
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(1)
        request.begin_turn(np.array([5, 6, 7], dtype=np.int32), turn)
        requests.append(request)
    engine.run(events)
    width = sum(1 for event in events if int(event.flags) & int(og.EngineEventFlags.TOKEN))
    while engine.has_pending_requests():
        engine.run(events)
    for request in requests:
        request.close()
    return width
