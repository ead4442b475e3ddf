"""An Anthropic Messages body as the core's request (http/anthropic/input.py and blocks.py):
system and blocks as chat messages, tool results as tool messages, thinking dropped, tools
and tool_choice as the core's (Chat Completions') fields, the output format as the
constraint, what is refused naming the body's field, and the core's violations renamed
to the block they came from."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferwire.core.chat import ChatMessage, Tool, ToolCall, ToolChoice, ToolChoiceMode
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import ConstraintKind
from inferwire.core.tools import tool_violations
from inferwire.http.anthropic.input import counted_messages, read_body, to_request

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "description": "The weather.", "input_schema": SCHEMA}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
USER = [{"role": "user", "content": "Hi"}]


def request(body: dict[str, Any], count_only: bool = False) -> Any:
    base = {"model": "demo"} if count_only else {"model": "demo", "max_tokens": 16}
    return to_request(read_body({**base, **body}, count_only), "tenant", None)


def refused(body: dict[str, Any], count_only: bool = False) -> list[str]:
    with pytest.raises(InvalidArgumentError) as raised:
        request(body, count_only)
    return [v.field for v in raised.value.violations]


def test_system_blocks_and_text_blocks_are_chat_messages_with_cache_control_ignored():
    asked = request(
        {
            "system": [
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Speak as a lord."},
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": "Good morrow."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What news?", "cache_control": {"ttl": "1h"}},
                        {"type": "text", "text": "From Verona?"},
                    ],
                },
            ],
            "metadata": {"user_id": "u-1"},
            "cache_control": {"type": "ephemeral"},
        }
    )
    assert asked.inference.messages == (
        ChatMessage("system", "Be brief.\nSpeak as a lord."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Good morrow."),
        ChatMessage("user", "What news?\nFrom Verona?"),
    )
    assert asked.inference.params.max_tokens == 16


def test_a_system_message_among_the_messages_stays_in_its_place():
    # Claude Code sends its environment so, after the user's first message.
    asked = request(
        {
            "system": "You are an agent.",
            "messages": [
                {"role": "user", "content": "Say hello"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            ],
        }
    )
    assert [(m.role, m.content) for m in asked.inference.messages] == [
        ("system", "You are an agent."),
        ("user", "Say hello"),
        ("system", "# Environment"),
    ]


def test_tool_use_and_tool_results_are_calls_and_tool_messages_and_thinking_is_dropped():
    asked = request(
        {
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "c2ln"},
                        {"type": "redacted_thinking", "data": "eHg="},
                        {"type": "text", "text": "Let me look."},
                        USE,
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "rain"}],
                            "is_error": True,
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
            ],
            "tools": [TOOL],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )
    assert asked.inference.messages == (
        ChatMessage("user", "Weather in Oslo?"),
        ChatMessage(
            "assistant", "Let me look.", (ToolCall("toolu_1", "get_weather", '{"city": "Oslo"}'),)
        ),
        ChatMessage("tool", "Error: rain", tool_call_id="toolu_1"),
        ChatMessage("user", "And tomorrow?"),
    )
    assert asked.inference.tools == (Tool("get_weather", "The weather.", json.dumps(SCHEMA)),)


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, ToolChoice(ToolChoiceMode.AUTO), True),
        ({"type": "any"}, ToolChoice(ToolChoiceMode.REQUIRED), True),
        ({"type": "none"}, ToolChoice(ToolChoiceMode.NONE), True),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            ToolChoice(ToolChoiceMode.REQUIRED, "get_weather"),
            False,
        ),
    ],
)
def test_tool_choice_is_the_core_s(choice, expected, parallel):
    asked = request(
        {"messages": USER, "tools": [{**TOOL, "type": "custom"}], "tool_choice": choice}
    )
    assert asked.inference.tool_choice == expected
    assert asked.inference.parallel_tool_calls is parallel


def test_sampling_stop_sequences_and_the_output_format_are_the_core_s_parameters():
    asked = request(
        {
            "messages": USER,
            "stop_sequences": ["\n\n", "END"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}},
        }
    )
    params = asked.inference.params
    assert (params.stop, params.temperature, params.top_p, params.top_k) == (
        ("\n\n", "END"),
        0.5,
        0.9,
        40,
    )
    assert params.constraint is not None and params.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(params.constraint.text) == SCHEMA
    older = request(
        {"messages": USER, "output_format": {"type": "json_schema", "schema": SCHEMA}}
    ).inference.params.constraint
    assert older is not None and json.loads(older.text) == SCHEMA
    assert asked.field_of("parameters.constraint.json_schema") == "output_config.format"


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"messages": USER, "max_tokens": None}, ["max_tokens"]),
        ({"messages": []}, ["messages"]),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Look:"},
                            {"type": "image", "source": {"type": "base64", "data": "AA=="}},
                            {"type": "document", "source": {"type": "text", "data": "x"}},
                        ],
                    }
                ]
            },
            ["messages[0].content[1].type", "messages[0].content[2].type"],
        ),
        ({"messages": [{"role": "user", "content": [USE]}]}, ["messages[0].content[0].type"]),
        ({"messages": [{"role": "tool", "content": "x"}]}, ["messages[0].role"]),
        (
            {"messages": [{"role": "system", "content": [{"type": "image"}]}]},
            ["messages[0].content[0].type"],
        ),
        ({"messages": [{"role": "user"}]}, ["messages[0].content"]),
        (
            {"messages": [{"role": "assistant", "content": [{**USE, "input": "Oslo"}]}]},
            ["messages[0].content[0].input"],
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_1",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            ["messages[0].content[0].content[0].type"],
        ),
        ({"messages": USER, "system": [{"type": "image"}]}, ["system[0].type"]),
        (
            {"messages": USER, "tools": [{"type": "web_search_20250305", "name": "w"}]},
            ["tools[0].type"],
        ),
        ({"messages": USER, "tools": [{"name": "w"}]}, ["tools[0].input_schema"]),
        ({"messages": USER, "tool_choice": {"type": "required"}}, ["tool_choice.type"]),
        ({"messages": USER, "tool_choice": {"type": "tool"}}, ["tool_choice.name"]),
        (
            {"messages": USER, "output_config": {"format": {"type": "text"}}},
            ["output_config.format.type"],
        ),
        ({"messages": USER, "output_format": {"type": "json_schema"}}, ["output_format.schema"]),
        ({"messages": USER, "mcp_servers": [{"type": "url", "url": "x"}]}, ["mcp_servers"]),
        ({"messages": USER, "stop_sequences": "END"}, ["stop_sequences"]),
    ],
)
def test_what_inferwire_cannot_take_is_refused_naming_the_field(body, fields):
    assert refused(body) == fields


def test_the_core_s_violations_are_named_by_the_block_they_came_from():
    asked = request(
        {
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, USE]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Quick:"},
                        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "rain"},
                    ],
                },
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "get_forecast"},
        }
    )
    violations = [v.field for v in tool_violations(asked.inference)]
    assert [asked.field_of(v) for v in violations] == [
        "tool_choice.name",
        "messages[2].content[1].tool_use_id",
    ]
    assert asked.field_of("messages[0].content") == "system"
    assert asked.field_of("messages[1].content") == "messages[0].content"
    assert asked.field_of("messages[2].tool_calls[0].arguments_json") == (
        "messages[1].content[1].input"
    )
    assert asked.field_of("messages[2].tool_calls[0].name") == "messages[1].content[1].name"
    assert asked.field_of("messages[3].content") == "messages[2].content"
    assert asked.field_of("tools[0].parameters_json_schema") == "tools[0].input_schema"
    assert asked.field_of("parameters.max_tokens") == "max_tokens"
    assert asked.field_of("parameters.stop[1]") == "stop_sequences[1]"
    assert asked.field_of("parameters.top_k") == "top_k"
    assert asked.field_of("prompt") == "messages"


def test_count_tokens_takes_no_max_tokens_and_counts_the_tools_in_the_prompt():
    asked = request({"messages": USER, "tools": [TOOL]}, count_only=True)
    assert isinstance(asked.inference, InferenceRequest)
    counted = counted_messages(asked)
    assert counted[0].role == "system" and "get_weather" in counted[0].content
    assert counted[1:] == (ChatMessage("user", "Hi"),)
    assert refused({"messages": []}, count_only=True) == ["messages"]
