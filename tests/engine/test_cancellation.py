"""Cancellation and deadlines stop the engine, proven by the tokens it generated."""

import asyncio
import logging

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.waiting import model_health, wait_until

MAX_TOKENS = 1000


async def finished_record(request_log, request_id: str):
    async def logged() -> bool:
        return request_log.for_request(request_id) is not None

    await wait_until(logged)
    return request_log.for_request(request_id)


async def test_client_cancel_stops_generation_within_one_token(stub, slow_stub, request_log):
    call = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="demo",
            prompt="Hello",
            request_id="cancel-me",
            parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0),
        )
    )
    for _ in range(3):
        assert (await call.read()).text is not None
    call.cancel()
    record = await finished_record(request_log, "cancel-me")
    assert record.outcome == "cancelled"
    assert record.cancelled
    # The engine checks for cancellation before every token: at most one more.
    assert record.tokens_after_cancel <= 1
    # Generation stopped near where the client was, not at max_tokens.
    assert 3 <= record.completion_tokens < MAX_TOKENS // 5

    async def drained() -> bool:
        return (await model_health(stub, "demo")).inflight == 0

    await wait_until(drained)


async def test_passed_deadline_is_deadline_exceeded_and_stops_generation(slow_stub, request_log):
    call = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="demo",
            prompt="Hello",
            request_id="too-slow",
            parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0),
        ),
        timeout=2.0,
    )
    await call.read()
    # Stop reading: the slow reader's window fills, and the deadline passes.
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.sleep(2.5)
        while await call.read() is not grpc.aio.EOF:
            pass
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    record = await finished_record(request_log, "too-slow")
    assert record.cancelled
    assert record.tokens_after_cancel <= 1
    # Unread, the stream held what the reader's HTTP/2 window and grpc's write buffer take:
    # a bound in bytes, so in tokens it depends on how many share a message (1 ms of
    # tokens do, stream_interval_ms). Unbounded, the model makes all 1000 in about 0.5 s.
    assert record.completion_tokens < MAX_TOKENS // 2


async def test_unary_deadline_while_queued_is_deadline_exceeded(stub, slow_stub):
    holder = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="tight",
            prompt="Hold the slot",
            parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS),
        )
    )
    await holder.read()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="tight", prompt="Wait"), timeout=0.3)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    holder.cancel()

    async def idle() -> bool:
        health = await model_health(stub, "tight")
        return health.inflight == 0 and health.queued == 0

    await wait_until(idle)


async def test_a_client_leaving_while_the_server_waits_on_flow_control_logs_no_error(
    stub, slow_stub, request_log, caplog
):
    caplog.set_level(logging.DEBUG, logger="grpc")
    call = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="demo",
            prompt="Hello",
            request_id="left-mid-write",
            parameters=pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0),
        )
    )
    await call.read()
    # Stop reading until the slow reader's window is full and the server's write waits.
    await asyncio.sleep(1.0)
    call.cancel()
    record = await finished_record(request_log, "left-mid-write")
    assert record.outcome == "cancelled"

    async def drained() -> bool:
        return (await model_health(stub, "demo")).inflight == 0

    await wait_until(drained)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
