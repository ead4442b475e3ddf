"""The core's results and stream chunks as Anthropic's Messages: the `message` object and
its Server-Sent Events.

A message's `content` is a `text` block (the answer's text), then a `tool_use` block per
call (`id` `toolu_…`, made of the core's call id, so a conversation sent back names the
same calls; `input` the arguments as an object); an answer with neither is one empty text
block. `stop_reason`: `end_turn` for the end of sequence, `stop_sequence` for a stop
string (`stop_sequence` says which: the core's stop matcher reports it), `tool_use` after
calls, `max_tokens` when `max_tokens` cut it and
`model_context_window_exceeded` when the context window did first. `usage` has
`input_tokens` and `output_tokens`; the cache counts are 0 (the engines' prefix reuse is
not counted per request).

A stream is `event: <type>` and `data: <json>` per event, in the order the anthropic
SDK's `messages.stream` helper accumulates: `message_start` (the message, empty, its
usage 0: the prompt's count comes with the end), `ping`, then per block
`content_block_start`, `content_block_delta`… (`text_delta`, `input_json_delta`),
`content_block_stop`; last `message_delta` (the stop reason and the whole usage) and
`message_stop`. An error after the first event is an `error` event (anthropic/errors.py).
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring
from typing import Any

from inferwire.core.chat import ToolCall, ToolCallDelta
from inferwire.core.results import FinishReason, InferenceResult, StreamChunk, Usage

_text = encode_basestring  # a string as JSON, non-ASCII kept (as completion_output.py)
_STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.LENGTH: "max_tokens",
}


def tool_use_id(call_id: str) -> str:
    """Anthropic's id of a call: `toolu_` and the core's id (`call_…`) after its prefix."""
    return "toolu_" + call_id.removeprefix("call_")


def usage_json(usage: Usage | None) -> dict[str, int]:
    prompt, completion = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def call_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as `input`, an object; a call cut short by max_tokens (its JSON
    incomplete) has `{}`."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageShape:
    """What every rendering of one message shares: its id, model, and what its stop
    reason is read against (the request's max_tokens)."""

    def __init__(self, model: str, max_tokens: int) -> None:
        self.id, self.model, self._max_tokens = "msg_" + uuid.uuid4().hex, model, max_tokens

    def stop(
        self, finish: FinishReason | None, usage: Usage | None, matched: str = ""
    ) -> dict[str, Any]:
        """`stop_reason` and `stop_sequence` of an answer that ended with `finish` (`matched`:
        the stop string the core found)."""
        reason = _STOP_REASONS.get(finish) if finish is not None else None
        if (
            reason == "max_tokens"
            and usage is not None
            and usage.completion_tokens < self._max_tokens
        ):
            reason = "model_context_window_exceeded"
        sequence = matched or None if finish is FinishReason.STOP_SEQUENCE else None
        return {"stop_reason": reason, "stop_sequence": sequence}

    def message(
        self,
        content: list[dict[str, Any]],
        finish: FinishReason | None,
        usage: Usage | None,
        matched: str = "",
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            **self.stop(finish, usage, matched),
            "usage": usage_json(usage),
        }

    def unary(self, result: InferenceResult) -> dict[str, Any]:
        """A whole answer's message."""
        content: list[dict[str, Any]] = []
        if result.text or not result.tool_calls:
            content.append({"type": "text", "text": result.text})
        content.extend(_tool_use(call) for call in result.tool_calls)
        return self.message(content, result.finish_reason, result.usage, result.stop_sequence)


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": tool_use_id(call.id),
        "name": call.name,
        "input": call_input(call.arguments),
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    text = json.dumps({"type": kind, **data}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {text}\n\n".encode()


class MessageEvents:
    """One streamed message's events."""

    def __init__(self, shape: MessageShape) -> None:
        self._shape = shape
        self._blocks = 0  # blocks opened so far; the open one is the last
        self._open: str | None = None  # the open block's type
        self._delta_head = b""  # a text_delta event before its text

    def first(self) -> bytes:
        """`message_start` and a `ping`."""
        message = self._shape.message([], None, None)
        return _event("message_start", {"message": message}) + _event("ping", {})

    def delta(self, chunk: StreamChunk) -> bytes:
        events = self._text(chunk.text) if chunk.text else b""
        for call in chunk.tool_calls:
            events += self._call(call)
        return events

    def end(self, chunk: StreamChunk) -> bytes:
        """The last chunk's text and calls, the open block closed, and the stop."""
        events = self.delta(chunk)
        if not self._blocks:  # an empty answer is one empty text block
            events += self._start({"type": "text", "text": ""})
        events += self._close()
        stop = self._shape.stop(chunk.finish_reason, chunk.usage, chunk.stop_sequence)
        events += _event("message_delta", {"delta": stop, "usage": usage_json(chunk.usage)})
        return events + _event("message_stop", {})

    def _text(self, text: str) -> bytes:
        events = b""
        if self._open != "text":
            events += self._close() + self._start({"type": "text", "text": ""})
            head = _event("content_block_delta", {"index": self._blocks - 1, "delta": {}})
            # `...,"delta":{}}\n\n` less its tail: the text goes where the braces close.
            head = head[: -len(b"}}\n\n")] + b'"type":"text_delta","text":'
            self._delta_head = head
        # Written around the text's JSON string: the per-token cost is one encoding.
        return events + self._delta_head + _text(text).encode() + b"}}\n\n"

    def _call(self, delta: ToolCallDelta) -> bytes:
        events = b""
        if delta.id:  # a call's first delta: its block opens
            events += self._close()
            block = {
                "type": "tool_use",
                "id": tool_use_id(delta.id),
                "name": delta.name,
                "input": {},
            }
            events += self._start(block)
        if delta.arguments and self._open == "tool_use":
            json_delta = {"type": "input_json_delta", "partial_json": delta.arguments}
            events += _event(
                "content_block_delta", {"index": self._blocks - 1, "delta": json_delta}
            )
        return events

    def _start(self, block: dict[str, Any]) -> bytes:
        self._blocks += 1
        self._open = block["type"]
        return _event("content_block_start", {"index": self._blocks - 1, "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"index": self._blocks - 1})
