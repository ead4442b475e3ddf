"""The `response` object and its stream's events (http/responses_api/output.py), each checked
against the `openai` SDK's own pydantic types (validated, not merely constructed), and
the events in the order its `responses.stream` helper accumulates."""

from __future__ import annotations

import json
from typing import Any

import pydantic
from openai.types.responses import Response, ResponseStreamEvent

from inferwire.core.chat import ChatMessage, ToolCall, ToolCallDelta
from inferwire.core.results import FinishReason, InferenceResult, StreamChunk, Timing, Usage
from inferwire.http.responses_api.output import ResponseEvents, ResponseShape

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
ECHO = {"instructions": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
USAGE = Usage(prompt_tokens=7, completion_tokens=5)
CALL = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')


def result(text: str, calls: tuple[ToolCall, ...], finish: FinishReason) -> InferenceResult:
    timing = Timing(0.0, 1.0, 2.0)
    return InferenceResult("r", "demo", "simulator", text, finish, USAGE, timing, (), calls)


def parsed(stream: bytes) -> list[dict[str, Any]]:
    """Each `event:`/`data:` pair, the event's name checked against its data's type."""
    events = []
    for block in stream.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    return events


def test_a_whole_answer_is_a_message_then_its_calls():
    shape = ResponseShape("demo", ECHO)
    response, turn = shape.unary(result("Let me look.", (CALL,), FinishReason.TOOL_CALLS))
    Response.model_validate(response)
    message, call = response["output"]
    assert message["content"][0]["text"] == "Let me look." and message["status"] == "completed"
    assert (call["call_id"], call["name"], call["arguments"]) == (
        CALL.id,
        CALL.name,
        CALL.arguments,
    )
    assert call["id"].startswith("fc_") and response["id"].startswith("resp_")
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["usage"]["input_tokens"] == 7 and response["usage"]["total_tokens"] == 12
    assert turn == ChatMessage("assistant", "Let me look.", (CALL,))


def test_an_answer_cut_by_max_tokens_is_incomplete():
    response, _ = ResponseShape("demo", ECHO).unary(result("To be", (), FinishReason.LENGTH))
    Response.model_validate(response)
    assert response["status"] == "incomplete" and response["output"][0]["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    empty, _ = ResponseShape("demo", ECHO).unary(result("", (), FinishReason.STOP))
    assert [item["content"][0]["text"] for item in empty["output"]] == [""]


def test_a_stream_of_text_then_a_call_in_the_sdk_s_order():
    kept: list[tuple[dict[str, Any], ChatMessage]] = []
    events = ResponseEvents(ResponseShape("demo", ECHO), lambda r, t: kept.append((r, t)))
    stream = events.first()
    stream += events.delta(StreamChunk("Let me "))
    stream += events.delta(
        StreamChunk("look. ", tool_calls=(ToolCallDelta(0, CALL.id, CALL.name),))
    )
    stream += events.delta(StreamChunk("", tool_calls=(ToolCallDelta(0, arguments='{"city": '),)))
    end = StreamChunk(
        "",
        FinishReason.TOOL_CALLS,
        USAGE,
        tool_calls=(ToolCallDelta(0, arguments='"Oslo"}'),),
    )
    stream += events.end(end)
    sent = parsed(stream)
    assert [e["type"] for e in sent] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert sent[0]["response"]["status"] == "in_progress" and sent[0]["response"]["output"] == []
    assert [e["output_index"] for e in sent if "output_index" in e] == [0] * 7 + [1] * 5
    final = sent[-1]["response"]
    Response.model_validate(final)
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me look. "
    assert call["arguments"] == CALL.arguments and call["status"] == "completed"
    assert sent[12]["arguments"] == CALL.arguments
    [(response, turn)] = kept
    assert response == final and turn == ChatMessage("assistant", "Let me look. ", (CALL,))


def test_a_stream_cut_by_max_tokens_ends_incomplete():
    events = ResponseEvents(ResponseShape("demo", ECHO), lambda r, t: None)
    stream = events.first() + events.end(StreamChunk("To be", FinishReason.LENGTH, USAGE))
    sent = parsed(stream)
    assert sent[-1]["type"] == "response.incomplete"
    assert sent[-2]["item"]["status"] == "incomplete"
    assert sent[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_error_after_the_first_event_is_an_error_event_then_response_failed():
    kept: list[Any] = []
    events = ResponseEvents(ResponseShape("demo", ECHO), lambda r, t: kept.append(r))
    stream = events.first() + events.delta(StreamChunk("To"))
    body = {
        "error": {
            "message": "deadline",
            "type": "timeout_error",
            "param": None,
            "code": "deadline_exceeded",
        }
    }
    sent = parsed(stream + events.error(body))
    error, failed = sent[-2:]
    assert (error["type"], error["code"], error["message"]) == (
        "error",
        "deadline_exceeded",
        "deadline",
    )
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "deadline"}
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert kept == []  # a failed response is not stored
