"""The call syntax read from a chat template's markers, and each syntax's parser on
scripted output: text then a call, several calls, a call cut by max_tokens, the closing
marker inside a string argument, and a stream fed a character at a time giving the unary
answer; the arguments come back under `arguments` whatever the model's key."""

from __future__ import annotations

import json

import pytest

from inferwire.core.chat import ChatMessage, Tool, ToolCall, ToolChoice, ToolChoiceMode, ToolSyntax
from inferwire.core.requests import InferenceRequest
from inferwire.core.results import FinishReason
from inferwire.core.tool_calls import ToolCallParser, joined
from inferwire.core.tool_syntax import template_syntax, tool_grammar
from inferwire.core.tools import hf_messages

# Template snippets written for these tests, each with the markers of its family.
HERMES_TEMPLATE = (
    "{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    'Answer <tool_call>{"name": ..., "arguments": ...}</tool_call>{% endif %}'
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
)
LLAMA3_TEMPLATE = (
    "{%- if tools is not none %}Environment: ipython\n{%- endif %}"
    "{%- for t in tools %}{{ t | tojson(indent=4) }}{% endfor %}"
    'Respond with {"name": function name, "parameters": dictionary of argument name and value}'
    "{%- for m in messages %}{%- if m.role == 'ipython' or m.role == 'tool' %}"
    "<|start_header_id|>ipython<|end_header_id|>{{ m.content }}<|eot_id|>"
    "{%- elif m.tool_calls %}<|python_tag|>{{ m.tool_calls[0].function | tojson }}"
    "{%- endif %}{%- endfor %}"
)
MISTRAL_TEMPLATE = (
    "{%- for m in messages %}{%- if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{%- endif %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}[TOOL_CALLS][{%- for c in m.tool_calls %}{{ c.function | tojson }}"
    "{%- endfor %}]{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}"
)
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role | upper }}:\n{{ m.content }}\n\n{% endfor %}"


@pytest.mark.parametrize(
    ("template", "syntax"),
    [
        (HERMES_TEMPLATE, ToolSyntax.HERMES),
        (LLAMA3_TEMPLATE, ToolSyntax.LLAMA3_JSON),
        (MISTRAL_TEMPLATE, ToolSyntax.MISTRAL),
        ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}", ToolSyntax.MISTRAL),
        (
            "{% if tools %}{{ tools | tojson }}{% endif %}{% if m.role == 'ipython' %}",
            ToolSyntax.LLAMA3_JSON,
        ),
        # Hermes' tag decides over the others' markers.
        ("{% if tools %}<tool_call>[TOOL_CALLS]<|python_tag|>{% endif %}", ToolSyntax.HERMES),
        (PLAIN_TEMPLATE, None),  # knows no tools: the Hermes default
        ("[TOOL_CALLS] <|python_tag|> <tool_call>", None),  # markers, but never `tools`
        ("{% if tools %}{{ tools | tojson }}{% endif %}", None),  # tools, no syntax it knows
        (None, None),
    ],
)
def test_the_syntax_is_read_from_the_templates_markers(
    template: str | None, syntax: ToolSyntax | None
) -> None:
    assert template_syntax(template) is syntax


NOTE = Tool("note", parameters=json.dumps({"type": "object", "properties": {"t": {}}}))
WEATHER = Tool(
    "get_weather",
    parameters=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
TOOLS = [NOTE, WEATHER]
# For each syntax: text then two calls, a string argument holding the closing markers.
OUTPUTS = {
    ToolSyntax.HERMES: (
        'Sure. <tool_call>{"name": "note", "arguments": {"t": "a </tool_call> }"}}</tool_call>'
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    ),
    ToolSyntax.LLAMA3_JSON: (
        'Sure. <|python_tag|>{"name": "note", "parameters": {"t": "a }; {\\"name\\" ]"}}; '
        '{"name":"get_weather","parameters":{"city":"Paris"}}'
    ),
    ToolSyntax.MISTRAL: (
        'Sure. [TOOL_CALLS][{"name": "note", "arguments": {"t": "a }] [TOOL_CALLS]"}}, '
        '{"name":"get_weather","arguments":{"city":"Paris"}}]'
    ),
}
EXPECTED = {
    ToolSyntax.HERMES: [("note", {"t": "a </tool_call> }"}), ("get_weather", {"city": "Paris"})],
    ToolSyntax.LLAMA3_JSON: [
        ("note", {"t": 'a }; {"name" ]'}),
        ("get_weather", {"city": "Paris"}),
    ],
    ToolSyntax.MISTRAL: [
        ("note", {"t": "a }] [TOOL_CALLS]"}),
        ("get_weather", {"city": "Paris"}),
    ],
}


def _parse(
    syntax: ToolSyntax,
    pieces: list[str],
    constrained: bool,
    reason: FinishReason = FinishReason.STOP,
) -> tuple[str, list, FinishReason]:
    parser = ToolCallParser(TOOLS, constrained, syntax)
    text, deltas = "", []
    for piece in pieces:
        out, more = parser.feed(piece)
        text, deltas = text + out, deltas + more
    out, more = parser.finish()
    return text + out, deltas + more, parser.finish_reason(reason)


@pytest.mark.parametrize("constrained", [True, False])
@pytest.mark.parametrize("syntax", list(ToolSyntax))
def test_text_then_several_calls_streamed_a_character_at_a_time_as_unary(
    syntax: ToolSyntax, constrained: bool
) -> None:
    output = OUTPUTS[syntax]
    whole_text, whole, reason = _parse(syntax, [output], constrained)
    text, deltas, _ = _parse(syntax, list(output), constrained)
    calls = [(c.name, json.loads(c.arguments)) for c in joined(deltas)]
    assert calls == [(c.name, json.loads(c.arguments)) for c in joined(whole)] == EXPECTED[syntax]
    assert text == whole_text == "Sure. " and reason is FinishReason.TOOL_CALLS
    if constrained:  # the streamed fragments are the unary arguments, byte for byte
        assert [c.arguments for c in joined(deltas)] == [c.arguments for c in joined(whole)]
        firsts = [d for d in deltas if d.id]
        assert [(d.index, d.name, d.arguments) for d in firsts] == [
            (0, "note", ""),
            (1, "get_weather", ""),
        ]
        assert all(not d.name for d in deltas if not d.id)


@pytest.mark.parametrize("syntax", list(ToolSyntax))
def test_a_call_cut_by_max_tokens(syntax: ToolSyntax) -> None:
    output = OUTPUTS[syntax]
    cut = output[: output.index('"t": "a') + 7]  # inside the first call's arguments
    text, deltas, reason = _parse(syntax, list(cut), True, FinishReason.LENGTH)
    assert text == "Sure. " and reason is FinishReason.LENGTH
    assert [(c.name, c.arguments) for c in joined(deltas)] == [("note", '{"t": "a')]
    # Unchecked, the cut call is text; cut before the name, it is text either way.
    assert _parse(syntax, [cut], False, FinishReason.LENGTH) == (cut, [], FinishReason.LENGTH)
    before_name = output[: output.index('"name"') + 3]
    assert _parse(syntax, list(before_name), True)[:2] == (before_name, [])


@pytest.mark.parametrize(
    ("syntax", "output"),
    [
        (ToolSyntax.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": 7}}'),
        (ToolSyntax.LLAMA3_JSON, '{"name": "absent", "parameters": {}}'),
        (ToolSyntax.LLAMA3_JSON, 'I would say {"name": "note"} is a dict.'),
        (ToolSyntax.MISTRAL, '[TOOL_CALLS]{"name": "note", "arguments": {}}'),  # not a list
        (ToolSyntax.MISTRAL, '[TOOL_CALLS][{"name": "note", "parameters": {}}]'),  # key
    ],
)
def test_unchecked_calls_that_do_not_validate_are_text(syntax: ToolSyntax, output: str) -> None:
    assert _parse(syntax, [output], False) == (output, [], FinishReason.STOP)


def test_llama3_calls_without_the_python_tag_and_with_arguments_as_the_key() -> None:
    output = '{"name": "note", "arguments": {"t": 1}}'
    for constrained in (True, False):
        text, deltas, reason = _parse(ToolSyntax.LLAMA3_JSON, list(output), constrained)
        assert (text, reason) == ("", FinishReason.TOOL_CALLS)
        assert [(c.name, json.loads(c.arguments)) for c in joined(deltas)] == [("note", {"t": 1})]


def _request(choice: ToolChoice, parallel: bool = True) -> InferenceRequest:
    return InferenceRequest(
        request_id="r",
        model="m",
        prompt="",
        tools=tuple(TOOLS),
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )


def test_each_grammar_has_its_syntax_and_auto_its_lazy_trigger() -> None:
    auto, required = ToolChoice(ToolChoiceMode.AUTO), ToolChoice(ToolChoiceMode.REQUIRED)
    llama = tool_grammar(_request(auto), ToolSyntax.LLAMA3_JSON)
    assert llama is not None
    assert "start: TEXT | opened | named\n" in llama.text
    assert "prefix[lazy]: /(.|\\n)*<\\|python_tag\\|>/" in llama.text
    assert '\\{"name"|<\\|python_tag\\|>' in llama.text and '"parameters"' in llama.text
    mistral = tool_grammar(_request(required, parallel=False), ToolSyntax.MISTRAL)
    assert mistral is not None
    assert mistral.text.startswith('start: "[TOOL_CALLS]" "[" call "]"\n')
    named = tool_grammar(_request(ToolChoice(function="note")), ToolSyntax.MISTRAL)
    assert named is not None and "get_weather" not in named.text


def test_mistral_history_gets_nine_character_ids_matching_their_results() -> None:
    history = (
        ChatMessage("assistant", "", (ToolCall("call_0123456789abcdef", "note", '{"t": 1}'),)),
        ChatMessage("tool", "done", tool_call_id="call_0123456789abcdef"),
    )
    call, result = hf_messages(history, ToolSyntax.MISTRAL)
    ident = call["tool_calls"][0]["id"]
    assert len(ident) == 9 and ident.isalnum() and result["tool_call_id"] == ident
    assert call["tool_calls"][0]["function"]["arguments"] == {"t": 1}
    assert hf_messages(history)[1]["tool_call_id"] == "call_0123456789abcdef"
