"""The core's results and stream chunks as OpenAI's JSON: Completions and Chat Completions.

Field for field as OpenAI answers (`id`, `object`, `created`, `model`, `choices[]`,
`usage`, `system_fingerprint`: null). A stream is Server-Sent Events, `data: {json}\\n\\n`
per chunk, ending with `data: [DONE]`; with `stream_options.include_usage` a last chunk
with empty `choices` carries the usage, and every other chunk `"usage": null`. A streamed
chunk is written from a prefix and a suffix made once per stream around the text's JSON
string: the per-token cost of the HTTP door is one string encoding, not a dict's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import Any

from inferwire.core.results import FinishReason, InferenceResult, StreamChunk, TokenLogprob, Usage
from inferwire.http.tools import calls_json, deltas_json

FINISH_REASON = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
}
DONE = b"data: [DONE]\n\n"


# A string as JSON, non-ASCII kept: `json.dumps(text, ensure_ascii=False)` less the
# JSONEncoder it makes on every call for the non-default argument.
_text = encode_basestring


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def chat_logprobs(entries: Iterable[TokenLogprob]) -> dict[str, Any]:
    """OpenAI chat's `logprobs`: each token, its log-probability, bytes and alternatives."""
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": list(entry.token.encode()),
                "top_logprobs": [
                    {"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())}
                    for t in entry.top
                ],
            }
            for entry in entries
        ]
    }


def completion_logprobs(entries: Iterable[TokenLogprob], offset: int) -> dict[str, Any]:
    """Completions' `logprobs`: parallel lists; `offset`: where the first token's text
    starts in the completion (its characters so far)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        tokens.append(entry.token)
        logprobs.append(entry.logprob)
        tops.append({t.token: t.logprob for t in entry.top})
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def response_id(chat: bool, request_id: str) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + request_id


def unary_json(chat: bool, result: InferenceResult, logprobs: bool) -> dict[str, Any]:
    """A whole (non-streamed) answer."""
    choice: dict[str, Any] = {"index": 0}
    entries = result.logprobs if logprobs else None
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
        if result.tool_calls:  # OpenAI's `content: null` beside calls, unless text came first
            choice["message"]["content"] = result.text or None
            choice["message"]["tool_calls"] = calls_json(result.tool_calls)
        choice["logprobs"] = chat_logprobs(entries) if entries is not None else None
    else:
        choice["text"] = result.text
        choice["logprobs"] = completion_logprobs(entries, 0) if entries is not None else None
    choice["finish_reason"] = FINISH_REASON[result.finish_reason]
    return {
        "id": response_id(chat, result.request_id),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": result.model,
        "choices": [choice],
        "usage": usage_json(result.usage),
        "system_fingerprint": None,
    }


class EventStream:
    """One streamed answer's events, each `data: {json}\\n\\n`."""

    def __init__(
        self, chat: bool, request_id: str, model: str, logprobs: bool, include_usage: bool
    ) -> None:
        self._chat, self._logprobs, self._include_usage = chat, logprobs, include_usage
        head = {
            "id": response_id(chat, request_id),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }
        # `{..."choices":[{"index":0,"delta":{"content":` + text + `},...}]}`: the parts
        # around a chunk's text, made once.
        self._head = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
        usage = ',"usage":null' if include_usage else ""
        if chat:
            self._prefix = f'data: {self._head},"choices":[{{"index":0,"delta":{{"content":'
            self._suffix = f'}},"logprobs":null,"finish_reason":null}}]{usage}}}\n\n'
        else:
            self._prefix = f'data: {self._head},"choices":[{{"index":0,"text":'
            self._suffix = f',"logprobs":null,"finish_reason":null}}]{usage}}}\n\n'
        self._usage_null = usage
        self._offset = 0  # the completion's characters so far (completions' text_offset)

    def first(self) -> bytes:
        """What goes before any text: the assistant's role, for chat."""
        if not self._chat:
            return b""
        role = '{"role":"assistant","content":""}'
        return self._event(f'"delta":{role},"logprobs":null,"finish_reason":null')

    def delta(self, chunk: StreamChunk) -> bytes:
        if chunk.tool_calls:
            return self._calls_event(chunk)
        if chunk.logprobs and self._logprobs:
            return self._event(self._choice_with_logprobs(chunk))
        self._offset += len(chunk.text)
        return (self._prefix + _text(chunk.text) + self._suffix).encode()

    def end(self, chunk: StreamChunk) -> bytes:
        """The last chunk's text (if any), its finish reason and, if asked, the usage."""
        events = self.delta(chunk) if chunk.text or chunk.logprobs or chunk.tool_calls else b""
        assert chunk.finish_reason is not None
        reason = json.dumps(FINISH_REASON[chunk.finish_reason])
        empty = '"delta":{}' if self._chat else '"text":""'
        events += self._event(f'{empty},"logprobs":null,"finish_reason":{reason}')
        if self._include_usage and chunk.usage is not None:
            usage = json.dumps(usage_json(chunk.usage))
            events += f'data: {self._head},"choices":[],"usage":{usage}}}\n\n'.encode()
        return events + DONE

    def error(self, body: dict[str, Any]) -> bytes:
        """An error after the first event: one last event, as vLLM sends it."""
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode() + DONE

    def _calls_event(self, chunk: StreamChunk) -> bytes:
        """Text before a call (if any) in its own event, then the call deltas."""
        events = (self._prefix + _text(chunk.text) + self._suffix).encode() if chunk.text else b""
        calls = json.dumps(deltas_json(chunk.tool_calls), ensure_ascii=False)
        delta = f'"delta":{{"tool_calls":{calls}}},"logprobs":null,"finish_reason":null'
        return events + self._event(delta)

    def _choice_with_logprobs(self, chunk: StreamChunk) -> str:
        if self._chat:
            content = f'"delta":{{"content":{_text(chunk.text)}}}'
            logprobs = json.dumps(chat_logprobs(chunk.logprobs), ensure_ascii=False)
        else:
            content = f'"text":{_text(chunk.text)}'
            entries = completion_logprobs(chunk.logprobs, self._offset)
            logprobs = json.dumps(entries, ensure_ascii=False)
        self._offset += len(chunk.text)
        return f'{content},"logprobs":{logprobs},"finish_reason":null'

    def _event(self, choice: str) -> bytes:
        return (
            f'data: {self._head},"choices":[{{"index":0,{choice}}}]{self._usage_null}}}\n\n'
        ).encode()
