"""The `system` and `messages` of an Anthropic request as the core's chat messages.

`system` (a string or text blocks) is a system message first; a message of role `system`
among `messages` (Claude Code sends its environment so) is a system message in its place,
of text blocks only. A `user` or `assistant` message's content is a string or blocks:
`text` blocks are joined by newlines; an assistant's `tool_use` blocks are its calls
(`input` as the arguments' JSON text); each `tool_result` block of a user message is a
message of role `tool` answering its `tool_use_id` (its content a string or text blocks;
`is_error` puts `Error: ` before it, since chat templates have no flag for it), in the
order the blocks come, the user's text after them (Anthropic puts results first).
`thinking` and `redacted_thinking` blocks (a reasoning model's turns replayed) are
dropped: no inferwire model reasons. Images, documents and every other block are refused
naming the block. `cache_control` and `citations` on a block are taken and ignored. Each
message remembers the body field it came from, so that the core's violations name the
block (`messages[3].content[0].tool_use_id`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.core.errors import FieldViolation
from inferwire.http.bodies import BodyModel
from inferwire.http.requests import validation_error

_ROLES = ("user", "assistant", "system")
_DROPPED = {"thinking", "redacted_thinking"}
_TAKEN = "text, tool_use (assistant) and tool_result (user) blocks"


class TextBlock(BodyModel):
    type: str
    text: str


class ToolUseBlock(BodyModel):
    type: str
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(BodyModel):
    type: str
    tool_use_id: str
    content: str | list[Any] | None = None
    is_error: bool | None = None


class MessageParam(BodyModel):
    role: str
    content: str | list[Any]


class Conversation:
    """Chat messages made of a request's `system` and `messages`, with the body field each
    came from, and the violations found on the way."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.sources: dict[str, str] = {}
        self.violations: list[FieldViolation] = []

    def add(self, message: ChatMessage, source: str, call_sources: tuple[str, ...] = ()) -> None:
        index = len(self.messages)
        self.messages.append(message)
        self.sources[f"messages[{index}]"] = source
        for call_index, call_source in enumerate(call_sources):
            self.sources[f"messages[{index}].tool_calls[{call_index}]"] = call_source

    def add_system(self, system: str | list[Any] | None) -> None:
        if system is None:
            return
        text = system if isinstance(system, str) else self._texts(system, "system")
        self.add(ChatMessage("system", text), "system")

    def add_messages(self, messages: list[Any]) -> None:
        for index, raw in enumerate(messages):
            where = f"messages[{index}]"
            try:
                message = MessageParam.model_validate(raw)
            except ValidationError as exc:
                self.violations.extend(validation_error(exc, where).violations)
                continue
            if message.role not in _ROLES:
                self._refuse(f"{where}.role", "must be user, assistant or system")
            elif isinstance(message.content, str):
                self.add(ChatMessage(message.role, message.content), where)
            elif message.role == "system":
                text = self._texts(message.content, f"{where}.content")
                self.add(ChatMessage("system", text), where)
            elif message.role == "user":
                self._user(message.content, where)
            else:
                self._assistant(message.content, where)

    def _user(self, blocks: list[Any], where: str) -> None:
        texts: list[str] = []
        for index, block in enumerate(blocks):
            at = f"{where}.content[{index}]"
            kind = _kind(block)
            if kind == "text":
                texts.extend(self._text(block, at))
            elif kind == "tool_result":
                if texts:  # text before a result: a turn of its own, in its place
                    self.add(ChatMessage("user", "\n".join(texts)), where)
                    texts = []
                self._result(block, at)
            elif kind not in _DROPPED:
                self._unsupported(kind, block, at, "user")
        if texts or not any(_kind(block) == "tool_result" for block in blocks):
            self.add(ChatMessage("user", "\n".join(texts)), where)

    def _assistant(self, blocks: list[Any], where: str) -> None:
        texts: list[str] = []
        calls: list[ToolCall] = []
        call_sources: list[str] = []
        for index, block in enumerate(blocks):
            at = f"{where}.content[{index}]"
            kind = _kind(block)
            if kind == "text":
                texts.extend(self._text(block, at))
            elif kind == "tool_use":
                try:
                    use = ToolUseBlock.model_validate(block)
                except ValidationError as exc:
                    self.violations.extend(validation_error(exc, at).violations)
                    continue
                calls.append(ToolCall(use.id, use.name, json.dumps(use.input)))
                call_sources.append(at)
            elif kind not in _DROPPED:
                self._unsupported(kind, block, at, "assistant")
        if texts or calls:  # a turn of thinking alone is dropped with it
            message = ChatMessage("assistant", "\n".join(texts), tuple(calls))
            self.add(message, where, tuple(call_sources))

    def _result(self, block: Any, at: str) -> None:
        try:
            result = ToolResultBlock.model_validate(block)
        except ValidationError as exc:
            self.violations.extend(validation_error(exc, at).violations)
            return
        content = result.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = self._texts(content, f"{at}.content")
        if result.is_error:
            text = f"Error: {text}"
        self.add(ChatMessage("tool", text, tool_call_id=result.tool_use_id), at)

    def _texts(self, blocks: list[Any], where: str) -> str:
        """Text blocks (a system prompt's, a tool result's), joined by newlines."""
        texts: list[str] = []
        for index, block in enumerate(blocks):
            at = f"{where}[{index}]"
            kind = _kind(block)
            if kind == "text":
                texts.extend(self._text(block, at))
            else:
                self._refuse(f"{at}.type", f"is {kind[:64]!r}; only text blocks are taken here")
        return "\n".join(texts)

    def _text(self, block: Any, at: str) -> list[str]:
        try:
            return [TextBlock.model_validate(block).text]
        except ValidationError as exc:
            self.violations.extend(validation_error(exc, at).violations)
            return []

    def _unsupported(self, kind: str, block: Any, at: str, role: str) -> None:
        if not isinstance(block, dict):
            self._refuse(at, "must be an object (a content block)")
        elif kind in ("image", "document"):
            self._refuse(
                f"{at}.type",
                f"{kind} blocks are not supported: inferwire's models read text; send {_TAKEN}",
            )
        elif kind in ("tool_use", "tool_result"):
            self._refuse(f"{at}.type", f"a {role} message has no {kind} blocks; send {_TAKEN}")
        else:
            self._refuse(f"{at}.type", f"is {kind[:64]!r}; inferwire takes {_TAKEN}")

    def _refuse(self, field: str, why: str) -> None:
        self.violations.append(FieldViolation(field, why))


def _kind(block: Any) -> str:
    """A block's `type` (a string, or what it is instead)."""
    if not isinstance(block, dict):
        return type(block).__name__
    kind = block.get("type")
    return kind if isinstance(kind, str) else str(kind)
