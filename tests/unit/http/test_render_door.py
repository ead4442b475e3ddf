"""vLLM's render routes over fake backends, in-process: `/v1/completions/render` and
`/v1/chat/completions/render` answer the token ids of the very prompt generation feeds the
backend (template, tools, context) without generating, in the shapes llm-d's endpoint
picker reads (`[{"token_ids": ...}]` and `{"token_ids": ...}`), and refuse what
generation refuses, naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from inferwire.config import load_settings
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes, switched

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Good morrow!"},
]
TOOLS = [{"type": "function", "function": {"name": "weather"}}]


@pytest.fixture
async def served() -> AsyncIterator[tuple[Any, FakeBackends]]:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )
    async with serving_fakes(settings) as served:
        yield served


def http(served: tuple[Any, FakeBackends]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{served[0].http_port}")


async def fed(http: httpx.AsyncClient, backends: FakeBackends, path: str, body: Any) -> list[int]:
    """The token ids of the prompt that generating `body` fed the backend."""
    reply = await http.post(path, json={**body, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    return list(backends["m"].calls.requests[-1].prompt.encode())  # the fake: a token a byte


async def test_completions_render_answers_the_prompt_s_ids_in_a_list(served):
    backends = served[1]
    async with http(served) as client:
        reply = await client.post(
            "/v1/completions/render", json={"model": "m", "prompt": "KING HENRY:\n"}
        )
        assert reply.status_code == 200, reply.text
        tokenized = await client.post("/tokenize", json={"model": "m", "prompt": "KING HENRY:\n"})
        body = {"model": "m", "prompt": "KING HENRY:\n"}
        generated = await fed(client, backends, "/v1/completions", body)
    [rendered] = reply.json()
    assert rendered["token_ids"] == tokenized.json()["tokens"] == generated
    assert rendered["token_ids"] == list(b"KING HENRY:\n")


async def test_chat_render_is_the_template_s_prompt_as_generation_sees_it(served):
    backends = served[1]
    async with switched(served, "m", chat_template=True), http(served) as client:
        reply = await client.post(
            "/v1/chat/completions/render", json={"model": "m", "messages": MESSAGES}
        )
        assert reply.status_code == 200, reply.text
        tokenized = await client.post("/tokenize", json={"model": "m", "messages": MESSAGES})
        body = {"model": "m", "messages": MESSAGES}
        generated = await fed(client, backends, "/v1/chat/completions", body)
    assert reply.json() == {"model": "m", "token_ids": tokenized.json()["tokens"]}
    assert reply.json()["token_ids"] == generated
    assert bytes(generated).decode().endswith("assistant: ")  # the template's prompt


async def test_render_generates_nothing(served):
    backends = served[1]
    async with http(served) as client:
        for _ in range(3):
            reply = await client.post(
                "/v1/completions/render", json={"model": "m", "prompt": "hi", "stream": True}
            )
            assert reply.status_code == 200, reply.text
    assert backends["m"].calls.requests == []


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions/render", {"model": "m"}, 400, "prompt"),
        ("/v1/completions/render", {"model": "m", "prompt": ["a", "b"]}, 400, "prompt"),
        (
            "/v1/completions/render",
            {"model": "m", "prompt": "x", "max_tokens": 999},
            400,
            "max_tokens",
        ),
        ("/v1/chat/completions/render", {"model": "m", "prompt": "x"}, 400, "messages"),
        ("/v1/chat/completions/render", {"model": "m", "messages": "x"}, 400, "messages"),
        (
            "/v1/chat/completions/render",
            {"model": "m", "messages": MESSAGES, "tools": TOOLS},
            400,
            "tools",
        ),
        ("/v1/completions/render", {"model": "ghost", "prompt": "x"}, 404, None),
    ],
)
async def test_render_refuses_what_generation_refuses_naming_the_field(
    served, path, body, status, param
):
    async with http(served) as client:
        reply = await client.post(path, json=body)
        generating = await client.post(path.removesuffix("/render"), json=body)
    assert reply.status_code == generating.status_code == status, reply.text
    error = reply.json()["error"]
    assert error == generating.json()["error"]
    if param is not None:
        assert error["param"] == param
