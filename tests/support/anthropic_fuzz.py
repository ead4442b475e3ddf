"""Hypothesis strategies for Anthropic's Messages API on the HTTP door: plausible
`/v1/messages` and `/v1/messages/count_tokens` bodies (system prompts, text blocks with
`cache_control`, a tool call answered, tools and tool choices, thinking, output formats)
with one wild thing each, as tests/support/http_fuzz.py makes OpenAI's; the wild
messages hold blocks of every kind (images, documents, thinking, tool calls and results
with wild fields, blocks that are no objects)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.http_fuzz import (
    _body,
    json_value,
    model,
    plausible_text,
    wild,
    wild_text,
)

_schemas = st.sampled_from(
    [
        {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}}},
        {"type": "object"},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}},
        {"type": 5},
    ]
)
_cache = st.sampled_from([{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}])
_text = st.fixed_dictionaries(
    {"type": st.just("text"), "text": plausible_text}, optional={"cache_control": _cache}
)
_content = st.one_of(plausible_text, st.lists(_text, min_size=1, max_size=2))
_turn = st.tuples(
    st.fixed_dictionaries({"role": st.just("user"), "content": _content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": _content}),
).map(list)
_use = {
    "type": st.just("tool_use"),
    "id": st.just("toolu_1"),
    "name": st.just("get_weather"),
    "input": st.sampled_from([{"city": "Oslo"}, {}]),
}
_result = {"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1")}
_answered_use = st.tuples(
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.fixed_dictionaries(_use).map(lambda b: [b])}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.fixed_dictionaries(
                _result,
                optional={"content": _content, "is_error": st.booleans()},
            ).map(lambda b: [b]),
        }
    ),
).map(list)
_question = st.fixed_dictionaries({"role": st.just("user"), "content": _content}).map(lambda m: [m])
messages = st.builds(
    lambda turns, use, question: [m for turn in turns for m in turn] + use + question,
    st.lists(_turn, max_size=2),
    st.one_of(st.just([]), _answered_use),
    _question,
)
_wild_block = st.one_of(
    st.fixed_dictionaries({"type": wild_text}),
    st.fixed_dictionaries({"type": st.just("text"), "text": wild_text}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image", "document"]), "source": st.just({"type": "base64"})}
    ),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": wild, "signature": wild}),
    st.fixed_dictionaries({**_use, "id": wild_text, "input": wild}),
    st.fixed_dictionaries({**_result, "tool_use_id": wild_text, "content": wild}),
    wild,
)


@st.composite
def _one_wild_block(draw: st.DrawFn) -> list[Any]:
    """Plausible messages, one of them with a wild block among its own (or a wild role)."""
    given = draw(messages)
    index = draw(st.integers(0, len(given) - 1))
    message = dict(given[index])
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    if draw(st.booleans()):
        blocks.insert(draw(st.integers(0, len(blocks))), draw(_wild_block))
        message["content"] = blocks
    else:
        message["role"] = draw(wild_text)
    given[index] = message
    return given


_tool = st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "note", "", "a b"]), "input_schema": _schemas},
    optional={
        "description": plausible_text,
        "type": st.just("custom"),
        "cache_control": _cache,
    },
)
_tool_choice = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "none"])},
        optional={"disable_parallel_tool_use": st.booleans()},
    ),
    st.fixed_dictionaries({"type": st.just("tool"), "name": st.just("get_weather")}),
)
CONVERSATION_FIELDS: dict[str, st.SearchStrategy] = {
    "system": st.one_of(plausible_text, st.lists(_text, max_size=2)),
    "tools": st.lists(_tool, max_size=3),
    "tool_choice": _tool_choice,
    "thinking": st.one_of(
        st.just({"type": "disabled"}),
        st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": st.just(1024)}),
    ),
    "cache_control": _cache,
    "an_unknown_field": json_value,
}
MESSAGES_FIELDS = {
    **CONVERSATION_FIELDS,
    "stop_sequences": st.lists(plausible_text, max_size=3),
    "stream": st.booleans(),
    "temperature": st.floats(0, 1),
    "top_p": st.floats(0.1, 1),
    "top_k": st.integers(0, 64),
    "metadata": st.fixed_dictionaries({"user_id": plausible_text}),
    "output_config": st.fixed_dictionaries(
        {},
        optional={
            "effort": st.just("low"),
            "format": st.fixed_dictionaries({"type": st.just("json_schema"), "schema": _schemas}),
        },
    ),
    "service_tier": st.sampled_from(["auto", "standard_only"]),
}
WILD_VALUES: dict[str, st.SearchStrategy] = {
    "messages": st.one_of(_one_wild_block(), wild),
    "system": st.one_of(wild_text, st.lists(_wild_block, min_size=1, max_size=2), wild),
    "tools": st.one_of(
        st.lists(
            st.one_of(
                _tool,
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["web_search_20250305", "bash_20250124"])},
                    optional={"name": wild_text},
                ),
                st.fixed_dictionaries({"name": wild_text, "input_schema": wild}),
            ),
            min_size=1,
            max_size=2,
        ),
        wild,
    ),
    "tool_choice": st.one_of(
        st.fixed_dictionaries({"type": wild_text}, optional={"name": wild_text}), wild
    ),
    "output_config": st.one_of(
        st.fixed_dictionaries({"format": st.fixed_dictionaries({"type": wild_text})}), wild
    ),
}
_required = {"model": model, "messages": messages}
messages_body = _body({**_required, "max_tokens": st.integers(1, 8)}, MESSAGES_FIELDS, WILD_VALUES)
count_tokens_body = _body(_required, CONVERSATION_FIELDS, WILD_VALUES)
BODIES = {"/v1/messages": messages_body, "/v1/messages/count_tokens": count_tokens_body}
PATHS = frozenset(BODIES)  # routes answered in Anthropic's shape (POST)
ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "timeout_error",
        "overloaded_error",
    }
)
