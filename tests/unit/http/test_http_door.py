"""The HTTP door over fake backends, in-process: TLS and mutual TLS from the same files as
gRPC (rotated, the client certificate's tenant), its SERVER span continuing `traceparent`,
the status of each domain error, and an error after a stream's first event (Chat
Completions' and Responses')."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwire.config import load_settings
from inferwire.core.errors import BackendUnavailableError, QueueFullError
from tests.support.certs import CertificateAuthority, served_certificate_serial
from tests.support.fake_backend import FAKE_BACKEND, serving_fakes, switched
from tests.support.waiting import wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
BODY = {"model": "m", "prompt": "hi", "max_tokens": 8}


def settings(**server: Any) -> Any:
    return load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600, **server},
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )


def client_context(
    ca: CertificateAuthority, certificate: Any = None, tmp: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    if certificate is not None and tmp is not None:
        cert, key = certificate.write(tmp, "client")
        context.load_cert_chain(cert, key)
    return context


async def test_tls_and_mutual_tls_use_the_grpc_files_and_name_the_certificate_s_tenant(
    tmp_path, caplog
):
    ca = CertificateAuthority()
    cert, key = ca.issue_server().write(tmp_path, "tls")
    client_ca = ca.write(tmp_path, "ca")
    tls = {"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(client_ca)}
    tenants = {"tenants": [{"name": "certified"}]}
    auth = {"auth": {"certificate_tenants": {"reporter": "certified"}}}
    caplog.set_level("INFO", logger="inferwire.access")
    async with serving_fakes(settings(tls=tls, **tenants, **auth)) as (server, _):
        url = f"https://127.0.0.1:{server.http_port}/v1/completions"
        context = client_context(ca, ca.issue_client("reporter"), tmp_path)
        async with httpx.AsyncClient(verify=context) as client:
            reply = await client.post(url, json=BODY)
        assert reply.status_code == 200, reply.text
        with pytest.raises(httpx.HTTPError):  # no client certificate: no handshake
            async with httpx.AsyncClient(verify=client_context(ca)) as client:
                await client.post(url, json=BODY)

        async def logged() -> bool:
            return any(getattr(r, "method", "") == "POST /v1/completions" for r in caplog.records)

        await wait_until(logged)
    [line] = [r for r in caplog.records if getattr(r, "method", "") == "POST /v1/completions"]
    assert (line.principal, line.tenant, line.status) == ("reporter", "certified", 200)


async def test_the_http_certificate_rotates_with_the_files(tmp_path):
    ca = CertificateAuthority()
    first, second = ca.issue_server(), ca.issue_server()
    cert, key = first.write(tmp_path, "tls")
    async with serving_fakes(settings(tls={"cert_file": str(cert), "key_file": str(key)})) as (
        s,
        _,
    ):
        port = s.http_port
        assert await asyncio.to_thread(served_certificate_serial, "127.0.0.1", port) == first.serial
        second.write(tmp_path, "tls")
        assert (
            await asyncio.to_thread(served_certificate_serial, "127.0.0.1", port) == second.serial
        )


async def test_a_request_s_span_continues_its_traceparent():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with serving_fakes(settings(), tracer_provider=provider) as (server, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            reply = await client.post(
                "/v1/completions", json=BODY, headers={"traceparent": TRACEPARENT}
            )
        assert reply.status_code == 200

        async def ended() -> bool:
            return any(s.name == "POST /v1/completions" for s in exporter.get_finished_spans())

        await wait_until(ended)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    span = spans["POST /v1/completions"]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes["http.response.status_code"] == 200
    assert spans["generate"].parent.span_id == span.context.span_id


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (BackendUnavailableError("stub down"), 503, "unavailable"),
        (QueueFullError("full"), 429, "resource_exhausted"),
        (RuntimeError("secret internal detail"), 500, "internal"),
    ],
)
async def test_each_domain_error_gets_its_status_and_no_stack_trace(error, status, code):
    async with serving_fakes(settings()) as (server, backends):
        backends["m"].infer_error = error
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            reply = await client.post("/v1/completions", json=BODY)
    assert reply.status_code == status
    body = reply.json()["error"]
    assert body["code"] == code
    assert "secret" not in body["message"] and "Traceback" not in body["message"]


async def test_an_error_after_the_first_event_is_the_stream_s_last_event():
    async with serving_fakes(settings()) as (server, backends):
        backends["m"].infer_error = BackendUnavailableError("stub crashed")
        backends["m"].error_after_pieces = 2
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            reply = await client.post("/v1/completions", json={**BODY, "stream": True})
    assert reply.status_code == 200  # the status went out with the first event
    events = [line.removeprefix("data: ") for line in reply.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == "unavailable" and "stub crashed" in last["error"]["message"]
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts) == "Hello,"


async def test_a_responses_stream_that_fails_after_its_first_event_ends_with_response_failed():
    async with (
        serving_fakes(settings()) as (server, backends),
        switched((server, backends), "m", chat_template=True) as backend,
    ):
        backend.infer_error = BackendUnavailableError("stub crashed")
        backend.error_after_pieces = 2
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0
        )
        async with client, client.responses.stream(model="m", input="hi") as stream:
            events = [event async for event in stream]
            with pytest.raises(RuntimeError):  # the helper's: no response.completed came
                await stream.get_final_response()
    assert [event.type for event in events][-2:] == ["error", "response.failed"]
    error, failed = events[-2:]
    assert error.code == "unavailable" and "stub crashed" in error.message  # type: ignore[union-attr]
    response = failed.response  # type: ignore[union-attr]
    assert response.status == "failed" and response.error and response.error.code == "server_error"
    assert response.output_text == "Hello,"  # what was sent before the error
