"""The tool-call parser and the grammar's schemas, without an engine: a call fed one
character at a time gives the same calls and text as fed whole, the name comes in its own
delta before any argument, and unset `additionalProperties` is closed only where that
keeps every call valid under the caller's schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from inferwire.core.chat import Tool
from inferwire.core.results import FinishReason
from inferwire.core.tool_calls import ToolCallParser, joined
from inferwire.core.tools import closed

NOTE = Tool("note", parameters=json.dumps({"type": "object", "properties": {"t": {}}}))
OUTPUT = (
    'Sure. <tool_call>{"name": "note", "arguments": {"t": "a </tool_call> {b}"}}</tool_call>'
    '<tool_call>{"name":"note","arguments":{"t":[1,{"x":"}"}]}}</tool_call>'
)


def _parse(pieces: list[str], constrained: bool) -> tuple[str, list, FinishReason]:
    parser = ToolCallParser([NOTE], constrained)
    text, deltas = "", []
    for piece in pieces:
        out, more = parser.feed(piece)
        text, deltas = text + out, deltas + more
    out, more = parser.finish()
    return text + out, deltas + more, parser.finish_reason(FinishReason.STOP)


@pytest.mark.parametrize("constrained", [True, False])
def test_calls_fed_a_character_at_a_time_are_the_calls_fed_whole(constrained: bool) -> None:
    whole_text, whole, reason = _parse([OUTPUT], constrained)
    text, deltas, _ = _parse(list(OUTPUT), constrained)
    calls = [(c.name, json.loads(c.arguments)) for c in joined(deltas)]
    assert calls == [(c.name, json.loads(c.arguments)) for c in joined(whole)]
    assert calls == [("note", {"t": "a </tool_call> {b}"}), ("note", {"t": [1, {"x": "}"}]})]
    assert text == whole_text == "Sure. " and reason is FinishReason.TOOL_CALLS


def test_a_streamed_name_comes_before_its_arguments_and_only_once() -> None:
    _, deltas, _ = _parse(list(OUTPUT), constrained=True)
    firsts = [d for d in deltas if d.id]
    assert [(d.index, d.name, d.arguments) for d in firsts] == [(0, "note", ""), (1, "note", "")]
    assert deltas.index(firsts[1]) > max(i for i, d in enumerate(deltas) if d.index == 0)
    assert all(not d.name for d in deltas if not d.id)


def test_a_call_cut_before_its_name_is_text_and_after_it_keeps_its_reason() -> None:
    assert _parse(['Hi <tool_call>{"na'], True)[:2] == ('Hi <tool_call>{"na', [])
    text, deltas, _ = _parse(['<tool_call>{"name": "note", "arguments": {"t": 1'], True)
    parser = ToolCallParser([NOTE], True)
    parser.feed('<tool_call>{"name": "note", "arguments": {"t": 1')
    assert parser.finish_reason(FinishReason.LENGTH) is FinishReason.LENGTH
    assert text == "" and joined(deltas)[0].arguments == '{"t": 1'


def test_unchecked_calls_that_do_not_validate_are_text() -> None:
    output = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    assert _parse([output], constrained=False) == (output, [], FinishReason.STOP)


def test_closing_objects_keeps_every_valid_call_valid_but_not_beside_or_inside_all_of() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {}}}},
        "allOf": [{"properties": {"c": {}}}],
        "$defs": {"d": {"properties": {"e": {}}}},
    }
    tight = closed(schema)
    # The root's allOf names `c`, perhaps as required: closing the root would forbid it.
    assert "additionalProperties" not in tight
    assert tight["properties"]["a"]["additionalProperties"] is False
    assert tight["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in tight["allOf"][0]
    jsonschema.validate({"a": {"b": 1}}, tight)
    jsonschema.validate({"a": {"b": 1}}, schema)  # what the tight one allows, the caller's does
    assert closed({"properties": {}, "additionalProperties": True})["additionalProperties"]
