"""Anthropic's Messages request (`POST /v1/messages`, and `/count_tokens`) as the core's
InferenceRequest.

`system` and `messages` become chat messages (anthropic/blocks.py); `max_tokens`
(required, as Anthropic's), `stop_sequences`, `temperature`, `top_p` and `top_k` (which
the anthropic SDK 2.x sends through `extra_body`, at the body's top all the same) the
core's parameters; `tools` (custom tools: `name`, `description`, `input_schema`) and
`tool_choice` (`auto`, `any`, `tool` with a `name`, `none`; `disable_parallel_tool_use`)
the same core tools as OpenAI's, decoded under the same grammar where the backend
constrains; `output_config.format` (or the older `output_format`), a JSON schema, the
output constraint. Taken and ignored: `metadata`, `cache_control` (here and on any block
or tool: the continuous path keeps every prompt's tokens cached anyway), `thinking` and
`output_config.effort` (no inferwire model reasons), `service_tier`, and whatever else
Anthropic's clients send that changes nothing here (logged once per name, requests.py).
Refused naming the field: Anthropic's server tools (`tools[i].type`), `mcp_servers`, and
what the core refuses, named by this body's fields (`max_tokens`, `stop_sequences[0]`,
`tools[0].input_schema`, `tool_choice.name`, `messages[2].content[0].tool_use_id`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from inferwire.core.chat import ChatMessage, Tool, ToolChoice, ToolChoiceMode
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.sampling import GenerationParams, OutputConstraint
from inferwire.core.tools import messages_with_tools
from inferwire.http.anthropic.blocks import Conversation
from inferwire.http.bodies import BodyModel
from inferwire.http.requests import (
    json_schema_constraint,
    log_ignored,
    priority_of,
    request_id_violation,
    validation_error,
)
from inferwire.http.tools import FunctionDefinition, tool_of

_CHOICES = {
    "auto": ToolChoiceMode.AUTO,
    "any": ToolChoiceMode.REQUIRED,
    "none": ToolChoiceMode.NONE,
}


class JsonFormat(BodyModel):
    type: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(BodyModel):
    effort: str | None = None  # a reasoning model's; ignored
    format: JsonFormat | None = None


class ToolParam(BodyModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None  # `custom`, or one of Anthropic's server tools
    strict: bool | None = None


class ToolChoiceParam(BodyModel):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensBody(BodyModel):
    """What `/v1/messages/count_tokens` reads: the conversation and its tools."""

    model: str
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: Any = None
    cache_control: Any = None
    output_config: OutputConfig | None = None
    output_format: JsonFormat | None = None
    mcp_servers: list[Any] | None = None


class MessagesBody(CountTokensBody):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Any = None
    service_tier: str | None = None
    # inferwire's, as its Chat Completions takes them
    seed: int | None = None
    request_id: str | None = None
    priority: str | int | None = None


def read_body(body: Any, count_only: bool = False) -> CountTokensBody:
    """The body's fields (decoded JSON): a Messages request's, or with `count_only`
    count_tokens'; raises InvalidArgumentError naming the field."""
    try:
        parsed = (CountTokensBody if count_only else MessagesBody).model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    log_ignored(parsed)
    if refused := list(_refusals(parsed)):
        raise InvalidArgumentError(refused[:8])
    return parsed


@dataclass(frozen=True)
class MessagesRequest:
    """A Messages request as the core runs it, and what its answer needs of the body."""

    inference: InferenceRequest
    body: CountTokensBody
    sources: dict[str, str]  # `messages[3]`, `messages[3].tool_calls[0]` -> a body field

    def field_of(self, core_field: str) -> str:
        """The body's field that the core's field `core_field` came from."""
        match = _MESSAGE_FIELD.match(core_field)
        if match is not None:
            whole, message, call = match["whole"], match["message"], match["call"]
            source = self.sources.get(whole if call else message, "messages")
            if source in ("system", "messages"):
                return source
            rest = core_field[len(whole) :]
            return source + (_CALL_FIELDS if call else _MESSAGE_FIELDS).get(rest, rest)
        for pattern, replacement in self._renames():
            if pattern.match(core_field):
                return pattern.sub(replacement, core_field)
        return core_field.removeprefix("parameters.")

    def _renames(self) -> tuple[tuple[re.Pattern[str], str], ...]:
        output = "output_format" if self.body.output_format is not None else "output_config.format"
        return (*_RENAMES, (re.compile(r"^parameters\.constraint\.json_schema"), output))


_MESSAGE_FIELD = re.compile(
    r"(?P<whole>(?P<message>messages\[\d+\])(?P<call>\.tool_calls\[\d+\])?)"
)
_CALL_FIELDS = {".arguments_json": ".input"}
_MESSAGE_FIELDS = {".tool_call_id": ".tool_use_id"}
_RENAMES = (
    (re.compile(r"^prompt$"), "messages"),
    (re.compile(r"^parameters\.stop"), "stop_sequences"),
    (re.compile(r"^tools\[(\d+)\]\.parameters_json_schema"), r"tools[\1].input_schema"),
    (re.compile(r"^tool_choice\.function_name"), "tool_choice.name"),
)


def to_request(
    body: CountTokensBody,
    tenant: str,
    request_id: str | None,
    priority_hint: Priority | None = None,
) -> MessagesRequest:
    """The request `body` asks for; raises InvalidArgumentError naming the field."""
    conversation = Conversation()
    conversation.add_system(body.system)
    conversation.add_messages(body.messages)
    if not body.messages:
        conversation.violations.append(FieldViolation("messages", "must hold a message"))
    if conversation.violations:
        raise InvalidArgumentError(conversation.violations[:8])
    params, priority = GenerationParams(), None
    if isinstance(body, MessagesBody):
        request_id = request_id or body.request_id
        priority = priority_of(body.priority)
        params = GenerationParams(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k if body.top_k is not None and body.top_k > 0 else None,
            seed=body.seed,
            stop=tuple(body.stop_sequences or ()),
            constraint=_constraint(body),
        )
    choice = body.tool_choice
    inference = InferenceRequest(
        request_id=request_id or "",
        model=body.model,
        prompt="",
        params=params,
        messages=tuple(conversation.messages),
        tenant=tenant,
        priority=priority,
        priority_hint=priority_hint,
        tools=_tools(body.tools),
        tool_choice=None if choice is None else _tool_choice(choice),
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
    )
    return MessagesRequest(inference, body, conversation.sources)


def _refusals(body: CountTokensBody) -> Iterator[FieldViolation]:
    if isinstance(body, MessagesBody) and (violation := request_id_violation(body.request_id)):
        yield violation
    if body.mcp_servers:
        yield FieldViolation(
            "mcp_servers", "is not supported: Anthropic's MCP connector runs on its servers"
        )
    for index, tool in enumerate(body.tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            yield FieldViolation(
                f"tools[{index}].type",
                f"is {str(kind)[:64]!r}; only custom tools (name, description, input_schema) "
                "are supported: Anthropic's server tools run on Anthropic's servers",
            )
    choice = body.tool_choice
    if choice is not None and choice.type not in (*_CHOICES, "tool"):
        yield FieldViolation("tool_choice.type", "must be auto, any, tool or none")
    elif choice is not None and choice.type == "tool" and choice.name is None:
        yield FieldViolation("tool_choice.name", "is required with type tool")
    given = [(n, f) for n, f in _formats(body) if f is not None]
    if len(given) > 1:
        yield FieldViolation("output_format", "set output_config.format or output_format, not both")
    for name, format_ in given:
        if format_.type != "json_schema":
            yield FieldViolation(f"{name}.type", "must be json_schema")
        elif format_.schema_ is None:
            yield FieldViolation(f"{name}.schema", "is required")


def _formats(body: CountTokensBody) -> tuple[tuple[str, JsonFormat | None], ...]:
    config = body.output_config
    return (
        ("output_config.format", config.format if config is not None else None),
        ("output_format", body.output_format),
    )


def _constraint(body: CountTokensBody) -> OutputConstraint | None:
    for _, format_ in _formats(body):
        if format_ is not None and format_.schema_ is not None:
            return json_schema_constraint(format_.schema_)
    return None


def _tools(given: list[Any] | None) -> tuple[Tool, ...]:
    tools: list[Tool] = []
    for index, raw in enumerate(given or ()):
        try:
            tool = ToolParam.model_validate(raw)
        except ValidationError as exc:
            raise validation_error(exc, f"tools[{index}]") from None
        function = FunctionDefinition(
            name=tool.name,
            description=tool.description,
            parameters=tool.input_schema,
            strict=tool.strict,
        )
        tools.append(tool_of(function, f"tools[{index}].input_schema"))
    return tuple(tools)


def _tool_choice(choice: ToolChoiceParam) -> ToolChoice:
    if choice.type == "tool":
        return ToolChoice(ToolChoiceMode.REQUIRED, choice.name or "")
    return ToolChoice(_CHOICES[choice.type])


def counted_messages(asked: MessagesRequest) -> tuple[ChatMessage, ...]:
    """The conversation count_tokens counts: with its tools in the system prompt and the
    calls as text, as a template that knows no tools sees them (core/tools.py)."""
    return messages_with_tools(asked.inference)
