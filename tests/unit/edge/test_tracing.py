"""OpenTelemetry tracing: the server span continues the client's traceparent, with
child spans for the stages of a request; the SDK's in-memory exporter records them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from inferwire.backends.triton.endpoints import trace_metadata
from inferwire.config import load_settings
from inferwire.core.errors import BackendUnavailableError, ConfigurationError
from inferwire.edge.tracing import server_tracing, tracing_requested
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes
from tests.support.waiting import wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
INFER = "inferwire.v1.InferenceService/Infer"

Traced = tuple[inference_pb2_grpc.InferenceServiceStub, FakeBackends, InMemorySpanExporter]


@pytest.fixture(scope="module")
async def traced() -> AsyncIterator[Traced]:
    # The provider is the server's own, passed in: the global one is never set.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = load_settings(
        server={"address": "127.0.0.1:0", "metrics_address": "", "health_check_interval_s": 3600},
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    async with (
        serving_fakes(settings, tracer_provider=provider) as (server, backends),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        yield inference_pb2_grpc.InferenceServiceStub(channel), backends, exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    spans = exporter.get_finished_spans()
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


async def with_server_span(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The finished spans once the RPC's own has ended: a failed RPC's status reaches the
    client as the server aborts, a moment before its interceptors end the span."""

    async def ended() -> bool:
        return INFER in by_name(exporter)

    await wait_until(ended)
    return by_name(exporter)


async def test_a_client_traceparent_is_continued_with_stage_spans_under_the_server_span(
    traced: Traced,
) -> None:
    stub, _, exporter = traced
    exporter.clear()
    await stub.Infer(
        pb.InferRequest(model="m", prompt="hi"), metadata=(("traceparent", TRACEPARENT),)
    )
    spans = by_name(exporter)
    assert set(spans) == {INFER, "queue", "tokenize", "generate"}
    server = spans[INFER]
    assert server.kind is SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and format(server.parent.span_id, "016x") == PARENT_ID
    assert server.parent.is_remote
    assert server.attributes is not None
    assert dict(server.attributes) == {
        "rpc.system": "grpc",
        "rpc.service": "inferwire.v1.InferenceService",
        "rpc.method": "Infer",
        "rpc.grpc.status_code": 0,
        "inferwire.request_id": server.attributes["inferwire.request_id"],
        "inferwire.model": "m",
        "inferwire.outcome": "STOP",
        "inferwire.prompt_tokens": 3,
        "inferwire.completion_tokens": 3,
        "inferwire.queue_ms": server.attributes["inferwire.queue_ms"],
    }
    assert server.status.status_code is StatusCode.UNSET
    for stage in ("queue", "tokenize", "generate"):
        assert spans[stage].context.trace_id == server.context.trace_id
        assert spans[stage].parent is not None
        assert spans[stage].parent.span_id == server.context.span_id


async def test_the_access_line_carries_the_trace_id_of_streamed_and_unary_requests(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    stub, _, _ = traced
    caplog.set_level(logging.INFO, logger="inferwire.access")
    metadata = (("traceparent", TRACEPARENT),)
    await stub.Infer(pb.InferRequest(model="m", prompt="hi", request_id="t-1"), metadata=metadata)
    call = stub.InferStream(
        pb.InferStreamRequest(model="m", prompt="hi", request_id="t-2"), metadata=metadata
    )
    assert [chunk async for chunk in call]
    await stub.Infer(pb.InferRequest(model="m", prompt="hi", request_id="t-3"))
    lines = {r.request_id: r for r in caplog.records if r.name == "inferwire.access"}
    assert lines["t-1"].trace_id == lines["t-2"].trace_id == TRACE_ID
    # Without a traceparent the server span starts a trace of its own; the line names it.
    assert len(lines["t-3"].trace_id) == 32 and lines["t-3"].trace_id != TRACE_ID


async def test_a_streamed_request_is_traced_too(traced: Traced) -> None:
    stub, _, exporter = traced
    exporter.clear()
    call = stub.InferStream(
        pb.InferStreamRequest(model="m", prompt="hi"), metadata=(("traceparent", TRACEPARENT),)
    )
    assert [chunk async for chunk in call]
    spans = by_name(exporter)
    server = spans["inferwire.v1.InferenceService/InferStream"]
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert spans["generate"].parent is not None
    assert spans["generate"].parent.span_id == server.context.span_id


async def test_without_a_traceparent_the_server_span_starts_a_new_trace(traced: Traced) -> None:
    stub, _, exporter = traced
    exporter.clear()
    await stub.Infer(pb.InferRequest(model="m", prompt="hi"))
    spans = by_name(exporter)
    server = spans[INFER]
    assert server.parent is None
    assert format(server.context.trace_id, "032x") != TRACE_ID
    assert spans["generate"].context.trace_id == server.context.trace_id


async def test_a_backend_failure_sets_the_error_status_on_the_spans(traced: Traced) -> None:
    stub, backends, exporter = traced
    exporter.clear()
    backends["m"].infer_error = BackendUnavailableError("stub crashed")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Infer(pb.InferRequest(model="m", prompt="hi"))
    finally:
        backends["m"].infer_error = None
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    spans = await with_server_span(exporter)
    server = spans[INFER]
    assert server.status.status_code is StatusCode.ERROR
    assert server.status.description is not None
    assert server.status.description.startswith("UNAVAILABLE")
    assert server.attributes is not None
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert spans["generate"].status.status_code is StatusCode.ERROR


async def test_a_client_error_leaves_the_server_span_status_unset(traced: Traced) -> None:
    stub, _, exporter = traced
    exporter.clear()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model="ghost", prompt="hi"))
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    server = (await with_server_span(exporter))[INFER]
    assert server.status.status_code is StatusCode.UNSET
    assert server.attributes is not None
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.mark.parametrize(
    ("setting", "environ", "expected"),
    [
        (None, {}, False),
        (None, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
        (None, {"OTEL_SERVICE_NAME": "gateway"}, True),
        (None, {"OTEL_SERVICE_NAME": "gateway", "OTEL_TRACES_EXPORTER": "none"}, False),
        (None, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
        (True, {}, True),
        (False, {"OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_the_setting_overrides_what_the_otel_variables_ask_for(
    setting: bool | None, environ: dict[str, str], expected: bool
) -> None:
    assert tracing_requested(setting, environ) is expected


def test_tracing_asked_for_without_the_extra_is_a_start_up_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("inferwire.edge.tracing.available", lambda: False)
    with pytest.raises(ConfigurationError, match=r"pip install 'inferwire\[otel\]'"):
        server_tracing(True)
    settings = load_settings(server={"address": "127.0.0.1:0", "tracing": True}, models=[])
    with pytest.raises(ConfigurationError, match=r"server\.tracing is true"):
        InferwireServer(settings)


def test_an_exporter_that_is_not_installed_is_a_start_up_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no-such-exporter")
    with pytest.raises(ConfigurationError, match="no-such-exporter"):
        server_tracing(None)


def test_tracing_is_off_by_default() -> None:
    assert server_tracing(False) is None


def test_the_triton_backend_passes_the_current_context_on_as_traceparent() -> None:
    provider = TracerProvider()
    assert trace_metadata() == ()  # outside a trace: nothing
    with provider.get_tracer("test").start_as_current_span("rpc") as span:
        metadata = dict(trace_metadata())
    context = span.get_span_context()
    assert metadata["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
