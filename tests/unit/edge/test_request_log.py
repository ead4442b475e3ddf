"""Every inference request writes exactly one record, with its status code and real counts."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb


def records(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "inferwire.access" and getattr(r, "request_id", None) == request_id
    ]


async def one_record(caplog: pytest.LogCaptureFixture, request_id: str) -> logging.LogRecord:
    # The handler writes it as it returns; a failed call's status reaches the client as the
    # server aborts, a moment before that (longer on a loaded machine): yield, then wait.
    for attempt in range(600):
        if found := records(caplog, request_id):
            assert len(found) == 1, found
            return found[0]
        await asyncio.sleep(0 if attempt < 100 else 0.01)
    raise AssertionError(f"no record for {request_id}")


@pytest.mark.parametrize(
    ("model", "parameters", "code", "outcome"),
    [
        ("m", {}, "OK", "STOP"),
        ("m", {"max_tokens": 2}, "OK", "LENGTH"),
        ("m", {"top_p": 2.0}, "INVALID_ARGUMENT", "rejected"),
        ("ghost", {}, "NOT_FOUND", "rejected"),
        ("idle", {}, "FAILED_PRECONDITION", "rejected"),
    ],
)
@pytest.mark.parametrize("rpc", ["Infer", "InferStream"])
async def test_each_request_writes_one_record_with_its_code(
    served, caplog, rpc, model, parameters, code, outcome
):
    stub, _, _ = served
    caplog.set_level(logging.INFO, logger="inferwire.access")
    request_id = f"{rpc}-{model}-{code}-{outcome}"
    fields = {
        "model": model,
        "prompt": "hi",
        "request_id": request_id,
        "parameters": pb.GenerationParameters(**parameters),
    }
    try:
        if rpc == "Infer":
            await stub.Infer(pb.InferRequest(**fields))
        else:
            [m async for m in stub.InferStream(pb.InferStreamRequest(**fields))]
    except grpc.aio.AioRpcError as error:
        assert error.code().name == code
    record = await one_record(caplog, request_id)
    assert (record.code, record.outcome, record.model) == (code, outcome, model)
    expected_tokens = (3, min(3, parameters.get("max_tokens", 3))) if code == "OK" else (0, 0)
    assert (record.prompt_tokens, record.completion_tokens) == expected_tokens


async def test_a_backend_failure_is_logged_with_its_code_and_the_tokens_so_far(served, caplog):
    stub, backends, _ = served
    caplog.set_level(logging.INFO, logger="inferwire.access")
    backends["m"].infer_error, backends["m"].error_after_pieces = RuntimeError("boom"), 2
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Infer(pb.InferRequest(model="m", prompt="hi", request_id="fails"))
    finally:
        backends["m"].infer_error = None
    record = await one_record(caplog, "fails")
    assert (record.code, record.outcome, record.completion_tokens) == ("INTERNAL", "error", 2)


async def test_a_cancelled_stream_is_logged_cancelled_with_the_tokens_it_produced(served, caplog):
    stub, backends, _ = served
    caplog.set_level(logging.INFO, logger="inferwire.access")
    backend = backends["m"]
    backend.pieces = ["a", "b", "c", "d"]
    backend.generation_gate.close()
    backend.started.clear()
    try:
        call = stub.InferStream(pb.InferStreamRequest(model="m", prompt="x", request_id="left"))
        await backend.started.wait()
        call.cancel()
        record = await one_record_eventually(caplog, "left")
    finally:
        backend.generation_gate.open()
        backend.pieces = ["Hello", ",", " world"]
    assert (record.code, record.outcome, record.cancelled) == ("CANCELLED", "cancelled", True)
    assert record.prompt_tokens == 3


async def one_record_eventually(caplog: pytest.LogCaptureFixture, request_id: str):
    """Cancellation reaches the server through the transport: wait for it, boundedly."""
    for _ in range(500):
        if records(caplog, request_id):
            return await one_record(caplog, request_id)
        await asyncio.sleep(0.01)
    raise AssertionError(f"no record for {request_id}")
