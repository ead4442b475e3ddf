"""A Responses request body as the core's request (http/responses_api/input.py
and items.py): items as chat messages, the chained conversation after the
instructions, tools and text.format as Chat Completions' core fields, the refusals
naming the body's field, and the core's violations renamed to the item they came from."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferwire.core.chat import ChatMessage, ToolCall, ToolChoice, ToolChoiceMode
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.sampling import ConstraintKind
from inferwire.http.responses_api.input import read_body, to_request
from inferwire.http.responses_api.store import StoredResponse

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def request(body: dict[str, Any], previous: StoredResponse | None = None) -> Any:
    return to_request(read_body({"model": "demo", **body}), previous, "tenant", None)


def refused(body: dict[str, Any], previous: StoredResponse | None = None) -> list[str]:
    with pytest.raises(InvalidArgumentError) as raised:
        request(body, previous)
    return [v.field for v in raised.value.violations]


def test_a_string_input_is_one_user_message_after_the_instructions():
    asked = request({"input": "Hi", "instructions": "Be brief."})
    assert asked.inference.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi"),
    )
    assert asked.conversation == (ChatMessage("user", "Hi"),)  # instructions are not carried


def test_items_become_messages_and_a_run_of_calls_one_assistant_turn():
    second = {**CALL, "call_id": "call_2", "id": "fc_2", "status": "completed"}
    asked = request(
        {
            "input": [
                {"role": "developer", "content": "Rules."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
                },
                CALL,
                second,
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "cold"}],
                },
            ]
        }
    )
    calls = (ToolCall("call_1", "get_weather", "{}"), ToolCall("call_2", "get_weather", "{}"))
    assert asked.inference.messages == (
        ChatMessage("system", "Rules."),
        ChatMessage("user", "a\nb"),
        ChatMessage("assistant", "Let me look.", calls),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
        ChatMessage("tool", "cold", tool_call_id="call_2"),
    )


def test_tools_choice_and_text_format_are_chat_completions_core_fields():
    asked = request(
        {
            "input": "x",
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
        }
    )
    (tool,) = asked.inference.tools
    assert (tool.name, json.loads(tool.parameters)) == ("get_weather", {"type": "object"})
    assert asked.inference.tool_choice == ToolChoice(ToolChoiceMode.REQUIRED, "get_weather")
    assert asked.inference.parallel_tool_calls is False
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    formatted = request(
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}}
    )
    constraint = formatted.inference.params.constraint
    assert constraint.kind is ConstraintKind.JSON_SCHEMA and json.loads(constraint.text) == schema
    assert formatted.echo()["text"] == {
        "format": {"type": "json_schema", "name": "n", "schema": schema}
    }
    assert (
        request({"input": "x", "text": {"format": {"type": "text"}}}).inference.params.constraint
        is None
    )


def test_a_chained_conversation_comes_after_the_instructions_and_answers_its_calls():
    history = (
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", (ToolCall("call_9", "get_weather", "{}"),)),
    )
    previous = StoredResponse("resp_1", "demo", "tenant", b"{}", history)
    asked = request(
        {
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "sunny"}],
            "instructions": "New.",
        },
        previous,
    )
    tool = ChatMessage("tool", "sunny", tool_call_id="call_9")
    assert asked.inference.messages == (ChatMessage("system", "New."), *history, tool)
    assert asked.conversation == (*history, tool)


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, ["input[0].type"]),
        ({"input": [{"type": "reasoning", "summary": []}]}, ["input[0].type"]),
        ({"input": ["text"]}, ["input[0]"]),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            ["input[0].call_id"],
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "1"}, CALL]},
            ["input[0].call_id"],
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, ["input[0].role"]),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            ["input[0].content[0].type"],
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            ["input[0].content[0].type"],
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            ["input[0].call_id"],
        ),
        ({"input": "x", "tools": [{"type": "web_search"}]}, ["tools[0].type"]),
        (
            {"input": "x", "tools": [TOOL, {"type": "file_search", "vector_store_ids": []}]},
            ["tools[1].type"],
        ),
        ({"input": "x", "tools": [{"type": "computer_use_preview"}]}, ["tools[0].type"]),
        ({"input": "x", "tools": [{"type": "mcp", "server_label": "x"}]}, ["tools[0].type"]),
        (
            {"input": "x", "tools": [{"type": "code_interpreter"}, {"type": "image_generation"}]},
            ["tools[0].type", "tools[1].type"],
        ),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, ["tool_choice.type"]),
        ({"input": "x", "tool_choice": "sometimes"}, ["tool_choice"]),
        ({"input": "x", "background": True}, ["background"]),
        ({"input": "x", "reasoning": {"effort": "high"}}, ["reasoning"]),
        ({"input": "x", "reasoning": {"summary": "auto"}}, ["reasoning"]),
        ({"input": "x", "conversation": "conv_1"}, ["conversation"]),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, ["prompt"]),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, ["metadata"]),
        ({"input": "x", "metadata": {"k" * 65: "v"}}, ["metadata"]),
        ({"input": "x", "metadata": {"k": "v" * 513}}, ["metadata"]),
        ({"input": "x", "metadata": {"k": 1}}, ["metadata.k"]),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            ["text.format.schema"],
        ),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, ["text.format.type"]),
        ({"input": "x", "max_output_tokens": "5"}, ["max_output_tokens"]),
        ({"input": "x", "request_id": "a\nb"}, ["request_id"]),
        ({"input": 5}, ["input"]),
    ],
)
def test_what_cannot_be_done_is_refused_naming_the_field(body, fields):
    assert refused(body) == fields


def test_what_clients_send_by_default_is_taken_or_ignored():
    # The Agents SDK's defaults, then the Codex CLI's.
    request(
        {
            "input": [{"role": "user", "content": "x"}],
            "include": [],
            "instructions": "Be brief.",
            "tools": [TOOL],
        }
    )
    asked = request(
        {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x"}],
                }
            ],
            "instructions": "Be brief.",
            "tools": [TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": None,
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "conv-1",
            "text": {"verbosity": "medium"},
            "service_tier": "auto",
            "truncation": "disabled",
            "top_logprobs": 0,
            "safety_identifier": "u",
            "stream_options": {"include_obfuscation": False},
            "reasoning_effort_is_not_a_field": 1,
        }
    )
    assert asked.body.store is False and asked.body.stream is True
    assert request(
        {"input": "x", "reasoning": {"effort": None, "summary": None}}
    ).inference.messages


def test_the_core_s_violations_are_renamed_to_the_item_they_came_from():
    asked = request(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "Looking."},
                CALL,
                {**CALL, "call_id": "call_2"},
                {"type": "function_call_output", "call_id": "call_2", "output": "1"},
            ],
            "tools": [TOOL],
        }
    )
    # messages: 0 instructions, 1 user, 2 assistant + calls of input[2] and [3], 3 tool
    assert asked.field_of("messages[1].content") == "input[0].content"
    assert asked.field_of("messages[2].tool_calls[0].name") == "input[2].name"
    assert asked.field_of("messages[2].tool_calls[1].arguments_json") == "input[3].arguments"
    assert asked.field_of("messages[2].tool_calls[1].id") == "input[3].call_id"
    assert asked.field_of("messages[3].tool_call_id") == "input[4].call_id"
    assert asked.field_of("messages[0].content") == "instructions"
    assert asked.field_of("messages") == "input"
    assert asked.field_of("parameters.max_tokens") == "max_output_tokens"
    assert asked.field_of("parameters.temperature") == "temperature"
    assert asked.field_of("parameters.constraint.json_schema") == "text.format"
    assert asked.field_of("tools[0].parameters_json_schema") == "tools[0].parameters"
    assert asked.field_of("tools[0].name") == "tools[0].name"
    assert asked.field_of("tool_choice.function_name") == "tool_choice.name"
    history = (ChatMessage("user", "old"),)
    chained = request({"input": "x"}, StoredResponse("resp_1", "demo", "tenant", b"{}", history))
    assert chained.field_of("messages[0].content") == "previous_response_id"
    assert chained.field_of("messages[1].content") == "input"


def test_the_answer_echoes_the_request():
    echo = request(
        {
            "input": "x",
            "instructions": "Be brief.",
            "max_output_tokens": 9,
            "temperature": 0.5,
            "metadata": {"k": "v"},
            "tools": [TOOL],
            "store": False,
            "user": "u",
        }
    ).echo()
    assert echo["instructions"] == "Be brief." and echo["max_output_tokens"] == 9
    assert (echo["temperature"], echo["top_p"], echo["metadata"]) == (0.5, None, {"k": "v"})
    assert echo["tools"] == [{**TOOL, "description": None, "strict": None}]
    assert (echo["tool_choice"], echo["store"], echo["user"]) == ("auto", False, "u")
    assert echo["text"] == {"format": {"type": "text"}} and echo["parallel_tool_calls"] is True
