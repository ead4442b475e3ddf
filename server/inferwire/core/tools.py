"""Tool calling: the rules a request's tools must satisfy, the grammar its calls are
decoded under, and the prompt the model sees them in.

For chat templates that know no tools the call syntax is Hermes'
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), the documented default: a
system-prompt section lists the tools and the syntax (as llama.cpp falls back to a
generic format). A template that renders tools itself gets them, and the conversation's
calls, as Hugging Face's templates take them, and its own syntax (core/tool_syntax.py:
its detection and the grammar a constrained backend decodes calls under).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jsonschema

from inferwire.core.chat import ChatMessage, Tool, ToolChoice, ToolChoiceMode, ToolSyntax
from inferwire.core.errors import FieldViolation
from inferwire.core.requests import InferenceRequest
from inferwire.core.schema_refs import definitions_under_all_of, embedded, reference_problem

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def choice_of(request: InferenceRequest) -> ToolChoiceMode | str:
    """What the request lets the model do: a mode, or the one function it must call."""
    choice = request.tool_choice or ToolChoice()
    if not request.tools:
        return ToolChoiceMode.NONE
    return choice.function or choice.mode


def parameters_schema(tool: Tool) -> dict[str, Any]:
    """The tool's parameter schema (an object with no properties when it has none)."""
    if not tool.parameters:
        return dict(_EMPTY_PARAMETERS)
    schema = json.loads(tool.parameters)
    assert isinstance(schema, dict)  # validated by tool_violations
    return schema


def tool_violations(request: InferenceRequest) -> Iterator[FieldViolation]:
    """Every tool, the tool choice and the messages' calls, named by their fields."""
    names: set[str] = set()
    if len(request.tools) > MAX_TOOLS:
        yield FieldViolation("tools", f"has {len(request.tools)} entries; at most {MAX_TOOLS}")
    for index, tool in enumerate(request.tools):
        if not _NAME.fullmatch(tool.name):
            yield FieldViolation(
                f"tools[{index}].name",
                "must be 1 to 64 characters: letters, digits, '_' and '-'",
            )
        elif tool.name in names:
            yield FieldViolation(f"tools[{index}].name", f"{tool.name!r} is given twice")
        names.add(tool.name)
        if (problem := _schema_problem(tool.parameters)) is not None:
            yield FieldViolation(f"tools[{index}].parameters_json_schema", problem)
    choice = request.tool_choice
    if choice is not None and choice.function and choice.function not in names:
        yield FieldViolation("tool_choice.function_name", f"names no tool: {choice.function!r}")
    elif choice is not None and not request.tools and choice.mode is ToolChoiceMode.REQUIRED:
        yield FieldViolation("tool_choice", "requires tools")
    if request.tools and request.params.constraint is not None:
        yield FieldViolation(request.params.constraint.field, "cannot be combined with tools")
    yield from _message_violations(request.messages)


def _schema_problem(text: str) -> str | None:
    if not text:
        return None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        return f"is not JSON: {exc}"
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    if schema.get("type", "object") != "object":
        return "must describe an object (`type: object`): arguments are named"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    return reference_problem(schema)


def _message_violations(messages: Sequence[ChatMessage]) -> Iterator[FieldViolation]:
    ids: set[str] = set()
    for index, message in enumerate(messages):
        for call_index, call in enumerate(message.tool_calls):
            where = f"messages[{index}].tool_calls[{call_index}]"
            if message.role != "assistant":
                yield FieldViolation(f"messages[{index}].tool_calls", "only assistants call")
                break
            if not call.id:
                yield FieldViolation(f"{where}.id", "must be non-empty")
            if not _NAME.fullmatch(call.name):
                yield FieldViolation(f"{where}.name", "must be a function name")
            try:
                json.loads(call.arguments or "{}")
            except ValueError:
                yield FieldViolation(f"{where}.arguments_json", "must be JSON text")
            ids.add(call.id)
        if message.role == "tool" and message.tool_call_id not in ids:
            yield FieldViolation(
                f"messages[{index}].tool_call_id",
                "matches no call of an earlier assistant message",
            )
        elif message.role != "tool" and message.tool_call_id:
            yield FieldViolation(f"messages[{index}].tool_call_id", "only tool messages have one")


def offered(request: InferenceRequest) -> tuple[Tool, ...]:
    """The tools the model may call: the named one, all, or none (`tool_choice: none`)."""
    choice = choice_of(request)
    if choice is ToolChoiceMode.NONE:
        return ()
    if isinstance(choice, str):
        return tuple(tool for tool in request.tools if tool.name == choice)
    return request.tools


def call_schema(tool: Tool, key: str = "arguments") -> dict[str, Any]:
    """A call of `tool` as one JSON object: its name first, so a stream can say it first,
    then its arguments under `key` (`parameters` in Llama 3's syntax). The schema's own
    references (`#/$defs/...`) are moved with it to where it sits in the envelope."""
    arguments = embedded(parameters_schema(tool), f"/properties/{key}")
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, key: closed(arguments)},
        "required": ["name", key],
        "additionalProperties": False,
    }


# An object with these is left as it is: its branches, or what it refers to, may name
# properties of their own that closing it would forbid.
_OPEN_BY = {"additionalProperties", "patternProperties", "allOf", "anyOf", "oneOf", "$ref"}
_SUBSCHEMAS = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: Any) -> Any:
    """`schema` with objects that list properties but leave `additionalProperties` unset
    closed to those (as xgrammar's strict mode, vLLM's default, reads them): what it allows
    is a subset of what the caller's schema allows, so every call still validates, and a
    model cannot write keys of its own until max_tokens (SDKs such as LangChain's drop
    `additionalProperties: false` from the schemas they send). Not inside `allOf`, whose
    branches each see only some of the properties, nor in a definition an `allOf` refers
    to (a `$ref` branch is such a branch too)."""
    return _closed(schema, definitions_under_all_of(schema))


def _closed(schema: Any, open_definitions: frozenset[str]) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and not _OPEN_BY & out.keys():
        out["additionalProperties"] = False
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = _closed(out[key], open_definitions)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(item, open_definitions) for item in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {
                name: value if name in open_definitions else _closed(value, open_definitions)
                for name, value in out[key].items()
            }
    return out


def tools_section(tools: Sequence[Tool], choice: ToolChoiceMode | str) -> str:
    """The system-prompt section that offers the tools in Hermes' syntax."""
    listed = "\n".join(json.dumps(function) for function in hf_tools(tools))
    must = (
        "You must call a tool."
        if choice is not ToolChoiceMode.AUTO
        else "Call a tool when it helps; otherwise answer in text."
    )
    return (
        "# Tools\n\nYou may call one or more functions. The functions are listed in "
        f"<tools></tools>:\n<tools>\n{listed}\n</tools>\n\n{must} For each call, answer "
        f"a JSON object with the name and arguments in {CALL_OPEN}{CALL_CLOSE} tags:\n"
        f'{CALL_OPEN}{{"name": <function-name>, "arguments": <args-json-object>}}{CALL_CLOSE}'
    )


def hf_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Tools as Hugging Face's chat templates take them (OpenAI's function objects)."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": parameters_schema(tool),
            },
        }
        for tool in tools
    ]


def hf_messages(
    messages: Sequence[ChatMessage], syntax: ToolSyntax = ToolSyntax.HERMES
) -> list[dict[str, Any]]:
    """Messages as Hugging Face's chat templates take them: calls with their arguments as
    objects, tool results (role `tool`) with the id of the call they answer. Mistral's
    templates refuse ids that are not 9 letters and digits: they get one made of each."""
    out: list[dict[str, Any]] = []
    ident = _mistral_id if syntax is ToolSyntax.MISTRAL else str
    for message in messages:
        entry: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": ident(call.id),
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.loads(call.arguments or "{}"),
                    },
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            entry["tool_call_id"] = ident(message.tool_call_id)
        out.append(entry)
    return out


def _mistral_id(call_id: str) -> str:
    """A 9-character alphanumeric id made of `call_id` (the same for its call and result)."""
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def format_call(name: str, arguments: str) -> str:
    """One call in the syntax the model writes it in (for earlier assistant turns)."""
    args = json.loads(arguments or "{}")
    text = json.dumps({"name": name, "arguments": args}, separators=(",", ":"))
    return CALL_OPEN + text + CALL_CLOSE


def messages_with_tools(request: InferenceRequest) -> tuple[ChatMessage, ...]:
    """The conversation as a template that knows no tools takes it: the tools section in
    the system message, earlier calls as the assistant's text, tool results as user turns
    in `<tool_response>` tags (as Hermes' and Qwen's templates render them)."""
    messages = [_plain(message) for message in request.messages]
    tools = offered(request)
    if tools:
        section = tools_section(tools, choice_of(request))
        if messages and messages[0].role == "system":
            messages[0] = ChatMessage("system", messages[0].content + "\n\n" + section)
        else:
            messages.insert(0, ChatMessage("system", section))
    return tuple(messages)


def _plain(message: ChatMessage) -> ChatMessage:
    if message.role == "tool":
        return ChatMessage("user", f"<tool_response>\n{message.content}\n</tool_response>")
    if message.tool_calls:
        calls = "\n".join(format_call(call.name, call.arguments) for call in message.tool_calls)
        content = f"{message.content}\n{calls}" if message.content else calls
        return ChatMessage(message.role, content)
    return message
