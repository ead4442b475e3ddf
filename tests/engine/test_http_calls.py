"""What every HTTP call gets, written once with gRPC's (the edge): tokens, scopes and
model patterns, tenant quotas with Retry-After, the access line and the metrics, a client
that goes away stopping its generation, and the body's faults answered 4xx."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import yaml

from inferwire.core.auth import hash_token
from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.waiting import wait_until

SIMULATED = """\
  - name: sim
    backend: simulator
    load_on_startup: true
    options: {time_to_first_token_ms: 5, inter_token_ms: 2, context_length: 4096}
  - name: sim-short
    backend: simulator
    load_on_startup: true
    options: {time_to_first_token_ms: 1, inter_token_ms: 1, output_tokens: 5}
"""
TOKENS = {"reader": "iwt_reader", "narrow": "iwt_narrow", "limited": "iwt_limited"}


def access_lines(server: ServerProcess, method: str) -> list[dict]:
    lines = [json.loads(line) for line in server.log_lines if '"inferwire.access"' in line]
    return [line for line in lines if line.get("method") == method]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("http-guarded")
    tokens = directory / "tokens.yaml"
    entries = [
        {"name": "reader", "sha256": hash_token(TOKENS["reader"]), "scopes": ["infer"]},
        {
            "name": "narrow",
            "sha256": hash_token(TOKENS["narrow"]),
            "scopes": ["infer"],
            "models": ["demo"],
        },
        {
            "name": "limited",
            "sha256": hash_token(TOKENS["limited"]),
            "scopes": ["infer"],
            "tenant": "limited",
        },
    ]
    tokens.write_text(yaml.safe_dump(entries))
    config = directory / "inferwire.yaml"
    config.write_text(
        f"""\
server:
  grace_period_s: 1
  tenants: [{{name: limited, requests_per_minute: 1}}]
  auth: {{tokens_file: {tokens}}}
models:
  - {{name: demo, load_on_startup: true, options: {{path: builtin}}}}
{SIMULATED}"""
    )
    server = start_serving_server("--config", str(config))
    try:
        yield server
    finally:
        stop_server_process(server)


def client_of(server: ServerProcess, token: str | None) -> openai.OpenAI:
    """A client of `server` sending `token` (None: no Authorization header at all)."""
    client = openai.OpenAI(
        base_url=server.http_url + "/v1", api_key=token or "unset", max_retries=0, timeout=30
    )
    return client if token else client.with_options(default_headers={"authorization": ""})


def test_without_a_valid_token_calls_are_unauthenticated(guarded):
    with pytest.raises(openai.AuthenticationError) as raised:
        client_of(guarded, None).models.list()
    assert raised.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client_of(guarded, "iwt_not_a_token").completions.create(
            model="demo", prompt="x", max_tokens=2
        )


def test_a_token_sees_and_uses_only_its_models(guarded):
    narrow = client_of(guarded, TOKENS["narrow"])
    assert [m.id for m in narrow.models.list()] == ["demo"]
    with pytest.raises(openai.PermissionDeniedError) as raised:
        narrow.completions.create(model="sim", prompt="x", max_tokens=2)
    assert raised.value.status_code == 403 and "'sim'" in raised.value.message
    reader = client_of(guarded, TOKENS["reader"])
    assert {m.id for m in reader.models.list()} == {"demo", "sim", "sim-short"}


def test_a_tenant_over_its_rate_is_rate_limited_with_retry_after(guarded):
    limited = client_of(guarded, TOKENS["limited"])
    limited.completions.create(model="sim", prompt="x", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as raised:
        limited.completions.create(model="sim", prompt="x", max_tokens=2)
    retry_after = raised.value.response.headers["retry-after"]
    assert retry_after.isdigit() and 1 <= int(retry_after) <= 60
    assert "requests per minute" in raised.value.message
    assert raised.value.body["code"] == "resource_exhausted"


def test_health_version_and_metrics_stay_open_with_a_tokens_file(guarded):
    assert httpx.get(guarded.http_url + "/health").status_code == 200
    assert httpx.get(guarded.http_url + "/version").json()["version"]
    metrics = httpx.get(guarded.http_url + "/metrics")
    assert metrics.status_code == 200
    assert 'inferwire_model_ready{model="demo"} 1.0' in metrics.text


def test_each_call_writes_one_access_line_with_its_status(guarded):
    reader = client_of(guarded, TOKENS["reader"])
    before = len(access_lines(guarded, "POST /v1/completions"))
    reader.completions.create(
        model="sim", prompt="one two", max_tokens=3, extra_headers={"x-request-id": "http-line"}
    )
    with pytest.raises(openai.NotFoundError):
        reader.completions.create(model="ghost", prompt="x", max_tokens=3)

    async def written() -> bool:
        return len(access_lines(guarded, "POST /v1/completions")) >= before + 2

    asyncio.run(wait_until(written))
    ok, missing = access_lines(guarded, "POST /v1/completions")[before:][:2]
    assert (ok["code"], ok["status"], ok["principal"]) == ("OK", 200, "reader")
    assert (ok["request_id"], ok["model"], ok["completion_tokens"]) == ("http-line", "sim", 3)
    assert ok["peer"].startswith("ipv4:127.0.0.1:")
    assert (missing["code"], missing["status"], missing["model"]) == ("NOT_FOUND", 404, "ghost")


async def test_a_client_that_closes_its_stream_stops_generation(guarded):
    reader = openai.AsyncOpenAI(
        base_url=guarded.http_url + "/v1", api_key=TOKENS["reader"], max_retries=0
    )
    stream = await reader.completions.create(
        model="sim",
        prompt="one",
        max_tokens=2000,
        stream=True,
        extra_headers={"x-request-id": "http-cancelled"},
    )
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == 3:
            break
    await stream.close()  # closes the connection, as a client that goes away does

    async def logged() -> bool:
        return any(
            line.get("request_id") == "http-cancelled"
            for line in access_lines(guarded, "POST /v1/completions")
        )

    await wait_until(logged)
    [line] = [
        line
        for line in access_lines(guarded, "POST /v1/completions")
        if line.get("request_id") == "http-cancelled"
    ]
    assert (line["code"], line["outcome"], line["cancelled"]) == ("CANCELLED", "cancelled", True)
    assert line["completion_tokens"] < 50, line  # of 2,000
    metrics = httpx.get(guarded.http_url + "/metrics").text
    cancelled = re.search(
        r'inferwire_requests_total\{model="sim",outcome="cancelled"\} (\d+)', metrics
    )
    assert cancelled and int(cancelled[1]) >= 1


def test_tokenize_and_detokenize_take_vllm_s_shapes(guarded):
    headers = {"authorization": f"Bearer {TOKENS['reader']}"}
    tokens = httpx.post(
        guarded.http_url + "/tokenize",
        json={"model": "demo", "prompt": "ROMEO: hello"},
        headers=headers,
    ).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > 0
    text = httpx.post(
        guarded.http_url + "/detokenize",
        json={"model": "demo", "tokens": tokens["tokens"]},
        headers=headers,
    ).json()
    assert text == {"prompt": "ROMEO: hello"}
    refused = httpx.post(
        guarded.http_url + "/detokenize",
        json={"model": "demo", "tokens": [10**9]},
        headers=headers,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens[0]"


@pytest.mark.parametrize(
    ("content", "content_type", "status", "says"),
    [
        (b'{"model": "demo", "prompt": ', "application/json", 400, "line 1 column 29"),
        (b"\xff\xfe{}", "application/json", 400, "not UTF-8"),
        (b"model=demo", "application/x-www-form-urlencoded", 415, "application/json"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "nested too deeply"),
        (b"x" * (5 << 20), "application/json", 413, "larger than"),
    ],
    ids=["truncated", "bad-utf8", "form", "deep", "huge"],
)
def test_a_body_that_is_not_a_request_gets_a_4xx_naming_why(
    guarded, content, content_type, status, says
):
    reply = httpx.post(
        guarded.http_url + "/v1/completions",
        content=content,
        headers={"content-type": content_type, "authorization": f"Bearer {TOKENS['reader']}"},
    )
    assert reply.status_code == status, reply.text
    assert says in reply.json()["error"]["message"]
    assert httpx.get(guarded.http_url + "/health").status_code == 200


def test_the_http_port_is_logged_at_start(guarded):
    assert any('"http listening"' in line for line in guarded.log_lines)
    assert isinstance(guarded.http_port, int)


@pytest.mark.parametrize(
    ("extra", "tokens", "finish"),
    [({}, 5, "stop"), ({"min_tokens": 12}, 12, "stop"), ({"ignore_eos": True}, 20, "length")],
)
def test_vllm_s_min_tokens_and_ignore_eos_reach_the_engine(guarded, extra, tokens, finish):
    # sim-short ends by itself after 5 tokens (its end of sequence).
    reply = client_of(guarded, TOKENS["reader"]).completions.create(
        model="sim-short", prompt="one", max_tokens=20, extra_body=extra
    )
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (tokens, finish)
