"""OpenAI's tool fields of Chat Completions as the core's tools, and back.

`tools` (type `function`), `tool_choice` (`none`, `auto`, `required` or a named
function), `parallel_tool_calls`, assistant messages' `tool_calls` and tool messages'
`tool_call_id`, field for field as OpenAI takes them. The core names its fields as the
gRPC contract does; `own_field` renames them to the body's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from inferwire.core.chat import Tool, ToolCall, ToolCallDelta, ToolChoice, ToolChoiceMode
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.http.bodies import BodyModel


class FunctionDefinition(BodyModel):
    name: str = ""
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


class ToolDefinition(BodyModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BodyModel):
    name: str


class NamedToolChoice(BodyModel):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(BodyModel):
    name: str
    arguments: str


class MessageToolCall(BodyModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


ToolChoiceBody = Literal["none", "auto", "required"] | NamedToolChoice

# The core's (gRPC) names of tool fields -> the body's.
_RENAMES = (
    (re.compile(r"^tools\[(\d+)\]\.name"), r"tools[\1].function.name"),
    (re.compile(r"^tools\[(\d+)\]\.parameters_json_schema"), r"tools[\1].function.parameters"),
    (re.compile(r"^tool_choice\.function_name"), "tool_choice.function.name"),
    (
        re.compile(r"^(messages\[\d+\]\.tool_calls\[\d+\])\.(name|arguments)(_json)?"),
        r"\1.function.\2",
    ),
)


def own_field(core_field: str) -> str | None:
    """The body's name of a core tool field; None for another field."""
    for pattern, replacement in _RENAMES:
        if pattern.match(core_field):
            return pattern.sub(replacement, core_field)
    return None


def tools_of(definitions: list[ToolDefinition] | None) -> tuple[Tool, ...]:
    return tuple(
        tool_of(definition.function, f"tools[{index}].function.parameters")
        for index, definition in enumerate(definitions or ())
    )


def tool_of(function: FunctionDefinition, parameters_field: str) -> Tool:
    """The core's tool of a function's definition (Chat Completions' `function`, or a
    Responses tool, which has the same fields at its top)."""
    parameters = function.parameters
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidArgumentError(
            [FieldViolation(parameters_field, "must be a JSON Schema object")]
        )
    text = json.dumps(parameters) if parameters is not None else ""
    return Tool(function.name, function.description or "", text, bool(function.strict))


def tool_choice_of(choice: ToolChoiceBody | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, NamedToolChoice):
        return ToolChoice(ToolChoiceMode.REQUIRED, choice.function.name)
    return ToolChoice(ToolChoiceMode(choice))


def calls_of(calls: Iterable[MessageToolCall] | None) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in calls or ())


def calls_json(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """`message.tool_calls` of a whole answer."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls
    ]


def deltas_json(deltas: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
    """`delta.tool_calls` of a streamed chunk: a call's first with its id, type and name
    and `arguments: ""`, later ones its index and an argument fragment."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        if delta.id:
            function = {"name": delta.name, "arguments": delta.arguments}
            out.append(
                {"index": delta.index, "id": delta.id, "type": "function", "function": function}
            )
        else:
            out.append({"index": delta.index, "function": {"arguments": delta.arguments}})
    return out
