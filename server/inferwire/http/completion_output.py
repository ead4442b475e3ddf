"""The core's results and stream chunks as OpenAI's JSON: Completions and Chat Completions.

Field for field as OpenAI answers (`id`, `object`, `created`, `model`, `choices[]`,
`usage`, `system_fingerprint`: null). A stream is Server-Sent Events, `data: {json}\\n\\n`
per chunk, ending with `data: [DONE]`; with `stream_options.include_usage` a last chunk
with empty `choices` carries the usage, and every other chunk `"usage": null`. A streamed
chunk is written from a prefix and a suffix made once per stream around the text's JSON
string: the per-token cost of the HTTP door is one string encoding, not a dict's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import Any

from inferwire.core.results import (
    Choice,
    FinishReason,
    InferenceResult,
    StreamChunk,
    TokenLogprob,
    Usage,
)
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
    """A whole (non-streamed) answer: its one choice, or its n."""
    choices = result.choices or (
        Choice(0, result.text, result.finish_reason, result.logprobs, result.tool_calls),
    )
    return {
        "id": response_id(chat, result.request_id),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": result.model,
        "choices": [_choice_json(chat, choice, logprobs) for choice in choices],
        "usage": usage_json(result.usage),
        "system_fingerprint": None,
    }


def _choice_json(chat: bool, choice: Choice, logprobs: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"index": choice.index}
    entries = choice.logprobs if logprobs else None
    if chat:
        answer["message"] = {"role": "assistant", "content": choice.text}
        if choice.tool_calls:  # OpenAI's `content: null` beside calls, unless text came first
            answer["message"]["content"] = choice.text or None
            answer["message"]["tool_calls"] = calls_json(choice.tool_calls)
        answer["logprobs"] = chat_logprobs(entries) if entries is not None else None
    else:
        answer["text"] = choice.text
        answer["logprobs"] = completion_logprobs(entries, 0) if entries is not None else None
    answer["finish_reason"] = FINISH_REASON[choice.finish_reason]
    return answer


class EventStream:
    """One streamed answer's events, each `data: {json}\\n\\n`; with n choices, each
    event names its choice's index, and each choice ends with its own finish reason."""

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
        self._head = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
        self._usage_null = ',"usage":null' if include_usage else ""
        # Per choice: the parts around a chunk's text, made once (see the module).
        self._text_parts: dict[int, tuple[str, str]] = {}
        self._offsets: dict[int, int] = {}  # each choice's characters so far (text_offset)

    def first(self) -> bytes:
        """What goes before any text: the assistant's role, for chat."""
        if not self._chat:
            return b""
        role = '{"role":"assistant","content":""}'
        return self._event(f'"delta":{role},"logprobs":null,"finish_reason":null')

    def delta(self, chunk: StreamChunk) -> bytes:
        if chunk.finish_reason is not None:  # one of n choices ended; others go on
            return self._choice_end(chunk)
        if chunk.tool_calls:
            return self._calls_event(chunk)
        if chunk.logprobs and self._logprobs:
            return self._event(self._choice_with_logprobs(chunk), chunk.choice)
        return self._text_event(chunk)

    def end(self, chunk: StreamChunk) -> bytes:
        """The last chunk's text (if any), its finish reason and, if asked, the usage."""
        events = self._choice_end(chunk)
        if self._include_usage and chunk.usage is not None:
            usage = json.dumps(usage_json(chunk.usage))
            events += f'data: {self._head},"choices":[],"usage":{usage}}}\n\n'.encode()
        return events + DONE

    def error(self, body: dict[str, Any]) -> bytes:
        """An error after the first event: one last event, as vLLM sends it."""
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode() + DONE

    def _choice_end(self, chunk: StreamChunk) -> bytes:
        """A choice's last text (if any), then its finish reason."""
        ending = dataclasses.replace(chunk, finish_reason=None)
        events = self.delta(ending) if chunk.text or chunk.logprobs or chunk.tool_calls else b""
        assert chunk.finish_reason is not None
        reason = json.dumps(FINISH_REASON[chunk.finish_reason])
        empty = '"delta":{}' if self._chat else '"text":""'
        return events + self._event(
            f'{empty},"logprobs":null,"finish_reason":{reason}', chunk.choice
        )

    def _text_event(self, chunk: StreamChunk) -> bytes:
        parts = self._text_parts.get(chunk.choice)
        if parts is None:
            parts = self._text_parts[chunk.choice] = self._parts(chunk.choice)
        self._offsets[chunk.choice] = self._offsets.get(chunk.choice, 0) + len(chunk.text)
        return (parts[0] + _text(chunk.text) + parts[1]).encode()

    def _parts(self, index: int) -> tuple[str, str]:
        """`{..."choices":[{"index":i,"delta":{"content":` + text + `},...}]}`."""
        usage = self._usage_null
        if self._chat:
            prefix = f'data: {self._head},"choices":[{{"index":{index},"delta":{{"content":'
            return prefix, f'}},"logprobs":null,"finish_reason":null}}]{usage}}}\n\n'
        prefix = f'data: {self._head},"choices":[{{"index":{index},"text":'
        return prefix, f',"logprobs":null,"finish_reason":null}}]{usage}}}\n\n'

    def _calls_event(self, chunk: StreamChunk) -> bytes:
        """Text before a call (if any) in its own event, then the call deltas."""
        events = self._text_event(chunk) if chunk.text else b""
        calls = json.dumps(deltas_json(chunk.tool_calls), ensure_ascii=False)
        delta = f'"delta":{{"tool_calls":{calls}}},"logprobs":null,"finish_reason":null'
        return events + self._event(delta, chunk.choice)

    def _choice_with_logprobs(self, chunk: StreamChunk) -> str:
        offset = self._offsets.get(chunk.choice, 0)
        if self._chat:
            content = f'"delta":{{"content":{_text(chunk.text)}}}'
            logprobs = json.dumps(chat_logprobs(chunk.logprobs), ensure_ascii=False)
        else:
            content = f'"text":{_text(chunk.text)}'
            entries = completion_logprobs(chunk.logprobs, offset)
            logprobs = json.dumps(entries, ensure_ascii=False)
        self._offsets[chunk.choice] = offset + len(chunk.text)
        return f'{content},"logprobs":{logprobs},"finish_reason":null'

    def _event(self, choice: str, index: int = 0) -> bytes:
        return (
            f'data: {self._head},"choices":[{{"index":{index},{choice}}}]{self._usage_null}}}\n\n'
        ).encode()
