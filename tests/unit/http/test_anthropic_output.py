"""Anthropic's `message` and its stream's events (http/anthropic/output.py), each checked
against the `anthropic` SDK's own pydantic types and accumulated by its stream helper's
function; and the errors in Anthropic's shape from the edge's one table
(http/anthropic/errors.py)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent

from inferwire.core.chat import ToolCall, ToolCallDelta
from inferwire.core.errors import (
    FieldViolation,
    InvalidArgumentError,
    MemoryExhaustedError,
    ModelNotReadyError,
    QueueFullError,
    QuotaExceededError,
    UnauthenticatedError,
)
from inferwire.core.results import FinishReason, InferenceResult, StreamChunk, Timing, Usage
from inferwire.edge.errors import BodyTooLargeError, error_reply
from inferwire.http.anthropic.errors import anthropic_answer, error_event
from inferwire.http.anthropic.output import MessageEvents, MessageShape
from inferwire.http.errors import http_answer

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
USAGE = Usage(prompt_tokens=7, completion_tokens=5)
CALL = ToolCall("call_1a2b", "get_weather", '{"city": "Oslo"}')


def result(
    text: str, calls: tuple[ToolCall, ...], finish: FinishReason, matched: str = ""
) -> InferenceResult:
    timing = Timing(0.0, 1.0, 2.0)
    return InferenceResult(
        "r", "demo", "simulator", text, finish, USAGE, timing, (), calls, stop_sequence=matched
    )


def parsed(stream: bytes) -> list[dict[str, Any]]:
    """Each `event:`/`data:` pair, the event's name checked against its data's type."""
    events = []
    for block in stream.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        if event["type"] != "ping":
            EVENTS.validate_python(event)
        events.append(event)
    return events


def accumulated(events: list[dict[str, Any]]) -> Any:
    """The message the anthropic SDK's `messages.stream` helper makes of `events`."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(
                event=EVENTS.validate_python(event), current_snapshot=snapshot, json_bufs=buffers
            )
    return snapshot


def test_a_whole_answer_is_a_text_block_then_its_tool_uses():
    shape = MessageShape("demo", 16)
    message = Message.model_validate(
        shape.unary(result("Let me look.", (CALL,), FinishReason.TOOL_CALLS))
    )
    text, use = message.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.id == "toolu_1a2b" and use.input == {"city": "Oslo"}
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 5)
    assert message.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize(
    ("finish", "stops", "max_tokens", "reason", "sequence"),
    [
        (FinishReason.STOP, (), 16, "end_turn", None),
        (FinishReason.STOP_SEQUENCE, ("END",), 16, "stop_sequence", "END"),
        # The core's matcher says which of several matched.
        (FinishReason.STOP_SEQUENCE, ("\n", "END"), 16, "stop_sequence", "END"),
        (FinishReason.LENGTH, (), 5, "max_tokens", None),
        (FinishReason.LENGTH, (), 16, "model_context_window_exceeded", None),
    ],
)
def test_the_stop_reason_says_why_it_ended(finish, stops, max_tokens, reason, sequence):
    shape = MessageShape("demo", max_tokens)
    matched = "END" if finish is FinishReason.STOP_SEQUENCE else ""
    message = Message.model_validate(shape.unary(result("To be", (), finish, matched)))
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def test_an_empty_answer_is_one_empty_text_block_and_a_cut_call_has_empty_input():
    shape = MessageShape("demo", 16)
    empty = Message.model_validate(shape.unary(result("", (), FinishReason.STOP)))
    assert [(b.type, b.text) for b in empty.content] == [("text", "")]  # type: ignore[union-attr]
    cut = ToolCall("call_2", "get_weather", '{"city": "Os')
    message = Message.model_validate(shape.unary(result("", (cut,), FinishReason.LENGTH)))
    assert [(b.type, b.input) for b in message.content] == [("tool_use", {})]  # type: ignore[union-attr]


def test_a_stream_of_text_then_a_call_accumulates_in_the_sdk_to_the_whole_message():
    events = MessageEvents(MessageShape("demo", 160))
    stream = events.first()
    stream += events.delta(StreamChunk("Let me "))
    stream += events.delta(
        StreamChunk("look. ", tool_calls=(ToolCallDelta(0, CALL.id, CALL.name),))
    )
    stream += events.delta(StreamChunk("", tool_calls=(ToolCallDelta(0, arguments='{"city": '),)))
    end = StreamChunk(
        "", FinishReason.TOOL_CALLS, USAGE, tool_calls=(ToolCallDelta(0, arguments='"Oslo"}'),)
    )
    stream += events.end(end)
    kinds = [event["type"] for event in parsed(stream)]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = accumulated(parsed(stream))
    text, use = message.content
    assert text.text == "Let me look. "
    assert (use.id, use.name, use.input) == ("toolu_1a2b", "get_weather", {"city": "Oslo"})
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 5)


def test_an_empty_stream_is_one_empty_text_block():
    events = MessageEvents(MessageShape("demo", 16))
    end = StreamChunk("", FinishReason.STOP_SEQUENCE, USAGE, stop_sequence="END")
    stream = events.first() + events.end(end)
    message = accumulated(parsed(stream))
    assert [(b.type, b.text) for b in message.content] == [("text", "")]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.parametrize(
    ("error", "status", "kind", "retry_after"),
    [
        (
            InvalidArgumentError([FieldViolation("max_tokens", "Field required")]),
            400,
            "invalid_request_error",
            None,
        ),
        (UnauthenticatedError("no token"), 401, "authentication_error", None),
        (QuotaExceededError("t", "requests_per_minute", "over", 2.5), 429, "rate_limit_error", "3"),
        (QueueFullError("full"), 529, "overloaded_error", None),
        (MemoryExhaustedError("no room", 4.0), 529, "overloaded_error", "4"),
        (ModelNotReadyError("loading"), 503, "overloaded_error", None),
        (BodyTooLargeError("too large"), 413, "request_too_large", None),
        (RuntimeError("secret"), 500, "api_error", None),
    ],
)
def test_errors_are_anthropic_s_body_with_the_edge_s_status(error, status, kind, retry_after):
    answered, body, headers = anthropic_answer(error_reply(error))
    assert (answered, body["type"], body["error"]["type"]) == (status, "error", kind)
    assert headers.get("retry-after") == retry_after
    assert "secret" not in body["error"]["message"]
    if status == 400:
        assert body["error"]["message"] == "max_tokens: Field required"


def test_an_error_after_the_first_event_is_anthropic_s_error_event():
    _, openai_body, _ = http_answer(error_reply(ModelNotReadyError("unloading")))
    event = error_event(openai_body).decode()
    name, data = event.removesuffix("\n\n").split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "unloading"},
    }
