"""Tenants over gRPC: quota refusals carry QuotaFailure and RetryInfo, priorities above the
tenant's are refused, tokens and mutual-TLS certificates name tenants, and the tenant
metrics and access line say who was served."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from tritonclient.grpc import service_pb2 as oip
from tritonclient.grpc import service_pb2_grpc

from inferwire.config import load_settings
from inferwire.core.auth import TokenStore, hash_token
from inferwire.core.errors import ConfigurationError
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.auth import bearer
from tests.support.certs import CertificateAuthority
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends
from tests.support.waiting import wait_until

TENANTS = [
    {"name": "chat", "priority": "interactive", "weight": 3},
    {"name": "metered", "priority": "standard", "requests_per_minute": 2},
    {"name": "partner", "priority": "batch", "requests_per_minute": 1},
]


def token_entry(name: str, tenant: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "sha256": hash_token(f"t-{name}"), "scopes": ["infer"]}
    if tenant is not None:
        entry["tenant"] = tenant
    return entry


async def start(tmp_path: Path, **server: Any) -> InferwireServer:
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "metrics_address": "",
            "tenants": TENANTS,
            **server,
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    instance = InferwireServer(settings, backend_factory=FakeBackends())
    await instance.start()
    return instance


def details(error: grpc.aio.AioRpcError) -> dict[type, Any]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    found: dict[type, Any] = {}
    for detail in status.details:
        for kind in (error_details_pb2.QuotaFailure, error_details_pb2.RetryInfo):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                found[kind] = message
    return found


@pytest.fixture
async def tokens_server(tmp_path: Path) -> Any:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            [token_entry("frontend", "chat"), token_entry("meter", "metered"), token_entry("solo")]
        )
    )
    server = await start(tmp_path, auth={"tokens_file": str(tokens)})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(grace_s=0)


async def test_over_the_request_rate_is_resource_exhausted_with_quota_failure_and_retry_info(
    tokens_server: Any,
) -> None:
    server, stub = tokens_server
    for _ in range(2):
        await stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=bearer("t-meter"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=bearer("t-meter"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    found = details(refused.value)
    violation = found[error_details_pb2.QuotaFailure].violations[0]
    assert violation.subject == "tenant:metered"
    assert "requests_per_minute" in violation.description
    delay = found[error_details_pb2.RetryInfo].retry_delay.ToNanoseconds() / 1e9
    assert delay == pytest.approx(30.0, rel=0.2)  # one request of 2 a minute refills in 30 s
    # Another tenant is not limited; a token without a tenant is its own, with the defaults.
    await stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=bearer("t-frontend"))
    await stub.Infer(pb.InferRequest(model="m", prompt="hi"), metadata=bearer("t-solo"))
    metrics = server.metrics.registry
    assert (
        metrics.get_sample_value(
            "inferwire_tenant_throttled_total",
            {"tenant": "metered", "limit": "requests_per_minute"},
        )
        == 1
    )
    assert (
        metrics.get_sample_value(
            "inferwire_tenant_requests_total", {"tenant": "unconfigured", "outcome": "STOP"}
        )
        == 1
    )
    assert (
        metrics.get_sample_value("inferwire_tenant_generated_tokens_total", {"tenant": "chat"}) == 3
    )
    assert (
        metrics.get_sample_value(
            "inferwire_queue_wait_seconds_count", {"model": "m", "priority": "interactive"}
        )
        == 1
    )


async def test_a_priority_above_the_tenants_is_refused_and_a_lower_one_served(
    tokens_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, stub = tokens_server
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Infer(
            pb.InferRequest(model="m", prompt="hi", priority=pb.PRIORITY_INTERACTIVE),
            metadata=bearer("t-solo"),
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "priority" in (refused.value.details() or "")
    assert "standard" in (refused.value.details() or "")
    caplog.set_level(logging.INFO, "inferwire.access")
    call = stub.InferStream(
        pb.InferStreamRequest(model="m", prompt="hi", priority=pb.PRIORITY_BATCH),
        metadata=bearer("t-frontend"),
    )
    assert [m async for m in call][-1].finish_reason == pb.FINISH_REASON_STOP
    line = [r for r in caplog.records if r.name == "inferwire.access"][-1]
    assert (line.principal, line.tenant, line.priority) == ("frontend", "chat", "batch")


def test_a_tokens_file_naming_an_unknown_tenant_is_refused_and_keeps_the_last_good_set(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.yaml"
    known = frozenset({"chat"})
    path.write_text(yaml.safe_dump([token_entry("frontend", "chat")]))
    now = [0.0]
    store = TokenStore(path, clock=lambda: now[0], tenants=known)
    path.write_text(yaml.safe_dump([token_entry("frontend", "nope"), token_entry("new")]))
    now[0] += 2
    principal = store.authenticate("t-frontend")
    assert principal is not None and principal.tenant == "chat"
    assert store.authenticate("t-new") is None
    with pytest.raises(ConfigurationError, match=r"\[0\]\.tenant: 'nope' is not a tenant"):
        TokenStore(path, tenants=known)


def test_certificate_tenants_must_name_configured_tenants() -> None:
    with pytest.raises(ConfigurationError, match="certificate_tenants"):
        load_settings(server={"tenants": TENANTS, "auth": {"certificate_tenants": {"x": "nope"}}})


async def test_a_mutual_tls_client_is_limited_as_its_certificates_tenant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = CertificateAuthority()
    cert, key = ca.issue_server().write(tmp_path, "server")
    mapped = ca.issue_client("batch-runner")
    by_uri = ca.issue_client("anything", uris=("spiffe://example.org/partner",))
    server = await start(
        tmp_path,
        tls={
            "cert_file": str(cert),
            "key_file": str(key),
            "client_ca_file": str(ca.write(tmp_path)),
        },
        auth={
            "certificate_tenants": {
                "batch-runner": "partner",
                "spiffe://example.org/partner": "metered",
            }
        },
    )
    caplog.set_level(logging.INFO, "inferwire.access")
    try:
        for client, tenant in ((mapped, "partner"), (by_uri, "metered")):
            creds = grpc.ssl_channel_credentials(ca.cert_pem, client.key_pem, client.cert_pem)
            async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", creds) as channel:
                stub = inference_pb2_grpc.InferenceServiceStub(channel)
                await stub.Infer(pb.InferRequest(model="m", prompt="hi"))
                if tenant == "partner":  # one request a minute
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.Infer(pb.InferRequest(model="m", prompt="hi"))
                    violation = details(refused.value)[error_details_pb2.QuotaFailure]
                    assert violation.violations[0].subject == "tenant:partner"
    finally:
        await server.stop(grace_s=0)
    lines = [r for r in caplog.records if r.name == "inferwire.access" and r.model == "m"]
    assert (lines[0].principal, lines[0].tenant, lines[0].priority) == (
        "batch-runner",
        "partner",
        "batch",
    )
    assert (lines[-1].principal, lines[-1].tenant) == ("spiffe://example.org/partner", "metered")


def python_example() -> Any:
    path = Path(__file__).parents[3] / "clients" / "python" / "example.py"
    spec = importlib.util.spec_from_file_location("inferwire_python_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_python_example_waits_as_long_as_retry_info_says_then_retries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = python_example()
    backends = FakeBackends()
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "metrics_address": "",
            "default_tenant": {"max_concurrency": 1},
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    server = InferwireServer(settings, backend_factory=backends)
    await server.start()
    try:
        backends["m"].generation_gate.close()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            held = inference_pb2_grpc.InferenceServiceStub(channel).InferStream(
                pb.InferStreamRequest(model="m", prompt="hi")
            )
            await backends["m"].started.wait()

            def call_with_retries() -> pb.InferResponse:
                with grpc.insecure_channel(f"127.0.0.1:{server.port}") as blocking:
                    stub = inference_pb2_grpc.InferenceServiceStub(blocking)
                    request = pb.InferRequest(model="m", prompt="hi")
                    response: pb.InferResponse = example.with_quota_retries(
                        lambda: stub.Infer(request, timeout=30)
                    )
                    return response

            retried = asyncio.create_task(asyncio.to_thread(call_with_retries))
            throttled = {"tenant": "unconfigured", "limit": "max_concurrency"}

            async def refused_once() -> bool:
                value = server.metrics.registry.get_sample_value(
                    "inferwire_tenant_throttled_total", throttled
                )
                return value == 1

            await wait_until(refused_once)
            backends["m"].generation_gate.open()  # the held stream ends; the retry gets in
            assert [m async for m in held][-1].finish_reason == pb.FINISH_REASON_STOP
            assert (await retried).text == "Hello, world"
    finally:
        await server.stop(grace_s=0)
    assert "RETRY after=1.000s" in capsys.readouterr().out


def kserve_request() -> oip.ModelInferRequest:
    text = oip.ModelInferRequest.InferInputTensor(
        name="text_input", datatype="BYTES", shape=[1], contents=oip.InferTensorContents()
    )
    text.contents.bytes_contents.append(b"hi")
    return oip.ModelInferRequest(model_name="m", inputs=[text])


async def test_kserve_calls_count_against_the_callers_tenant_at_its_priority(
    tokens_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = tokens_server
    caplog.set_level(logging.INFO, "inferwire.access")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        await kserve.ModelInfer(kserve_request(), metadata=bearer("t-meter"))
        responses = kserve.ModelStreamInfer(iter([kserve_request()]), metadata=bearer("t-meter"))
        first = [r async for r in responses]
        assert first and not first[0].error_message
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kserve.ModelInfer(kserve_request(), metadata=bearer("t-meter"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    violation = details(refused.value)[error_details_pb2.QuotaFailure].violations[0]
    assert violation.subject == "tenant:metered"
    line = next(r for r in caplog.records if r.name == "inferwire.access" and r.model == "m")
    assert (line.tenant, line.priority) == ("metered", "standard")


async def test_a_priority_the_contract_does_not_have_is_invalid_argument(
    tokens_server: Any,
) -> None:
    server, stub = tokens_server
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Infer(
            pb.InferRequest(model="m", prompt="hi", priority=9), metadata=bearer("t-solo")
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "priority" in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError):  # an invalid request still counts for its tenant
        await stub.Infer(pb.InferRequest(model="m", prompt=""), metadata=bearer("t-frontend"))
    rejected = {"tenant": "chat", "outcome": "rejected"}
    samples = server.metrics.registry
    assert samples.get_sample_value("inferwire_tenant_requests_total", rejected) == 1


@pytest.mark.parametrize(
    ("tenants", "why"),
    [
        ([{"name": "a"}, {"name": "a"}], "'a' appears twice"),
        ([{"name": "a", "priority": "urgent"}], "priority"),
        ([{"name": "a", "weight": 0}], "weight"),
        ([{"name": "a", "burst": 3}], "burst"),
    ],
)
def test_invalid_tenants_are_configuration_errors(tenants: list[Any], why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        load_settings(server={"tenants": tenants})
