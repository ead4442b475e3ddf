"""OpenAI request bodies (Completions, Chat Completions) as the core's InferenceRequest.

Field for field as OpenAI's API and vLLM's server take them; what inferwire does not do
is refused with the field named (`best_of`, `echo`, `suffix`, image or audio
parts; a sampling parameter the model's backend does not take), never ignored; a field
this server does not know at all is ignored and logged once per name, as vLLM does, so
that SDK upgrades that add fields do not break callers. The core's field violations are
renamed to the request's own fields (`parameters.max_tokens` -> `max_tokens`), so an
error's `param` is a field the caller sent. A `request_id` must be printable ASCII: it
comes back as the `x-request-id` header.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from inferwire.core.chat import ChatMessage
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.sampling import ConstraintKind, GenerationParams, OutputConstraint
from inferwire.http.bodies import BodyModel
from inferwire.http.tools import (
    MessageToolCall,
    ToolChoiceBody,
    ToolDefinition,
    calls_of,
    own_field,
    tool_choice_of,
    tools_of,
)

log = logging.getLogger(__name__)

_IGNORED_FIELDS: set[str] = set()  # unknown fields already logged (once per name)
# OpenAI's newer name for the system role; inferwire's templates know `system`.
_ROLE_ALIASES = {"developer": "system"}
_PRIORITIES = {p.label: p for p in Priority}
_HEADER_TEXT = re.compile(r"[\x20-\x7e]*")  # what a header value may carry, spelled plainly


class StreamOptions(BodyModel):
    include_usage: bool = False


class JsonSchemaFormat(BodyModel):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BodyModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ContentPart(BodyModel):
    type: str
    text: str | None = None


class Message(BodyModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class _Generation(BodyModel):
    """What both endpoints take."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    repetition_penalty: float | None = None  # vLLM's
    response_format: ResponseFormat | None = None
    # vLLM's extensions
    top_k: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    request_id: str | None = None
    priority: str | int | None = None


class CompletionBody(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatBody(_Generation):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoiceBody | None = None
    parallel_tool_calls: bool | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """A request as the core runs it, and what its answer must look like."""

    inference: InferenceRequest
    chat: bool
    stream: bool
    include_usage: bool
    # Core field -> the request's own field, for the violations the core finds.
    sources: Mapping[str, str] = field(default_factory=dict)

    def field_of(self, core_field: str) -> str:
        """The body's field that the core's field `core_field` came from."""
        if (own := own_field(core_field)) is not None:
            return own
        for core, own in self.sources.items():
            if core_field == core or core_field.startswith(core + "["):
                return own + core_field[len(core) :]
        return core_field.removeprefix("parameters.")


def parse(
    body: Any,
    chat: bool,
    tenant: str,
    request_id: str | None,
    priority_hint: Priority | None = None,
) -> ParsedRequest:
    """The request in `body` (decoded JSON); raises InvalidArgumentError naming the field.

    `request_id`: the caller's `X-Request-Id`, which wins over the body's `request_id`;
    `tenant`, `priority_hint`: who it runs as (edge/tenancy.py)."""
    model_type = ChatBody if chat else CompletionBody
    try:
        parsed = model_type.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    log_ignored(parsed)
    sources: dict[str, str] = {}
    refused = list(_refusals(parsed))
    if refused:
        raise InvalidArgumentError(refused)
    params = _params(parsed, sources)
    tools: dict[str, Any] = {}
    if isinstance(parsed, ChatBody):
        prompt, messages = "", _messages(parsed.messages)
        tools = {
            "tools": tools_of(parsed.tools),
            "tool_choice": tool_choice_of(parsed.tool_choice),
            "parallel_tool_calls": parsed.parallel_tool_calls is not False,
        }
    else:
        prompt, messages = _prompt(parsed.prompt), ()
    inference = InferenceRequest(
        request_id=request_id or parsed.request_id or "",
        model=parsed.model,
        prompt=prompt,
        params=params,
        messages=messages,
        tenant=tenant,
        priority=priority_of(parsed.priority),
        priority_hint=priority_hint,
        **tools,
    )
    options = parsed.stream_options
    include_usage = bool(parsed.stream and options is not None and options.include_usage)
    return ParsedRequest(inference, chat, parsed.stream, include_usage, sources)


def validation_error(exc: ValidationError, prefix: str = "") -> InvalidArgumentError:
    """pydantic's refusal of a body, as field violations named by the body's fields;
    `prefix`: where in the body the refused value is (`input[2]`), if not at its top."""
    return InvalidArgumentError(_violations(exc.errors(), prefix))


def _violations(errors: list[Any], prefix: str) -> list[FieldViolation]:
    """pydantic's errors by field; a union's alternatives joined (`a string or a list`)."""
    by_field: dict[str, list[str]] = {}
    for error in errors:
        messages = by_field.setdefault(_location(error["loc"], prefix), [])
        if error["msg"] not in messages:
            messages.append(error["msg"])
    return [
        FieldViolation(name, _joined(messages)) for name, messages in list(by_field.items())[:8]
    ]


def _joined(messages: list[str]) -> str:
    prefix = "Input should be "
    if all(m.startswith(prefix) for m in messages):
        return "must be " + " or ".join(m.removeprefix(prefix) for m in messages)
    return "; ".join(messages)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _location(loc: Iterable[Any], prefix: str = "") -> str:
    """pydantic's location as a path (`messages[0].content`), less its union tags."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.replace("_", "").isalnum() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
    return path or "body"


def log_ignored(parsed: BaseModel) -> None:
    """Log each field of `parsed` that no model field took, once per name."""
    for name in parsed.model_extra or {}:
        if name not in _IGNORED_FIELDS and len(_IGNORED_FIELDS) < 1000:
            _IGNORED_FIELDS.add(name)
            log.info("request field ignored", extra={"field": name[:64]})


def request_id_violation(request_id: str | None) -> FieldViolation | None:
    """Why a body's `request_id` cannot be taken (it comes back as a header), or None."""
    if request_id is None or _HEADER_TEXT.fullmatch(request_id):
        return None
    return FieldViolation(
        "request_id", "must be printable ASCII: it comes back as the x-request-id header"
    )


def _refusals(parsed: ChatBody | CompletionBody) -> Iterable[FieldViolation]:
    if (violation := request_id_violation(parsed.request_id)) is not None:
        yield violation
    if isinstance(parsed, CompletionBody):
        if parsed.best_of is not None and parsed.best_of != 1:
            yield FieldViolation("best_of", "is not supported (only 1)")
        if parsed.echo:
            yield FieldViolation("echo", "is not supported")
        if parsed.suffix:
            yield FieldViolation("suffix", "is not supported")
    else:
        for index, message in enumerate(parsed.messages):
            if isinstance(message.content, list):
                for part_index, part in enumerate(message.content):
                    if part.type != "text" or part.text is None:
                        yield FieldViolation(
                            f"messages[{index}].content[{part_index}].type",
                            f"is {part.type!r}; only text parts are supported",
                        )


def _params(parsed: ChatBody | CompletionBody, sources: dict[str, str]) -> GenerationParams:
    max_tokens = parsed.max_tokens
    if isinstance(parsed, ChatBody) and parsed.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != parsed.max_completion_tokens:
            raise InvalidArgumentError(
                [FieldViolation("max_tokens", "differs from max_completion_tokens; send one")]
            )
        max_tokens = parsed.max_completion_tokens
        sources["parameters.max_tokens"] = "max_completion_tokens"
    if isinstance(parsed, ChatBody):
        logprobs, top_logprobs = bool(parsed.logprobs), parsed.top_logprobs or 0
    else:  # Completions: `logprobs: N` asks for the N most likely alternatives too
        logprobs, top_logprobs = parsed.logprobs is not None, parsed.logprobs or 0
        sources["parameters.top_logprobs"] = "logprobs"
    stop = parsed.stop
    if isinstance(stop, str):
        sources["parameters.stop[0]"] = "stop"
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=parsed.temperature,
        top_p=parsed.top_p,
        # vLLM's -1 (and 0) mean "no top-k".
        top_k=parsed.top_k if parsed.top_k is not None and parsed.top_k > 0 else None,
        seed=parsed.seed,
        min_tokens=parsed.min_tokens,
        ignore_eos=bool(parsed.ignore_eos),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        constraint=_constraint(parsed, sources),
        presence_penalty=parsed.presence_penalty,
        frequency_penalty=parsed.frequency_penalty,
        repetition_penalty=parsed.repetition_penalty,
        logit_bias=_logit_bias(parsed.logit_bias),
        n=parsed.n,
    )


def _logit_bias(bias: dict[str, Any] | None) -> dict[int, float]:
    """OpenAI's `logit_bias` (token ids as strings) as the core's; the core checks the
    ranges."""
    taken: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not key.isdigit() or len(key) > 10:
            why = "must be a token id (a decimal string)"
            raise InvalidArgumentError([FieldViolation(f"logit_bias[{key[:32]!r}]", why)])
        if isinstance(value, bool) or not isinstance(value, int | float):
            why = f"must be a number, got {type(value).__name__}"
            raise InvalidArgumentError([FieldViolation(f"logit_bias[{key}]", why)])
        taken[int(key)] = float(value)
    return taken


def _constraint(
    parsed: ChatBody | CompletionBody, sources: dict[str, str]
) -> OutputConstraint | None:
    given: list[tuple[str, OutputConstraint]] = []
    response_format = parsed.response_format
    if response_format is not None and response_format.type == "json_object":
        given.append(("response_format", json_schema_constraint({"type": "object"})))
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema
        if schema is None or schema.schema_ is None:
            raise InvalidArgumentError(
                [FieldViolation("response_format.json_schema.schema", "is required")]
            )
        given.append(("response_format", json_schema_constraint(schema.schema_)))
    if parsed.guided_json is not None:
        text = parsed.guided_json
        given.append(
            (
                "guided_json",
                json_schema_constraint(text)
                if isinstance(text, dict)
                else OutputConstraint(ConstraintKind.JSON_SCHEMA, text),
            )
        )
    if parsed.guided_regex is not None:
        given.append(("guided_regex", OutputConstraint(ConstraintKind.REGEX, parsed.guided_regex)))
    if parsed.guided_grammar is not None:
        grammar = OutputConstraint(ConstraintKind.LARK_GRAMMAR, parsed.guided_grammar)
        given.append(("guided_grammar", grammar))
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise InvalidArgumentError(
            [FieldViolation(given[1][0], f"set one of {names}, not several")]
        )
    if not given:
        return None
    name, constraint = given[0]
    sources[constraint.field] = name
    return constraint


def json_schema_constraint(schema: dict[str, Any]) -> OutputConstraint:
    """Output valid under `schema`, a JSON Schema."""
    return OutputConstraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))


def _messages(messages: list[Message]) -> tuple[ChatMessage, ...]:
    converted = []
    for message in messages:
        content = message.content
        if isinstance(content, list):  # text parts, as vLLM joins them
            content = "\n".join(part.text or "" for part in content)
        converted.append(
            ChatMessage(
                _ROLE_ALIASES.get(message.role, message.role),
                content or "",
                calls_of(message.tool_calls),
                message.tool_call_id or "",
            )
        )
    return tuple(converted)


def _prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if prompt and all(isinstance(p, str) for p in prompt):
        why = "a list of several prompts is not supported; send one prompt per request"
    else:
        why = "token ids are not supported as a prompt; send its text"
    raise InvalidArgumentError([FieldViolation("prompt", why)])


def priority_of(priority: str | int | None) -> Priority | None:
    """A body's `priority`: inferwire's level names (vLLM's integers are refused)."""
    if priority is None:
        return None
    if isinstance(priority, str) and priority in _PRIORITIES:
        return _PRIORITIES[priority]
    levels = ", ".join(_PRIORITIES)
    kind = (
        "vLLM's integer priorities are not" if isinstance(priority, int) else f"{priority!r} is not"
    )
    raise InvalidArgumentError(
        [FieldViolation("priority", f"{kind} inferwire's; use one of {levels}")]
    )
