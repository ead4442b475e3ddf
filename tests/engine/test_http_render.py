"""vLLM's render routes on a real `inferwire serve` of the bundled `demo` model: the ids
llm-d's endpoint picker hashes into blocks are the model's own tokens of the prompt it
generates from: equal to `/tokenize`'s, and as many as a real completion's
`usage.prompt_tokens` (prompts, chat through the template, chat with tools)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess, serving_with_config

CONFIG = """\
server:
  grace_period_s: 1
models:
  - name: demo
    load_on_startup: true
    options: {path: builtin}
"""
MESSAGES = [
    {"role": "system", "content": "You are a player."},
    {"role": "user", "content": "Good morrow! What news?"},
    {"role": "assistant", "content": "None, my lord."},
    {"role": "user", "content": "Then speak again."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving_with_config(tmp_path_factory.mktemp("render"), CONFIG) as server:
        yield server


def post(served: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    reply = httpx.post(served.http_url + path, json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def prompt_tokens(served: ServerProcess, path: str, body: dict[str, Any]) -> int:
    answer = post(served, path, {**body, "max_tokens": 1, "temperature": 0})
    return int(answer["usage"]["prompt_tokens"])


def test_completions_render_is_tokenize_and_the_completion_s_prompt(served):
    prompt = "KING HENRY:\nOnce more unto the breach, dear friends, once more;\n"
    [rendered] = post(served, "/v1/completions/render", {"model": "demo", "prompt": prompt})
    tokenized = post(served, "/tokenize", {"model": "demo", "prompt": prompt})
    assert rendered["token_ids"] == tokenized["tokens"]
    assert len(rendered["token_ids"]) > 10
    body = {"model": "demo", "prompt": prompt}
    assert prompt_tokens(served, "/v1/completions", body) == len(rendered["token_ids"])


def test_chat_render_is_the_template_s_tokens_and_the_chat_s_prompt(served):
    body = {"model": "demo", "messages": MESSAGES}
    rendered = post(served, "/v1/chat/completions/render", body)
    tokenized = post(served, "/tokenize", body)
    assert rendered["token_ids"] == tokenized["tokens"]
    assert prompt_tokens(served, "/v1/chat/completions", body) == len(rendered["token_ids"])
    # A later turn's prompt starts with the earlier turn's: the prefix the picker matches.
    earlier = post(
        served, "/v1/chat/completions/render", {"model": "demo", "messages": MESSAGES[:2]}
    )
    assert rendered["token_ids"][: len(earlier["token_ids"])] == earlier["token_ids"]


def test_chat_render_with_tools_is_what_the_chat_with_tools_is_fed(served):
    body = {"model": "demo", "messages": MESSAGES, "tools": TOOLS}
    rendered = post(served, "/v1/chat/completions/render", body)
    plain = post(served, "/v1/chat/completions/render", {"model": "demo", "messages": MESSAGES})
    assert len(rendered["token_ids"]) > len(plain["token_ids"])  # the tools are in it
    assert prompt_tokens(served, "/v1/chat/completions", body) == len(rendered["token_ids"])


def test_render_errors_name_the_field(served):
    reply = httpx.post(
        served.http_url + "/v1/chat/completions/render",
        json={"model": "demo", "messages": [{"role": "user"}], "max_tokens": 10**9},
        timeout=60,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "max_tokens"
