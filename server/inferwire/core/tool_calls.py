"""Tool calls read out of a model's output, as it streams.

The parser follows the grammar of core/tools.py: text until `<tool_call>`, then a JSON
object whose `name` comes first and whose `arguments` is an object, then `</tool_call>`.
Under the grammar (a constrained backend) a call's first delta says its name as soon as
the name is complete and later deltas carry the argument text as it comes; the JSON is
scanned string by string, so `</tool_call>` inside a string argument is just text.
Without the grammar (a backend that cannot constrain) everything from the first
`<tool_call>` is held to the end, then every call is parsed and validated against its
tool's schema: all valid, they are the calls; else the held text is the answer's text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import jsonschema

from inferwire.core.tools import CALL_CLOSE, CALL_OPEN, parameters_schema
from inferwire.core.types import FinishReason, Tool, ToolCall, ToolCallDelta

# A call's opening up to its arguments' value, in the order the grammar writes it.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*" + re.escape(CALL_CLOSE))
_TEXT, _HEAD_STATE, _ARGS, _TAIL_STATE = range(4)


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ToolCallParser:
    """Splits output text into answer text and tool-call deltas, one piece at a time."""

    def __init__(self, tools: Sequence[Tool], constrained: bool) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._constrained = constrained
        self._state = _TEXT
        self._pending = ""  # text not yet decided
        self._held = ""  # unconstrained: everything from the first call's opening
        self._calls: list[_Call] = []
        self._complete = 0  # calls whose closing tag came
        self._depth = 0
        self._in_string = self._escaped = False

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The calls so far; the last one's arguments are incomplete if it was cut."""
        return tuple(ToolCall(c.id, c.name, "".join(c.arguments)) for c in self._calls)

    def finish_reason(self, reason: FinishReason) -> FinishReason:
        """The answer's finish reason: TOOL_CALLS when it ended after complete calls."""
        whole = self._calls and self._complete == len(self._calls)
        if whole and reason in (FinishReason.STOP, FinishReason.STOP_SEQUENCE):
            return FinishReason.TOOL_CALLS
        return reason

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """The answer text and call deltas that `text` decides."""
        if self._held:
            self._held += text
            return "", []
        self._pending += text
        out: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(out, deltas):
            pass
        return "".join(out), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """What is left at the end of the output."""
        if self._held:
            return self._finish_held()
        text, self._pending = self._pending, ""
        if self._state in (_TEXT, _HEAD_STATE):  # a call cut before its name: text
            return (CALL_OPEN if self._state == _HEAD_STATE else "") + text, []
        return "", []

    def _step(self, out: list[str], deltas: list[ToolCallDelta]) -> bool:
        """Decide what it can of the pending text; True if it should go on."""
        pending = self._pending
        if self._state == _TEXT:
            at = pending.find(CALL_OPEN)
            if at < 0:
                keep = _partial_tag(pending)
                out.append(pending[: len(pending) - keep])
                self._pending = pending[len(pending) - keep :]
                return False
            out.append(pending[:at])
            if not self._constrained:
                self._held, self._pending = pending[at:], ""
                return False
            self._pending, self._state = pending[at + len(CALL_OPEN) :], _HEAD_STATE
            return True
        if self._state == _HEAD_STATE:
            match = _HEAD.match(pending)
            if match is None:
                return False
            call = _Call(call_id(), json.loads(f'"{match.group(1)}"'))
            self._calls.append(call)
            deltas.append(ToolCallDelta(len(self._calls) - 1, call.id, call.name, ""))
            self._pending, self._state = pending[match.end() :], _ARGS
            self._depth, self._in_string, self._escaped = 0, False, False
            return True
        if self._state == _ARGS:
            end = self._scan(pending)
            fragment = pending[:end].lstrip() if not self._calls[-1].arguments else pending[:end]
            if fragment:
                self._calls[-1].arguments.append(fragment)
                deltas.append(ToolCallDelta(len(self._calls) - 1, arguments=fragment))
            self._pending = pending[end:]
            if self._depth == 0 and end > 0 and "".join(self._calls[-1].arguments):
                self._state = _TAIL_STATE
                return True
            return False
        match = _TAIL.match(pending)
        if match is None:
            return False
        self._complete += 1
        self._pending, self._state = pending[match.end() :], _TEXT
        return True

    def _scan(self, text: str) -> int:
        """How much of `text` belongs to the arguments' JSON value (an object)."""
        for index, char in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return index + 1
        return len(text)

    def _finish_held(self) -> tuple[str, list[ToolCallDelta]]:
        held, self._held = self._held, ""
        calls = self._parse_held(held)
        if calls is None:  # not all valid: the output is text
            return held, []
        deltas: list[ToolCallDelta] = []
        for name, arguments in calls:
            call = _Call(call_id(), name, [arguments])
            self._calls.append(call)
            index = len(self._calls) - 1
            deltas += [
                ToolCallDelta(index, call.id, name, ""),
                ToolCallDelta(index, arguments=arguments),
            ]
        self._complete = len(self._calls)
        return "", deltas

    def _parse_held(self, held: str) -> list[tuple[str, str]] | None:
        """Each call in `held` as (name, arguments), if every one is a valid call."""
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(held):
            if held[at].isspace():
                at += 1
                continue
            if not held.startswith(CALL_OPEN, at):
                return None
            try:
                value, at = decoder.raw_decode(held, _skip_space(held, at + len(CALL_OPEN)))
            except ValueError:
                return None
            at = _skip_space(held, at)
            if not held.startswith(CALL_CLOSE, at) or not self._valid(value):
                return None
            at += len(CALL_CLOSE)
            calls.append((value["name"], json.dumps(value["arguments"], ensure_ascii=False)))
        return calls

    def _valid(self, value: object) -> bool:
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            return False
        tool = self._tools.get(value["name"]) if isinstance(value["name"], str) else None
        if tool is None or not isinstance(value["arguments"], dict):
            return False
        schema = parameters_schema(tool)
        validator = jsonschema.validators.validator_for(schema)(schema)
        return bool(validator.is_valid(value["arguments"]))


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _partial_tag(text: str) -> int:
    """The length of the longest end of `text` that could begin the opening tag."""
    for length in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-length:]):
            return length
    return 0


def joined(deltas: Sequence[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Calls from their deltas, as a client accumulates a stream."""
    calls: list[list[str]] = []
    for delta in deltas:
        if delta.index == len(calls):
            calls.append([delta.id, delta.name, ""])
        calls[delta.index][2] += delta.arguments
    return tuple(ToolCall(*call) for call in calls)
