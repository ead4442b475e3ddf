"""Tool calls read out of a model's output, as it streams.

The parser follows the grammar of the model's syntax (core/tool_syntax.py): text until
the syntax's trigger (`<tool_call>`; `<|python_tag|>` or `{"name"`; `[TOOL_CALLS]`), then
calls, each a JSON object whose `name` comes first and whose arguments (`arguments`, or
Llama 3's `parameters`) are an object. Under the grammar (a constrained backend) a call's
first delta says its name as soon as the name is complete and later deltas carry the
argument text as it comes; the JSON is scanned string by string, so a closing marker
inside a string argument is just text. Clients get the arguments as `arguments` whatever
the model's key. Without the grammar (a backend that cannot constrain) everything from
the first trigger is held to the end, then every call is parsed and validated against its
tool's schema: all valid, they are the calls; else the held text is the answer's text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import jsonschema

from inferwire.core.chat import Tool, ToolCall, ToolCallDelta, ToolSyntax
from inferwire.core.results import FinishReason
from inferwire.core.tool_syntax import MISTRAL_CALLS, PYTHON_TAG, SPECS
from inferwire.core.tools import CALL_CLOSE, CALL_OPEN, parameters_schema

_TEXT, _BLOCK, _HEAD_STATE, _ARGS, _TAIL_STATE, _AFTER = range(6)


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ToolCallParser:
    """Splits output text into answer text and tool-call deltas, one piece at a time."""

    def __init__(
        self, tools: Sequence[Tool], constrained: bool, syntax: ToolSyntax = ToolSyntax.HERMES
    ) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._constrained = constrained
        self._syntax, self._spec = syntax, SPECS[syntax]
        self._head = self._spec.head()
        self._state = _TEXT
        self._opened = ""  # the trigger of the calls being read
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
        if self._state == _TEXT:
            return text, []
        if self._state in (_BLOCK, _HEAD_STATE) and (self._opened or not self._calls):
            return self._opened + text, []  # a block cut before its first call's name
        return "", []

    def _step(self, out: list[str], deltas: list[ToolCallDelta]) -> bool:
        """Decide what it can of the pending text; True if it should go on."""
        pending, spec = self._pending, self._spec
        if self._state == _TEXT:
            at, trigger = _first_trigger(pending, spec.triggers)
            if at < 0:
                keep = _partial_trigger(pending, spec.triggers)
                out.append(pending[: len(pending) - keep])
                self._pending = pending[len(pending) - keep :]
                return False
            out.append(pending[:at])
            if not self._constrained:
                self._held, self._pending = pending[at:], ""
                return False
            skip = 0 if trigger in spec.kept else len(trigger)
            self._opened = pending[at : at + skip]
            self._pending, self._state = pending[at + skip :], _BLOCK
            return True
        if self._state == _BLOCK:
            match = spec.block_open.match(pending)
            if match is None:
                return False
            self._opened += pending[: match.end()]
            self._pending, self._state = pending[match.end() :], _HEAD_STATE
            return True
        if self._state == _HEAD_STATE:
            match = self._head.match(pending)
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
        if self._state == _TAIL_STATE:
            match = spec.tail.match(pending)
            if match is None:
                return False
            self._complete += 1
            self._pending = pending[match.end() :]
            self._state = _TEXT if spec.next_call is None else _AFTER
            return True
        return self._after(pending)

    def _after(self, pending: str) -> bool:
        """Between a block's calls: the next one, the block's end, or text."""
        spec = self._spec
        assert spec.next_call is not None
        if (match := spec.next_call.match(pending)) is not None:
            self._pending, self._state, self._opened = pending[match.end() :], _HEAD_STATE, ""
            return True
        if spec.block_close is not None and (match := spec.block_close.match(pending)):
            self._pending, self._state = pending[match.end() :], _TEXT
            return True
        if not pending.strip():
            return False  # only space so far: wait for what follows
        self._state = _TEXT
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
        if self._syntax is ToolSyntax.HERMES:
            values = _hermes_values(held)
        elif self._syntax is ToolSyntax.LLAMA3_JSON:
            values = _llama3_values(held)
        else:
            values = _mistral_values(held)
        calls = []
        for value in values or ():
            if not isinstance(value, dict) or not self._valid(value):
                return None
            arguments = value[_arguments_key(value)]
            calls.append((value["name"], json.dumps(arguments, ensure_ascii=False)))
        return calls or None

    def _valid(self, value: object) -> bool:
        if not isinstance(value, dict) or len(value) != 2 or "name" not in value:
            return False
        key = _arguments_key(value)
        if key not in self._spec.arguments_keys:
            return False
        tool = self._tools.get(value["name"]) if isinstance(value["name"], str) else None
        if tool is None or not isinstance(value[key], dict):
            return False
        schema = parameters_schema(tool)
        validator = jsonschema.validators.validator_for(schema)(schema)
        return bool(validator.is_valid(value[key]))


def _arguments_key(value: dict[str, object]) -> str:
    return next((key for key in value if key != "name"), "")


_DECODER = json.JSONDecoder()


def _hermes_values(held: str) -> list[object] | None:
    """The JSON of each `<tool_call>...</tool_call>` in `held`; None if anything else."""
    values, at = [], 0
    while (at := _skip_space(held, at)) < len(held):
        if not held.startswith(CALL_OPEN, at):
            return None
        try:
            value, at = _DECODER.raw_decode(held, _skip_space(held, at + len(CALL_OPEN)))
        except ValueError:
            return None
        at = _skip_space(held, at)
        if not held.startswith(CALL_CLOSE, at):
            return None
        values.append(value)
        at += len(CALL_CLOSE)
    return values


def _llama3_values(held: str) -> list[object] | None:
    """The JSON objects of `[<|python_tag|>]{...}; {...}`; None if anything else."""
    at = len(PYTHON_TAG) if held.startswith(PYTHON_TAG) else 0
    values = []
    while True:
        try:
            value, at = _DECODER.raw_decode(held, _skip_space(held, at))
        except ValueError:
            return None
        values.append(value)
        at = _skip_space(held, at)
        if at == len(held):
            return values
        if held[at] != ";":
            return None
        at += 1


def _mistral_values(held: str) -> list[object] | None:
    """The objects of `[TOOL_CALLS][{...}, ...]`; None if anything else."""
    try:
        value, at = _DECODER.raw_decode(held, _skip_space(held, len(MISTRAL_CALLS)))
    except ValueError:
        return None
    if not held.startswith(MISTRAL_CALLS) or not isinstance(value, list):
        return None
    return value if _skip_space(held, at) == len(held) else None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _first_trigger(text: str, triggers: Sequence[str]) -> tuple[int, str]:
    """Where the first trigger in `text` starts, and which; (-1, "") if none does."""
    found = [(at, trigger) for trigger in triggers if (at := text.find(trigger)) >= 0]
    return min(found) if found else (-1, "")


def _partial_trigger(text: str, triggers: Sequence[str]) -> int:
    """The length of the longest end of `text` that could begin a trigger."""
    for length in range(min(len(text), max(map(len, triggers)) - 1), 0, -1):
        if any(trigger.startswith(text[-length:]) for trigger in triggers):
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
