"""Anthropic's Messages API on SmolLM2-135M, called by the real `anthropic` SDK: the same
greedy answer as Chat Completions (stop reasons mapped), the stream helper's message equal
to the unary one, a tools round trip whose `tool_use` input validates against its schema
(SmolLM2's template knows no tools: the Hermes section and the grammar), and count_tokens
equal to what create reads."""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
import openai

from tests.support.process import ServerProcess

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def client_of(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.http_url, api_key="x", max_retries=0, timeout=120)


def test_create_and_stream_give_chat_s_greedy_answer(smollm2_server: ServerProcess) -> None:
    client = client_of(smollm2_server)
    fields: Any = dict(model="smollm2", max_tokens=48, messages=QUESTION)
    message = client.messages.create(**fields, extra_body={"temperature": 0})
    chat = openai.OpenAI(base_url=smollm2_server.http_url + "/v1", api_key="x", max_retries=0)
    expected = chat.chat.completions.create(**fields, temperature=0).choices[0]
    assert message.content[0].text == expected.message.content  # type: ignore[union-attr]
    assert message.stop_reason == STOP_REASONS[expected.finish_reason]
    with client.messages.stream(**fields, extra_body={"temperature": 0}) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == message.content[0].text  # type: ignore[union-attr]
    assert streamed.usage.input_tokens == message.usage.input_tokens
    counted = client.messages.count_tokens(model="smollm2", messages=QUESTION)
    assert counted.input_tokens == message.usage.input_tokens


def test_a_tools_round_trip_validates_and_is_answered(smollm2_server: ServerProcess) -> None:
    client = client_of(smollm2_server)
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice: Any = {"type": "any", "disable_parallel_tool_use": True}
    message = client.messages.create(
        model="smollm2", max_tokens=64, messages=asked, tools=TOOLS, tool_choice=choice
    )
    assert message.stop_reason == "tool_use"
    [use] = [block for block in message.content if block.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)
    counted = client.messages.count_tokens(
        model="smollm2", messages=asked, tools=TOOLS, tool_choice=choice
    )
    assert counted.input_tokens == message.usage.input_tokens
    answered = client.messages.create(
        model="smollm2",
        max_tokens=48,
        tools=TOOLS,
        messages=[
            *asked,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C."}
                ],
            },
        ],
        extra_body={"temperature": 0},
    )
    assert answered.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answered.usage.output_tokens > 0
