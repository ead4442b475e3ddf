"""One request, one outcome: the access line, the metrics and the trace span all say it.

The fake backend is driven through every outcome of `inferwire.core.record.Outcome`;
for each request the access line's `outcome`, the move of
`inferwire_requests_total{outcome=...}` and the server span's `inferwire.outcome`
must be the same value, and the status code must be the one that outcome implies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwire.core.record import Outcome
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FakeBackends, serving_fakes
from tests.unit.api.test_metrics import metered_settings, scrape

Observed = tuple[InferwireServer, FakeBackends, inference_pb2_grpc.InferenceServiceStub]


@pytest.fixture(scope="module")
async def observed() -> AsyncIterator[tuple[Observed, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with (
        serving_fakes(metered_settings(), tracer_provider=provider) as (server, backends),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        yield (server, backends, inference_pb2_grpc.InferenceServiceStub(channel)), exporter
    provider.shutdown()


async def _finish(stub: Any, request_id: str, **fields: Any) -> None:
    await stub.Infer(pb.InferRequest(prompt="x", request_id=request_id, **fields))


async def _cancel_mid_stream(stub: Any, backends: FakeBackends, request_id: str) -> None:
    backend = backends["m"]
    backend.generation_gate.close()
    backend.started.clear()
    call = stub.InferStream(pb.InferStreamRequest(model="m", prompt="x", request_id=request_id))
    await backend.started.wait()
    closed_before = backend.calls.streams_closed_early
    call.cancel()
    await _stream_closed(backend, closed_before)
    backend.generation_gate.open()


async def _stream_closed(backend: Any, closed_before: int) -> None:
    """Wait (boundedly) until the server has closed the backend's stream: it learns of a
    cancel or deadline through the transport, and an open gate could still finish it."""
    for _ in range(500):
        if backend.calls.streams_closed_early > closed_before:
            return
        await asyncio.sleep(0.01)


async def _miss_the_deadline(stub: Any, backends: FakeBackends, request_id: str) -> None:
    backend = backends["m"]
    backend.generation_gate.close()
    closed_before = backend.calls.streams_closed_early
    try:
        await stub.Infer(pb.InferRequest(model="m", prompt="x", request_id=request_id), timeout=0.3)
    finally:
        await _stream_closed(backend, closed_before)
        backend.generation_gate.open()


async def _fail(stub: Any, backends: FakeBackends, request_id: str) -> None:
    backends["m"].infer_error, backends["m"].error_after_pieces = ValueError("boom"), 1
    try:
        await _finish(stub, request_id, model="m")
    finally:
        backends["m"].infer_error = None


async def _embed(stub: Any, backends: FakeBackends, request_id: str) -> None:
    """An Embed answered, on `m` loaded again as an embedding model for it."""

    async def reloaded(embeds: bool) -> None:
        await stub.UnloadModel(pb.UnloadModelRequest(model="m"))
        backends["m"].embeds = embeds
        await stub.LoadModel(pb.LoadModelRequest(model="m"))

    await reloaded(True)
    try:
        await stub.Embed(pb.EmbedRequest(model="m", inputs=["x", "y"], request_id=request_id))
    finally:
        await reloaded(False)


CASES: dict[Outcome, tuple[str, Any]] = {
    Outcome.ANSWERED: ("OK", _embed),
    Outcome.STOP: ("OK", lambda stub, _, rid: _finish(stub, rid, model="m")),
    Outcome.LENGTH: (
        "OK",
        lambda stub, _, rid: _finish(stub, rid, model="m", parameters={"max_tokens": 2}),
    ),
    Outcome.STOP_SEQUENCE: (
        "OK",
        lambda stub, _, rid: _finish(stub, rid, model="m", parameters={"stop": [","]}),
    ),
    Outcome.REJECTED: (
        "INVALID_ARGUMENT",
        lambda stub, _, rid: _finish(stub, rid, model="m", parameters={"top_p": 2.0}),
    ),
    Outcome.ERROR: ("INTERNAL", _fail),
    Outcome.CANCELLED: ("CANCELLED", _cancel_mid_stream),
    Outcome.DEADLINE_EXCEEDED: ("DEADLINE_EXCEEDED", _miss_the_deadline),
}


def test_every_outcome_has_a_case() -> None:
    assert set(CASES) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
async def test_the_access_line_metrics_and_span_agree_on_the_outcome(
    observed: tuple[Observed, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
    outcome: Outcome,
) -> None:
    (server, backends, stub), exporter = observed
    code, run = CASES[outcome]
    request_id = f"outcome-{outcome.value}"
    caplog.set_level(logging.INFO, logger="inferwire.access")
    exporter.clear()
    labels = frozenset({"model": "m", "outcome": outcome.value}.items())
    before = (await scrape(server))[("inferwire_requests_total", labels)]
    try:
        await run(stub, backends, request_id)
    except grpc.aio.AioRpcError as error:
        assert error.code().name == code
    lines = []
    for _ in range(200):  # the line is written as the handler returns
        lines = [r for r in caplog.records if getattr(r, "request_id", None) == request_id]
        if lines:
            break
        await asyncio.sleep(0.01)
    assert len(lines) == 1, lines
    line = lines[0]
    assert (line.getMessage(), line.outcome, line.code) == ("request finished", outcome.value, code)
    assert line.cancelled is outcome.cancelled
    after = (await scrape(server))[("inferwire_requests_total", labels)]
    assert after - before == 1
    spans = [
        s
        for s in exporter.get_finished_spans()
        if s.name.endswith(("/Infer", "/InferStream", "/Embed"))
    ]
    assert len(spans) == 1, spans
    assert spans[0].attributes is not None
    assert spans[0].attributes["inferwire.outcome"] == outcome.value
    assert spans[0].attributes["inferwire.request_id"] == request_id
