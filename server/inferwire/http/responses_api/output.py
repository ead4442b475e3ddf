"""The core's results and stream chunks as OpenAI's Responses: the `response` object and
its Server-Sent Events.

An answer's `output` is a `message` item holding one `output_text` part (its text), then
a `function_call` item per call (`call_id` the core's `call_…` id); an answer with
neither is one message with empty text. `max_output_tokens` (or the context window)
cutting it makes the response `incomplete` (`incomplete_details.reason:
max_output_tokens`) and its last item `incomplete`. A stream is `event: <type>` and
`data: <json>` per event, each with `sequence_number` from 0, in the order the `openai`
SDK's `responses.stream` helper accumulates: `response.created` (the whole response,
`in_progress`), `response.in_progress`, then per item `response.output_item.added`,
for a message `response.content_part.added`, `response.output_text.delta`…,
`response.output_text.done`, `response.content_part.done`, for a call
`response.function_call_arguments.delta`… and `.done`, then
`response.output_item.done`; last `response.completed` (or `response.incomplete`) with
the whole response. An error after the first event is an `error` event, then
`response.failed` with the error in the response. There is no `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from inferwire.core.chat import ChatMessage, ToolCall, ToolCallDelta
from inferwire.core.results import FinishReason, InferenceResult, StreamChunk, Usage

_text = encode_basestring  # a string as JSON, non-ASCII kept (as completion_output.py)


def new_id(prefix: str) -> str:
    """A fresh id: `resp_`, `msg_`, `fc_` and 32 hex digits."""
    return prefix + uuid.uuid4().hex


def response_usage_json(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


class ResponseShape:
    """What every rendering of one response shares: its id, when it was made, its model
    and the request's fields it echoes (`echo`)."""

    def __init__(self, model: str, echo: dict[str, Any]) -> None:
        self.id, self.created_at = new_id("resp_"), int(time.time())
        self.model, self._echo = model, echo

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The `response` object in `status`."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "model": self.model,
            "output": output,
            "usage": response_usage_json(usage),
            **self._echo,
        }

    def unary(self, result: InferenceResult) -> tuple[dict[str, Any], ChatMessage]:
        """A whole answer's response object, and the answer as the conversation's turn."""
        cut = result.finish_reason is FinishReason.LENGTH
        output = []
        if result.text or not result.tool_calls:
            last = not result.tool_calls
            status = "incomplete" if cut and last else "completed"
            output.append(message_item(new_id("msg_"), result.text, status))
        for index, call in enumerate(result.tool_calls):
            last = index == len(result.tool_calls) - 1
            status = "incomplete" if cut and last else "completed"
            output.append(call_item(new_id("fc_"), call, status))
        status = "incomplete" if cut else "completed"
        turn = ChatMessage("assistant", result.text, result.tool_calls)
        return self.object(status, output, result.usage), turn


def _event(kind: str, sequence_number: int, fields: dict[str, Any]) -> bytes:
    data = {"type": kind, **fields, "sequence_number": sequence_number}
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {text}\n\n".encode()


class ResponseEvents:
    """One streamed response's events; `done` is called with the whole response object
    and the answer's turn before the last event goes out (the route stores it there)."""

    def __init__(
        self, shape: ResponseShape, done: Callable[[dict[str, Any], ChatMessage], object]
    ) -> None:
        self._shape, self._done = shape, done
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # every item so far, the open one last
        self._open: dict[str, Any] | None = None
        self._text = ""  # the answer's text (every message's)
        self._calls: list[ToolCall] = []
        self._delta_head = ""  # an output_text.delta event's JSON before its text

    def _emit(self, kind: str, **fields: Any) -> bytes:
        event = _event(kind, self._sequence, fields)
        self._sequence += 1
        return event

    def first(self) -> bytes:
        """`response.created` and `response.in_progress`."""
        response = self._shape.object("in_progress", [])
        return self._emit("response.created", response=response) + self._emit(
            "response.in_progress", response=response
        )

    def delta(self, chunk: StreamChunk) -> bytes:
        events = self._text_events(chunk.text) if chunk.text else b""
        for call in chunk.tool_calls:
            events += self._call_events(call)
        return events

    def end(self, chunk: StreamChunk) -> bytes:
        """The last chunk's text and calls, every item closed, and the response."""
        events = self.delta(chunk)
        if not self._items:  # an empty answer is one message with empty text
            events += self._open_message()
        cut = chunk.finish_reason is FinishReason.LENGTH
        events += self._close("incomplete" if cut else "completed")
        status = "incomplete" if cut else "completed"
        response = self._shape.object(status, self._items, chunk.usage)
        self._done(response, ChatMessage("assistant", self._text, tuple(self._calls)))
        return events + self._emit(f"response.{status}", response=response)

    def error(self, body: dict[str, Any]) -> bytes:
        """An error after the first event: an `error` event, then `response.failed`."""
        error = body["error"]
        events = self._emit(
            "error", code=error["code"], message=error["message"], param=error["param"]
        )
        code = "rate_limit_exceeded" if error["code"] == "resource_exhausted" else "server_error"
        failed = {"code": code, "message": error["message"]}
        response = self._shape.object("failed", self._items, error=failed)
        return events + self._emit("response.failed", response=response)

    def _text_events(self, text: str) -> bytes:
        events = b""
        if self._open is None or self._open["type"] != "message":
            events += self._close("completed") + self._open_message()
        assert self._open is not None
        self._open["content"][0]["text"] += text
        self._text += text
        # Written around the text's JSON string: the per-token cost is one encoding.
        tail = f',"logprobs":[],"sequence_number":{self._sequence}}}\n\n'
        self._sequence += 1
        return events + (self._delta_head + _text(text) + tail).encode()

    def _open_message(self) -> bytes:
        item = message_item(new_id("msg_"), "", "in_progress")
        part = item["content"][0]
        item["content"] = []
        events = self._add(item)
        index = len(self._items) - 1
        added = self._emit(
            "response.content_part.added",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )
        item["content"] = [dict(part)]
        head = {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": index,
            "content_index": 0,
        }
        self._delta_head = (
            "event: response.output_text.delta\ndata: "
            + json.dumps(head, separators=(",", ":"))[:-1]
            + ',"delta":'
        )
        return events + added

    def _call_events(self, delta: ToolCallDelta) -> bytes:
        events = b""
        if delta.id:  # a call's first delta: its item opens
            events += self._close("completed")
            call = ToolCall(delta.id, delta.name, "")
            events += self._add(call_item(new_id("fc_"), call, "in_progress"))
            self._calls.append(call)
        if delta.arguments and self._open is not None and self._open["type"] == "function_call":
            self._open["arguments"] += delta.arguments
            last = self._calls[-1]
            self._calls[-1] = ToolCall(last.id, last.name, last.arguments + delta.arguments)
            events += self._emit(
                "response.function_call_arguments.delta",
                item_id=self._open["id"],
                output_index=len(self._items) - 1,
                delta=delta.arguments,
            )
        return events

    def _add(self, item: dict[str, Any]) -> bytes:
        self._items.append(item)
        self._open = item
        return self._emit(
            "response.output_item.added", output_index=len(self._items) - 1, item=item
        )

    def _close(self, status: str) -> bytes:
        """Close the open item (if any) in `status`."""
        item, self._open = self._open, None
        if item is None:
            return b""
        index, events = len(self._items) - 1, b""
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += self._emit("response.output_text.done", **ids, text=part["text"], logprobs=[])
            events += self._emit("response.content_part.done", **ids, part=part)
        else:
            events += self._emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        item["status"] = status
        return events + self._emit("response.output_item.done", output_index=index, item=item)
