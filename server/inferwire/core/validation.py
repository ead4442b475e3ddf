"""Request validation that needs no model: shapes, ranges and server-wide limits.

Every violation names the request field, so clients can point at it. Limits
that depend on the loaded model (max_tokens and min_tokens against its output limit, the
context window) are checked by the model manager and the backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from inferwire.core.chat import CHAT_ROLES, ChatMessage
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import sampling_violations
from inferwire.core.tools import tool_violations

MAX_STOP_SEQUENCES = 16
MAX_CONTEXT_ENTRIES = 64
MAX_CHAT_MESSAGES = 256
MAX_REQUEST_ID_CHARS = 128

# ONNX Runtime GenAI's tokenizer reads text as a C string: everything after a NUL would be
# dropped without a word, so text that holds one is refused rather than silently cut.
NUL = "\x00"
NUL_PROBLEM = "contains a NUL character (U+0000); the text after it would be lost"


@dataclass(frozen=True)
class RequestLimits:
    """Server-wide request limits from the configuration."""

    max_prompt_bytes: int


# What a model may be called: the configuration enforces it, so a name that does not
# match cannot be a configured model, and is refused before it is looked up or echoed.
MAX_MODEL_NAME_CHARS = 128
MODEL_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_MODEL_NAME_CHARS - 1}}}$"
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN)
_NAME_START = re.compile(r"[A-Za-z0-9]")
_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")


def model_name_problem(model: str) -> str | None:
    """Why `model` cannot name a model, without repeating it; None when it can."""
    if not model:
        return "must be a non-empty model name"
    if len(model) > MAX_MODEL_NAME_CHARS:
        return f"is {len(model)} characters; model names have at most {MAX_MODEL_NAME_CHARS}"
    if not _MODEL_NAME.fullmatch(model):  # fullmatch: `$` would let a final newline in
        if not _NAME_START.match(model):
            return f"must start with a letter or digit (A-Z, a-z, 0-9), not {model[0]!r}"
        position, char = next((i, c) for i, c in enumerate(model) if not _NAME_CHAR.match(c))
        return (
            f"{char!r} (character {position + 1}) is not allowed: a model name holds only "
            "letters, digits, '.', '_' and '-'"
        )
    return None


def require_model_name(model: str) -> None:
    if (problem := model_name_problem(model)) is not None:
        raise InvalidArgumentError([FieldViolation("model", problem)])


def validate_inference_request(request: InferenceRequest, limits: RequestLimits) -> None:
    """Raise InvalidArgumentError listing every invalid field of the request."""
    violations = list(_violations(request, limits))
    if violations:
        raise InvalidArgumentError(violations)


def validate_text_input(
    model: str, prompt: str, messages: tuple[ChatMessage, ...], limits: RequestLimits
) -> None:
    """Check a Tokenize request's model, and its prompt or messages."""
    violations = []
    if (problem := model_name_problem(model)) is not None:
        violations.append(FieldViolation("model", problem))
    violations += _prompt_or_messages_violations(prompt, messages, limits)
    if violations:
        raise InvalidArgumentError(violations)


def _prompt_or_messages_violations(
    prompt: str, messages: tuple[ChatMessage, ...], limits: RequestLimits
) -> Iterator[FieldViolation]:
    """Exactly one of prompt and messages, within the size limit, roles known, no NUL."""
    if prompt and messages:
        yield FieldViolation("messages", "set either prompt or messages, not both")
    if not prompt and not messages:
        yield FieldViolation("prompt", "must be non-empty (or send messages instead)")
    prompt_bytes = len(prompt.encode())
    if prompt_bytes > limits.max_prompt_bytes:
        yield FieldViolation(
            "prompt", f"is {prompt_bytes} bytes; the limit is {limits.max_prompt_bytes} bytes"
        )
    if NUL in prompt:
        yield FieldViolation("prompt", NUL_PROBLEM)
    if len(messages) > MAX_CHAT_MESSAGES:
        yield FieldViolation(
            "messages", f"has {len(messages)} entries; at most {MAX_CHAT_MESSAGES} are allowed"
        )
    messages_bytes = sum(len(m.content.encode()) for m in messages)
    if messages_bytes > limits.max_prompt_bytes:
        yield FieldViolation(
            "messages",
            f"the contents are {messages_bytes} bytes; the limit is {limits.max_prompt_bytes}",
        )
    for index, message in enumerate(messages[:MAX_CHAT_MESSAGES]):
        if message.role not in CHAT_ROLES:
            yield FieldViolation(
                f"messages[{index}].role", f"must be one of {', '.join(CHAT_ROLES)}"
            )
        if NUL in message.content:
            yield FieldViolation(f"messages[{index}].content", NUL_PROBLEM)


def _violations(request: InferenceRequest, limits: RequestLimits) -> Iterator[FieldViolation]:
    if (problem := model_name_problem(request.model)) is not None:
        yield FieldViolation("model", problem)
    yield from _prompt_or_messages_violations(request.prompt, request.messages, limits)
    prompt_bytes = len(request.prompt.encode())
    if request.messages and request.context:
        yield FieldViolation(
            "context", "applies to prompt only; with messages, put passages in a message"
        )
    if len(request.context) > MAX_CONTEXT_ENTRIES:
        yield FieldViolation(
            "context",
            f"has {len(request.context)} entries; at most {MAX_CONTEXT_ENTRIES} are allowed",
        )
    total_bytes = prompt_bytes + sum(len(passage.encode()) for passage in request.context)
    if prompt_bytes <= limits.max_prompt_bytes < total_bytes:
        yield FieldViolation(
            "context",
            f"context plus prompt is {total_bytes} bytes; the limit is {limits.max_prompt_bytes}",
        )
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        yield FieldViolation("request_id", f"must be at most {MAX_REQUEST_ID_CHARS} characters")
    texts = {f"context[{i}]": passage for i, passage in enumerate(request.context)}
    texts.update({f"parameters.stop[{i}]": stop for i, stop in enumerate(request.params.stop)})
    for field, text in texts.items():
        if NUL in text:
            yield FieldViolation(field, NUL_PROBLEM)

    params = request.params
    yield from sampling_violations(params)
    if len(params.stop) > MAX_STOP_SEQUENCES:
        yield FieldViolation(
            "parameters.stop",
            f"has {len(params.stop)} entries; at most {MAX_STOP_SEQUENCES} are allowed",
        )
    for index, stop in enumerate(params.stop):
        if not stop:
            yield FieldViolation(f"parameters.stop[{index}]", "must be a non-empty string")
    yield from tool_violations(request)
    if request.tools and params.logprobs:
        yield FieldViolation("parameters.logprobs", "is not returned with tools")
    if (constraint := params.constraint) is not None:
        if not constraint.text:
            yield FieldViolation(constraint.field, "must be non-empty")
        elif NUL in constraint.text:
            yield FieldViolation(constraint.field, NUL_PROBLEM)
