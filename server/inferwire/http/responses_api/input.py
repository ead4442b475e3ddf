"""OpenAI's Responses request (`POST /v1/responses`) as the core's InferenceRequest.

`input` (a string, or items: messages with text parts, `function_call` and
`function_call_output` items) becomes chat messages, after `instructions` (a system
message) and the conversation of `previous_response_id`; a run of `function_call` items
is one assistant message's calls, as Chat Completions sends them. Tools (Responses' flat
function tools), `tool_choice`, `parallel_tool_calls` and `text.format` become the same
core fields as Chat Completions' (http/tools.py, http/requests.py). What inferwire cannot
do is refused naming the field (built-in tools, `background`, reasoning, image and file
parts, item types other than those three); a field it does not know is ignored and
logged once (requests.py), as OpenAI's clients send some by default (docs/http.md).
The core's violations are renamed to the body's fields: a message's to the input item
it came from (`input[3].call_id`), a chained conversation's to `previous_response_id`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from inferwire.core.chat import ChatMessage, Tool, ToolChoice, ToolChoiceMode
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.sampling import GenerationParams, OutputConstraint
from inferwire.http.bodies import BodyModel
from inferwire.http.requests import (
    json_schema_constraint,
    log_ignored,
    priority_of,
    request_id_violation,
    validation_error,
)
from inferwire.http.responses_api.items import Conversation
from inferwire.http.responses_api.store import StoredResponse
from inferwire.http.tools import FunctionDefinition, tool_of

# OpenAI's bounds on `metadata`.
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512


class TextFormat(BodyModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BodyModel):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint to OpenAI's models; ignored


class Reasoning(BodyModel):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesBody(BodyModel):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    user: str | None = None
    background: bool | None = None
    reasoning: Reasoning | None = None
    conversation: Any = None
    prompt: Any = None
    # inferwire's, as its Chat Completions takes them
    seed: int | None = None
    top_k: int | None = None
    request_id: str | None = None
    priority: str | int | None = None


class FunctionTool(FunctionDefinition):
    type: str


def read_body(body: Any) -> ResponsesBody:
    """The body's fields (decoded JSON); raises InvalidArgumentError naming the field."""
    try:
        parsed = ResponsesBody.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    log_ignored(parsed)
    if refused := list(_refusals(parsed)):
        raise InvalidArgumentError(refused)
    return parsed


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request as the core runs it, and what its answer echoes."""

    inference: InferenceRequest
    body: ResponsesBody
    tools: list[dict[str, Any]]  # the function tools as sent, for the answer
    # The conversation the answer continues: the chained one, then this input (without
    # `instructions`, which OpenAI does not carry over).
    conversation: tuple[ChatMessage, ...]
    sources: dict[str, str]  # `messages[3]`, `messages[3].tool_calls[0]` -> a body field

    def echo(self) -> dict[str, Any]:
        """The request's fields as the `response` object repeats them."""
        body = self.body
        return {
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "metadata": body.metadata or {},
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "text": text_json(body.text),
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": self.tools,
            "top_p": body.top_p,
            "truncation": "disabled",
            "user": body.user,
        }

    def field_of(self, core_field: str) -> str:
        """The body's field that the core's field `core_field` came from."""
        match = _MESSAGE_FIELD.match(core_field)
        if match is not None:
            whole, message, call = match["whole"], match["message"], match["call"]
            source = self.sources.get(whole if call else message, "input")
            if not source.startswith("input["):  # `input` as a string, the instructions
                return source  # or the chained conversation: the field as a whole
            rest = core_field[len(whole) :]
            return source + (_CALL_FIELDS if call else _MESSAGE_FIELDS).get(rest, rest)
        for pattern, replacement in _RENAMES:
            if pattern.match(core_field):
                return pattern.sub(replacement, core_field)
        return core_field.removeprefix("parameters.")


_MESSAGE_FIELD = re.compile(
    r"(?P<whole>(?P<message>messages\[\d+\])(?P<call>\.tool_calls\[\d+\])?)"
)
_CALL_FIELDS = {".arguments_json": ".arguments", ".id": ".call_id"}
_MESSAGE_FIELDS = {".tool_call_id": ".call_id"}
_RENAMES = (
    (re.compile(r"^messages$"), "input"),
    (re.compile(r"^prompt$"), "input"),
    (re.compile(r"^parameters\.max_tokens"), "max_output_tokens"),
    (re.compile(r"^parameters\.constraint\.json_schema"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.parameters_json_schema"), r"tools[\1].parameters"),
    (re.compile(r"^tool_choice\.function_name"), "tool_choice.name"),
)


def to_request(
    body: ResponsesBody,
    previous: StoredResponse | None,
    tenant: str,
    request_id: str | None,
    priority_hint: Priority | None = None,
) -> ResponsesRequest:
    """The request `body` asks for, after the conversation of `previous` (the response
    its `previous_response_id` names); raises InvalidArgumentError naming the field."""
    builder = Conversation(previous)
    if body.instructions is not None:
        builder.add(ChatMessage("system", body.instructions), "instructions")
    for message in previous.conversation if previous else ():
        builder.add(message, "previous_response_id")
    builder.add_input(body.input)
    if builder.violations:
        raise InvalidArgumentError(builder.violations[:8])
    tools, tools_json = _tools(body.tools)
    params = GenerationParams(
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k if body.top_k is not None and body.top_k > 0 else None,
        seed=body.seed,
        constraint=_constraint(body.text),
    )
    inference = InferenceRequest(
        request_id=request_id or body.request_id or "",
        model=body.model,
        prompt="",
        params=params,
        messages=tuple(builder.messages),
        tenant=tenant,
        priority=priority_of(body.priority),
        priority_hint=priority_hint,
        tools=tools,
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )
    # Without the instructions, which OpenAI does not carry over to a chained request.
    conversation = tuple(builder.messages[1 if body.instructions is not None else 0 :])
    return ResponsesRequest(inference, body, tools_json, conversation, builder.sources)


def _refusals(body: ResponsesBody) -> Iterator[FieldViolation]:
    if (violation := request_id_violation(body.request_id)) is not None:
        yield violation
    if body.background:
        yield FieldViolation("background", "is not supported: a response is made while asked")
    reasoning = body.reasoning
    if reasoning is not None and (
        reasoning.effort not in (None, "none") or reasoning.summary or reasoning.generate_summary
    ):
        yield FieldViolation(
            "reasoning",
            f"model {body.model[:64]!r} does not reason: it takes no reasoning effort or summary",
        )
    if body.conversation is not None:
        yield FieldViolation(
            "conversation", "is not supported: chain responses with previous_response_id"
        )
    if body.prompt is not None:
        yield FieldViolation("prompt", "prompt templates are not supported; send the input")
    metadata = body.metadata or {}
    if len(metadata) > MAX_METADATA_KEYS:
        yield FieldViolation("metadata", f"has {len(metadata)} keys; at most {MAX_METADATA_KEYS}")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            yield FieldViolation(
                "metadata",
                f"keys are at most {MAX_METADATA_KEY_CHARS} characters and values at most "
                f"{MAX_METADATA_VALUE_CHARS}",
            )
            break
    yield from _tool_refusals(body)


def _tool_refusals(body: ResponsesBody) -> Iterator[FieldViolation]:
    for index, tool in enumerate(body.tools or ()):
        if not isinstance(tool, dict):
            yield FieldViolation(f"tools[{index}]", "must be an object (a tool)")
        elif tool.get("type") != "function":
            kind = str(tool.get("type"))[:64]
            yield FieldViolation(
                f"tools[{index}].type",
                f"is {kind!r}; only function tools are supported (OpenAI's built-in tools "
                "run on OpenAI's servers)",
            )
    choice = body.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        yield FieldViolation("tool_choice", "must be none, auto, required or a function")
    elif isinstance(choice, dict) and choice.get("type") != "function":
        yield FieldViolation(
            "tool_choice.type",
            "only function tools are supported: none, auto, required or "
            '{"type": "function", "name": ...}',
        )
    elif isinstance(choice, dict) and not isinstance(choice.get("name"), str):
        yield FieldViolation("tool_choice.name", "must be a function's name")


def _tools(given: list[Any] | None) -> tuple[tuple[Tool, ...], list[dict[str, Any]]]:
    """The core's tools and the answer's echo of them."""
    tools: list[Tool] = []
    echoed: list[dict[str, Any]] = []
    for index, raw in enumerate(given or ()):
        try:
            function = FunctionTool.model_validate(raw)
        except ValidationError as exc:
            raise validation_error(exc, f"tools[{index}]") from None
        tools.append(tool_of(function, f"tools[{index}].parameters"))
        echoed.append(
            {
                "type": "function",
                "name": function.name,
                "description": function.description,
                "parameters": function.parameters,
                "strict": function.strict,
            }
        )
    return tuple(tools), echoed


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, dict):
        return ToolChoice(ToolChoiceMode.REQUIRED, str(choice["name"]))
    return ToolChoice(ToolChoiceMode(choice))


def _constraint(text: TextConfig | None) -> OutputConstraint | None:
    format_ = text.format if text is not None else None
    if format_ is None or format_.type == "text":
        return None
    if format_.type == "json_object":
        return json_schema_constraint({"type": "object"})
    if format_.schema_ is None:
        raise InvalidArgumentError([FieldViolation("text.format.schema", "is required")])
    return json_schema_constraint(format_.schema_)


def text_json(text: TextConfig | None) -> dict[str, Any]:
    """The answer's `text`: the format as asked (`{"type": "text"}` by default)."""
    format_ = text.format if text is not None else None
    if format_ is None:
        return {"format": {"type": "text"}}
    return {"format": format_.model_dump(by_alias=True, exclude_none=True)}
