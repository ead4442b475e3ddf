"""Anthropic's Messages API of a real `inferwire serve` on the bundled `demo` model, called
by the real `anthropic` SDK: create (the same greedy text and counts as Chat Completions,
on the same core), the stream helper, a tools round trip whose `tool_use` input validates
against its `input_schema`, count_tokens, and the errors in Anthropic's shape, with the
token in `x-api-key` against the same hashed tokens as every door.

The bundled `demo` model runs its requests on the per-request path (never preempted, so
a greedy text does not depend on what else runs): its text is comparable token for
token across the doors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
import yaml

from inferwire.core.auth import hash_token
from tests.support.process import ServerProcess, serving_with_config
from tests.support.waiting import wait_until

TOKEN = "iwt_anthropic_0123"
USER = [{"role": "user", "content": "Good morrow! What news?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: Any = [{"name": "get_weather", "description": "The forecast.", "input_schema": WEATHER}]
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
# One call (the demo model takes a token a character: 160 tokens hold one call).
ONE_CALL: Any = {"type": "any", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("anthropic")
    tokens = directory / "tokens.yaml"
    entry = {"name": "claude", "sha256": hash_token(TOKEN), "scopes": ["infer"]}
    tokens.write_text(yaml.safe_dump([entry]))
    config = f"""\
server:
  grace_period_s: 1
  auth: {{tokens_file: {tokens}}}
models:
  - {{name: demo, load_on_startup: true, max_concurrency: 4, options: {{path: builtin}}}}
"""
    with serving_with_config(directory, config) as server:
        yield server


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.http_url, api_key=TOKEN, max_retries=0, timeout=60)


def test_create_gives_chat_completions_greedy_text_and_counts(client, served):
    message = client.messages.create(
        model="demo",
        max_tokens=24,
        system=[{"type": "text", "text": "Speak plainly.", "cache_control": {"type": "ephemeral"}}],
        messages=USER,
        metadata={"user_id": "tester"},
        thinking={"type": "enabled", "budget_tokens": 1024},  # taken and ignored
        extra_body={"temperature": 0, "top_k": 1},  # as the SDK 2.x sends them
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
        extra_query={"beta": "true"},
    )
    openai_client = openai.OpenAI(base_url=served.http_url + "/v1", api_key=TOKEN, max_retries=0)
    chat = openai_client.chat.completions.create(
        model="demo",
        messages=[{"role": "system", "content": "Speak plainly."}, *USER],  # type: ignore[list-item]
        max_tokens=24,
        temperature=0,
    )
    [block] = message.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert message.id.startswith("msg_") and message.model == "demo"
    assert message.role == "assistant" and message.type == "message"
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert chat.usage is not None
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == 24
    assert message.usage.cache_read_input_tokens == 0


def test_a_stop_sequence_ends_the_message_and_is_named(client):
    whole = client.messages.create(
        model="demo", max_tokens=24, messages=USER, extra_body={"temperature": 0}
    )
    text = whole.content[0].text  # type: ignore[union-attr]
    stop = text.split()[2]  # a word the greedy answer says
    cut = client.messages.create(
        model="demo",
        max_tokens=24,
        messages=USER,
        stop_sequences=["never said, not once", stop],  # of several, the one that matched
        extra_body={"temperature": 0},
    )
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    with client.messages.stream(
        model="demo",
        max_tokens=24,
        messages=USER,
        stop_sequences=[stop, "never said, not once"],
        extra_body={"temperature": 0},
    ) as events:
        streamed = events.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)


def test_the_stream_helper_accumulates_the_events_to_the_whole_message(client):
    whole = client.messages.create(
        model="demo", max_tokens=32, messages=USER, extra_body={"temperature": 0}
    )
    with client.messages.stream(
        model="demo", max_tokens=32, messages=USER, extra_body={"temperature": 0}
    ) as stream:
        kinds = []
        pieces = []
        for event in stream:
            kinds.append(event.type)
            if event.type == "text":
                pieces.append(event.text)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert "".join(pieces) == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == 32


@pytest.mark.parametrize("stream", [False, True])
def test_a_tools_round_trip_whose_input_validates_against_its_schema(client, stream):
    fields: Any = dict(
        model="demo", max_tokens=160, messages=ASKED, tools=TOOLS, tool_choice=ONE_CALL
    )
    if stream:
        with client.messages.stream(**fields) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**fields)
    assert message.stop_reason == "tool_use"
    [use] = [block for block in message.content if block.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    answered = client.messages.create(
        model="demo",
        max_tokens=16,
        tools=TOOLS,
        messages=[
            *ASKED,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny."}],
            },
        ],
        tool_choice={"type": "none"},
    )
    assert answered.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answered.content] == ["text"]


def test_count_tokens_counts_what_create_reads(client):
    for fields in ({}, {"tools": TOOLS, "tool_choice": ONE_CALL}):
        counted = client.messages.count_tokens(model="demo", messages=ASKED, **fields)
        made = client.messages.create(model="demo", max_tokens=1, messages=ASKED, **fields)
        assert counted.input_tokens == made.usage.input_tokens, fields


def test_errors_come_in_anthropic_s_shape(client, served):
    with pytest.raises(anthropic.BadRequestError) as missing:
        # The SDK's own check wants max_tokens: the body goes through its transport as is.
        body = {"model": "demo", "messages": USER}
        client.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert missing.value.body == {  # type: ignore[comparison-overlap]
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=USER)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    stranger = anthropic.Anthropic(base_url=served.http_url, api_key="iwt_wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model="demo", max_tokens=8, messages=USER)
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    with pytest.raises(anthropic.BadRequestError) as picture:
        client.messages.create(
            model="demo", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    assert picture.value.body["error"]["message"].startswith("messages[0].content[0].type:")  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as long:
        client.messages.create(
            model="demo", max_tokens=8, messages=[{"role": "user", "content": "To be. " * 800}]
        )
    assert "context window" in long.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as greedy:
        client.messages.create(model="demo", max_tokens=64000, messages=USER)
    assert greedy.value.body["error"]["message"].startswith("max_tokens:")  # type: ignore[index]


def test_head_probe_and_the_access_line(client, served):
    assert httpx.head(served.http_url + "/", timeout=30).status_code == 200
    client.messages.create(
        model="demo", max_tokens=2, messages=USER, extra_headers={"x-request-id": "anth-line"}
    )

    def lines() -> list[dict[str, Any]]:
        found = [json.loads(line) for line in served.log_lines if '"anth-line"' in line]
        return [line for line in found if line.get("method") == "POST /v1/messages"]

    async def written() -> bool:
        return bool(lines())

    asyncio.run(wait_until(written))
    [line] = lines()
    assert (line["code"], line["status"], line["model"], line["principal"]) == (
        "OK",
        200,
        "demo",
        "claude",
    )
    assert line["completion_tokens"] == 2
