"""The items of a Responses request's `input` as the core's chat messages.

Messages (roles `user`, `system`, `developer` as `system`, `assistant`; content a string
or text parts), `function_call` items (a run of them one assistant message's calls, as
Chat Completions sends them; after an assistant message, that message's) and
`function_call_output` items (role `tool`, answering a call made before it, in this input
or in the conversation it continues). Each message remembers the body field it came
from, so that the core's violations name the item (`input[3].call_id`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.core.errors import FieldViolation
from inferwire.http.bodies import BodyModel
from inferwire.http.requests import validation_error
from inferwire.http.responses_api.store import StoredResponse

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "refusal"}
_ITEM_TYPES = "message, function_call and function_call_output"


class Part(BodyModel):
    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(BodyModel):
    role: str
    content: str | list[Part]


class FunctionCallItem(BodyModel):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BodyModel):
    call_id: str
    output: str | list[Part]


class Conversation:
    """Chat messages made of items, with the body field each came from."""

    def __init__(self, previous: StoredResponse | None) -> None:
        self.messages: list[ChatMessage] = []
        self.sources: dict[str, str] = {}
        self.violations: list[FieldViolation] = []
        self._call_ids = previous.call_ids() if previous else set()

    def add(self, message: ChatMessage, source: str) -> None:
        index = len(self.messages)
        self.messages.append(message)
        self.sources[f"messages[{index}]"] = source
        for call_index in range(len(message.tool_calls)):
            self.sources[f"messages[{index}].tool_calls[{call_index}]"] = source

    def add_input(self, given: str | list[Any]) -> None:
        if isinstance(given, str):
            self.add(ChatMessage("user", given), "input")
            return
        for index, item in enumerate(given):
            where = f"input[{index}]"
            if not isinstance(item, dict):
                self.violations.append(FieldViolation(where, "must be an object (an item)"))
                continue
            kind = item.get("type", "message")
            try:
                if kind == "message":
                    self._message(MessageItem.model_validate(item), where)
                elif kind == "function_call":
                    self._call(FunctionCallItem.model_validate(item), where)
                elif kind == "function_call_output":
                    self._output(FunctionCallOutputItem.model_validate(item), where)
                else:
                    self.violations.append(
                        FieldViolation(
                            f"{where}.type",
                            f"{str(kind)[:64]!r} items are not supported; inferwire takes "
                            f"{_ITEM_TYPES} items",
                        )
                    )
            except ValidationError as exc:
                self.violations.extend(validation_error(exc, where).violations)

    def _message(self, item: MessageItem, where: str) -> None:
        role = _ROLES.get(item.role)
        if role is None:
            roles = ", ".join(_ROLES)
            self.violations.append(FieldViolation(f"{where}.role", f"must be one of {roles}"))
            return
        self.add(ChatMessage(role, self._text(item.content, f"{where}.content")), where)

    def _call(self, item: FunctionCallItem, where: str) -> None:
        call = ToolCall(item.call_id, item.name, item.arguments)
        self._call_ids.add(item.call_id)
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            self.add(ChatMessage("assistant", "", (call,)), where)
            return
        # The calls of one turn: one assistant message's, as Chat Completions sends them.
        index = len(self.messages) - 1
        self.messages[index] = ChatMessage(last.role, last.content, (*last.tool_calls, call))
        self.sources[f"messages[{index}].tool_calls[{len(last.tool_calls)}]"] = where

    def _output(self, item: FunctionCallOutputItem, where: str) -> None:
        if item.call_id not in self._call_ids:
            self.violations.append(
                FieldViolation(
                    f"{where}.call_id",
                    "matches no function_call before it (in this input, or in the "
                    "conversation of previous_response_id)",
                )
            )
            return
        text = self._text(item.output, f"{where}.output")
        self.add(ChatMessage("tool", text, tool_call_id=item.call_id), where)

    def _text(self, content: str | list[Part], where: str) -> str:
        if isinstance(content, str):
            return content
        texts = []
        for index, part in enumerate(content):
            text = part.refusal if part.type == "refusal" else part.text
            if part.type not in _TEXT_PARTS or text is None:
                self.violations.append(
                    FieldViolation(
                        f"{where}[{index}].type",
                        f"is {part.type[:64]!r}; only text parts are supported "
                        f"({', '.join(sorted(_TEXT_PARTS))})",
                    )
                )
                continue
            texts.append(text)
        return "\n".join(texts)
