"""What the Kubernetes inference gateway reads and sends, over fake backends: vLLM's gauges,
one series each for the whole server and current at every scrape, and the fairness and
objective headers, honoured only from a principal with the `gateway` scope."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml

from inferwire.config import load_settings
from inferwire.core.auth import hash_token
from tests.support.certs import CertificateAuthority
from tests.support.fake_backend import FAKE_BACKEND, serving_fakes
from tests.support.waiting import wait_until

TOKENS = {"gateway": "iwt_gateway", "plain": "iwt_plain", "admin": "iwt_admin"}


def gauges(text: str) -> dict[str, str]:
    """The vllm:* lines of a scrape: family (with its labels) -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, _, value = line.rpartition(" ")
            found[name] = value
    return found


def one(found: dict[str, str], family: str) -> tuple[str, float]:
    lines = [(name, float(value)) for name, value in found.items() if name.startswith(family)]
    assert len(lines) == 1, lines  # the endpoint picker reads one series per family
    return lines[0]


async def test_the_gauges_count_waiting_and_running_requests_and_their_kv_tokens(tmp_path):
    adapter = tmp_path / "tagged.adapter"
    adapter.write_text("FAKE-ADAPTER T\n")
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[
            {"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True, "max_concurrency": 2},
            {"name": "other", "backend": FAKE_BACKEND, "load_on_startup": True},
            {
                "name": "tagged",
                "adapter_of": "m",
                "load_on_startup": True,
                "options": {"adapter_file": str(adapter)},
            },
        ],
    )
    async with serving_fakes(settings) as (server, backends):
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            idle = gauges((await client.get("/metrics")).text)
            assert one(idle, "vllm:num_requests_running")[1] == 0
            assert one(idle, "vllm:kv_cache_usage_perc")[1] == 0
            lora, changed = one(idle, "vllm:lora_requests_info")
            # Room for one more than the one adapter: all resident is not full.
            assert 'running_lora_adapters="tagged"' in lora and 'max_lora="2"' in lora

            backends["m"].generation_gate.close()
            body = {"model": "m", "prompt": "hi", "max_tokens": 8}
            calls = [
                asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(3)
            ]

            async def busy() -> bool:
                found = gauges((await client.get("/metrics")).text)
                return one(found, "vllm:num_requests_waiting")[1] == 1

            await wait_until(busy)
            found = gauges((await client.get("/metrics")).text)
            assert one(found, "vllm:num_requests_running")[1] == 2
            # Two running requests hold their 3 prompt tokens each (no token made yet), of
            # what m (2 x 64), other (8 x 64) and tagged (8 x 64) can hold.
            assert one(found, "vllm:kv_cache_usage_perc")[1] == 6 / (2 * 64 + 8 * 64 + 8 * 64)
            assert one(found, "vllm:lora_requests_info")[1] == changed  # its labels did not move
            backends["m"].generation_gate.open()
            replies = await asyncio.gather(*calls)
            assert [r.status_code for r in replies] == [200, 200, 200]
            done = gauges((await client.get("/metrics")).text)
            assert one(done, "vllm:num_requests_waiting")[1] == 0
            assert one(done, "vllm:num_requests_running")[1] == 0


async def test_the_gauges_are_gone_while_the_server_drains_the_rest_of_the_registry_stays():
    # A picker that reads its endpoints from a file has no readiness to tell it a pod is
    # going: the gauges going stale is its signal, while the pod still serves.
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600, "shutdown_delay_s": 3},
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    async with serving_fakes(settings) as (server, _):
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert one(gauges((await client.get("/metrics")).text), "vllm:num_requests_waiting")
            drain = asyncio.create_task(server.stop(grace_s=0))

            async def gone() -> bool:
                return gauges((await client.get("/metrics")).text) == {}

            await wait_until(gone)
            text = (await client.get("/metrics")).text
            assert "inferwire_requests_total" in text  # still scraped for the drain
            reply = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            assert reply.status_code == 200  # and still serving, for shutdown_delay_s
            await drain


def guarded_settings(tmp_path: Path, **server: Any) -> Any:
    entries = [
        {
            "name": "gateway",
            "sha256": hash_token(TOKENS["gateway"]),
            "scopes": ["infer", "gateway"],
        },
        {"name": "plain", "sha256": hash_token(TOKENS["plain"]), "scopes": ["infer"]},
        {"name": "admin", "sha256": hash_token(TOKENS["admin"]), "scopes": ["admin"]},
    ]
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(entries))
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "tenants": [
                {"name": "team-a", "priority": "interactive"},
                {"name": "bulk", "priority": "batch"},
            ],
            "auth": {"tokens_file": str(tokens)},
            **server,
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )


async def test_fairness_and_objective_headers_are_honoured_only_from_the_gateway_scope(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    async with serving_fakes(guarded_settings(tmp_path)) as (server, _):
        url = f"http://127.0.0.1:{server.http_port}"

        async def complete(token: str, request_id: str, **headers: str) -> None:
            reply = await client.post(
                "/v1/completions",
                json={"model": "m", "prompt": "hi"},
                headers={
                    "authorization": f"Bearer {TOKENS[token]}",
                    "x-request-id": request_id,
                    **headers,
                },
            )
            assert reply.status_code == 200, reply.text

        gateway = {
            "x-gateway-inference-fairness-id": "team-a",
            "x-gateway-inference-objective": "critical",
        }
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await complete("gateway", "g-1", **gateway)
            await complete(
                "gateway", "g-2", **{**gateway, "x-gateway-inference-fairness-id": "bulk"}
            )
            await complete(
                "gateway", "g-3", **{**gateway, "x-gateway-inference-fairness-id": "someone-new"}
            )
            await complete("plain", "p-1", **gateway)
            await complete("admin", "a-1", **gateway)
            await complete("admin", "a-2", **gateway)

        def line(request_id: str) -> Any:
            return next(r for r in caplog.records if getattr(r, "request_id", "") == request_id)

        await wait_until(lambda: _has(caplog, "a-2"))
    assert (line("g-1").tenant, line("g-1").priority) == ("team-a", "interactive")
    # An objective never raises a tenant above its own priority.
    assert (line("g-2").tenant, line("g-2").priority) == ("bulk", "batch")
    assert (line("g-3").tenant, line("g-3").priority) == ("someone-new", "standard")
    assert (line("p-1").tenant, line("a-1").tenant) == ("plain", "admin")  # headers ignored
    ignored = [r for r in caplog.records if r.getMessage().startswith("gateway headers ignored")]
    assert sorted(r.principal for r in ignored) == ["admin", "plain"]  # once per principal


async def _has(caplog: Any, request_id: str) -> bool:
    return any(getattr(r, "request_id", "") == request_id for r in caplog.records)


async def test_a_gateway_subject_speaks_for_others_over_mutual_tls(tmp_path, caplog):
    ca = CertificateAuthority()
    cert, key = ca.issue_server().write(tmp_path, "tls")
    tls = {
        "cert_file": str(cert),
        "key_file": str(key),
        "client_ca_file": str(ca.write(tmp_path, "ca")),
    }
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "tls": tls,
            "tenants": [{"name": "team-a"}],
            "auth": {"gateway_subjects": ["inference-gateway"]},
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    caplog.set_level(logging.INFO, logger="inferwire.access")
    async with serving_fakes(settings) as (server, _):
        url = f"https://127.0.0.1:{server.http_port}/v1/completions"
        for subject, request_id in (("inference-gateway", "gw"), ("someone-else", "other")):
            certificate, certificate_key = ca.issue_client(subject).write(tmp_path, subject)
            context = ssl.create_default_context(cadata=ca.cert_pem.decode())
            context.load_cert_chain(certificate, certificate_key)
            async with httpx.AsyncClient(verify=context, timeout=30) as client:
                reply = await client.post(
                    url,
                    json={"model": "m", "prompt": "hi"},
                    headers={
                        "x-gateway-inference-fairness-id": "team-a",
                        "x-request-id": request_id,
                    },
                )
            assert reply.status_code == 200
        await wait_until(lambda: _has(caplog, "other"))
    tenants = {r.request_id: r.tenant for r in caplog.records if hasattr(r, "tenant")}
    assert tenants["gw"] == "team-a" and tenants["other"] == "anonymous"
