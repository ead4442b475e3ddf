"""A conversation's content as the core takes it: chat messages, and the tools a model may call
and the calls it made."""

from __future__ import annotations

import enum
from dataclasses import dataclass

CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (valid under the tool's schema when
    the backend constrains calls)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of a call: the first of a call carries `id` and `name` (and no
    arguments), later ones only argument text; `index` counts the answer's calls."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is its JSON Schema as JSON text."""

    name: str
    description: str = ""
    parameters: str = ""  # empty: no parameters (an object with none)
    strict: bool = False


class ToolChoiceMode(enum.Enum):
    NONE = "none"  # never call: the tools are not offered
    AUTO = "auto"  # text, or calls from the moment the model opens one
    REQUIRED = "required"  # calls only


class ToolSyntax(enum.Enum):
    """How a model writes its calls (core/tool_syntax.py detects it from the template)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>; the default
    LLAMA3_JSON = "llama3_json"  # [<|python_tag|>]{"name": ..., "parameters": {...}}
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]


@dataclass(frozen=True)
class ToolChoice:
    """`mode`, or one named function (`function` set: calls to it only)."""

    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function: str = ""


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation; the model's chat template renders them into a prompt."""

    role: str  # one of CHAT_ROLES
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a `tool` message: the call it answers
