"""The caller's trace reaches a real `tritonserver`: inferwire continues the client's
`traceparent` and sends its own span's context on the Triton call, which Triton hands
to the model as a request parameter (--grpc-header-forward-pattern=traceparent)."""

from __future__ import annotations

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.triton import SKIP_REASON, TRITON_DIR, wait_for_record

pytestmark = pytest.mark.skipif(TRITON_DIR is None, reason=SKIP_REASON)
otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


async def test_the_client_trace_is_continued_into_the_triton_request(triton_servers, record_dir):
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[
            {
                "name": "traced",
                "backend": "triton",
                "load_on_startup": True,
                "options": {"url": triton_servers["main"].url, "triton_model": "vllm_echo"},
            }
        ],
    )
    gateway = InferwireServer(settings, tracer_provider=otel_sdk.TracerProvider())
    await gateway.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            await stub.Infer(
                pb.InferRequest(
                    model="traced",
                    prompt="a b",
                    request_id="traced-1",
                    parameters=pb.GenerationParameters(max_tokens=2),
                ),
                metadata=(("traceparent", f"00-{TRACE_ID}-{CLIENT_SPAN}-01"),),
            )
    finally:
        await gateway.stop(grace_s=1)
    record = await wait_for_record(record_dir, "vllm_echo", "traced-1")
    version, trace_id, parent_span, flags = record["forwarded"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    # The parent Triton sees is inferwire's span, itself a child of the client's.
    assert parent_span != CLIENT_SPAN and len(parent_span) == 16
