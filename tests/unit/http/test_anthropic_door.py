"""Anthropic's Messages API on the HTTP door over fake backends, in-process, called by the
real `anthropic` SDK: the token in `x-api-key` or as a bearer (on these routes only),
Anthropic's error body for every refusal the edge makes (401, 403, 404, 429 with
`retry-after` from the tenant's quota, 529 for a full queue), an error after a stream's
first event as an `error` event, and `HEAD /` open."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from inferwire.config import load_settings
from inferwire.core.auth import hash_token
from inferwire.core.errors import BackendUnavailableError, QueueFullError
from inferwire.server import InferwireServer
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes, switched

USER = [{"role": "user", "content": "hi"}]
TOKENS = {"reader": "iwt_reader_0123", "narrow": "iwt_narrow_0123", "metered": "iwt_meter_0123"}


def settings(tmp_path: Path) -> Any:
    entries = [
        {"name": "reader", "sha256": hash_token(TOKENS["reader"]), "scopes": ["infer"]},
        {
            "name": "narrow",
            "sha256": hash_token(TOKENS["narrow"]),
            "scopes": ["infer"],
            "models": ["open-*"],
        },
        {
            "name": "metered",
            "sha256": hash_token(TOKENS["metered"]),
            "scopes": ["infer"],
            "tenant": "metered",
        },
    ]
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(entries))
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "health_check_interval_s": 3600,
            "tenants": [{"name": "metered", "requests_per_minute": 1}],
            "auth": {"tokens_file": str(tokens)},
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[InferwireServer, FakeBackends]]:
    async with serving_fakes(settings(tmp_path)) as fakes, switched(fakes, "m", chat_template=True):
        yield fakes


def client(server: InferwireServer, **credentials: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{server.http_port}", max_retries=0, **credentials
    )


async def test_the_token_is_taken_from_x_api_key_or_as_a_bearer(served):
    server, _ = served
    for credentials in ({"api_key": TOKENS["reader"]}, {"auth_token": TOKENS["reader"]}):
        async with client(server, **credentials) as sdk:
            message = await sdk.messages.create(model="m", max_tokens=8, messages=USER)
        assert [block.text for block in message.content] == ["Hello, world"]  # type: ignore[union-attr]
        assert message.usage.output_tokens == 3
    async with client(server, api_key="iwt_wrong") as sdk:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await sdk.messages.create(model="m", max_tokens=8, messages=USER)
        assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with pytest.raises(anthropic.AuthenticationError):
            await sdk.messages.count_tokens(model="m", messages=USER)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        # x-api-key is Anthropic's: OpenAI's routes want a bearer.
        reply = await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": USER},
            headers={"x-api-key": TOKENS["reader"]},
        )
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthenticated"
        probe = await http.head("/")  # open, as /health is
        assert probe.status_code == 200


async def test_a_model_out_of_reach_is_403_and_an_unknown_one_404_in_anthropic_s_shape(served):
    server, _ = served
    async with client(server, api_key=TOKENS["narrow"]) as sdk:
        with pytest.raises(anthropic.PermissionDeniedError) as forbidden:
            await sdk.messages.create(model="m", max_tokens=8, messages=USER)
    assert forbidden.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    async with client(server, api_key=TOKENS["reader"]) as sdk:
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await sdk.messages.create(model="ghost", max_tokens=8, messages=USER)
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.count_tokens(model="ghost", messages=USER)
    assert unknown.value.body == {  # type: ignore[comparison-overlap]
        "type": "error",
        "error": {"type": "not_found_error", "message": "model 'ghost' is not configured"},
    }


async def test_a_tenant_s_quota_is_429_with_retry_after_and_a_full_queue_529(served):
    server, backends = served
    async with client(server, api_key=TOKENS["metered"]) as sdk:
        await sdk.messages.create(model="m", max_tokens=8, messages=USER)
        with pytest.raises(anthropic.RateLimitError) as limited:
            await sdk.messages.create(model="m", max_tokens=8, messages=USER)
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(limited.value.response.headers["retry-after"]) >= 1
    backends["m"].infer_error = QueueFullError("the queue is full")
    try:
        async with client(server, api_key=TOKENS["reader"]) as sdk:
            with pytest.raises(anthropic.InternalServerError) as overloaded:
                await sdk.messages.create(model="m", max_tokens=8, messages=USER)
    finally:
        backends["m"].infer_error = None
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


async def test_an_error_after_the_first_event_is_an_error_event(served):
    server, backends = served
    backends["m"].infer_error = BackendUnavailableError("stub crashed")
    backends["m"].error_after_pieces = 2
    try:
        sdk = client(server, api_key=TOKENS["reader"])
        async with sdk, sdk.messages.stream(model="m", max_tokens=8, messages=USER) as stream:
            texts = []
            with pytest.raises(anthropic.APIStatusError) as failed:
                async for text in stream.text_stream:
                    texts.append(text)
    finally:
        backends["m"].infer_error = None
        backends["m"].error_after_pieces = 0
    assert "".join(texts) == "Hello,"
    assert failed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "stub crashed" in failed.value.body["error"]["message"]  # type: ignore[index]
