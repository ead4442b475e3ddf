"""The syntaxes models write tool calls in: which one a chat template asks for, and the
grammar (llguidance's Lark dialect) a constrained backend decodes calls under.

- HERMES (Hermes, Qwen; the default): each call
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; auto's trigger `<tool_call>`.
- LLAMA3_JSON (Llama 3.1 / 3.2 / 3.3 JSON tool calling):
  `[<|python_tag|>]{"name": ..., "parameters": {...}}`, several separated by `;`; auto's
  trigger `{"name"` or `<|python_tag|>`.
- MISTRAL: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`; trigger `[TOOL_CALLS]`.

Every call is one JSON object whose `name` comes first, so a stream can say the name as
soon as it is complete and then the argument text as it comes (core/tool_calls.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from inferwire.core.chat import Tool, ToolChoiceMode, ToolSyntax
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import ConstraintKind, OutputConstraint
from inferwire.core.tools import call_schema, choice_of, closed, offered, parameters_schema

PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"


def template_syntax(template: str | None) -> ToolSyntax | None:
    """The syntax a chat template renders and asks for calls in; None for a template that
    knows no tools (the core then renders them in its documented default, Hermes').

    The markers that decide, in this order (as vLLM's and llama.cpp's detection reads
    templates by their markers):
    - no template, or one that never says `tools`: None (it knows no tools);
    - `<tool_call>`: HERMES (Hermes', Qwen's templates);
    - `[TOOL_CALLS]` or `[AVAILABLE_TOOLS]`: MISTRAL;
    - `<|python_tag|>`, or `ipython` (Llama 3's role for tool results): LLAMA3_JSON;
    - anything else that says `tools`: None, so the Hermes default, which the template's
      own rendering of tools might contradict.
    Hermes' tag goes first: a Qwen template never spells the others, and a template that
    spells `<tool_call>` asks for it, whatever else it mentions.
    """
    if template is None or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return ToolSyntax.HERMES
    if MISTRAL_CALLS in template or "[AVAILABLE_TOOLS]" in template:
        return ToolSyntax.MISTRAL
    if PYTHON_TAG in template or "ipython" in template:
        return ToolSyntax.LLAMA3_JSON
    return None


@dataclass(frozen=True)
class SyntaxSpec:
    """A syntax as the parser reads it: what opens the calls, the key of the arguments,
    and the regular expressions around each call's arguments."""

    triggers: tuple[str, ...]  # what opens the calls; a trigger in `kept` is the call's start
    kept: tuple[str, ...]
    block_open: re.Pattern[str]  # after the trigger, before the first call
    arguments_keys: tuple[str, ...]  # the grammar writes the first
    tail: re.Pattern[str]  # after a call's arguments: the call is complete
    next_call: re.Pattern[str] | None  # between calls of a block; None: back to text
    block_close: re.Pattern[str] | None

    def head(self) -> re.Pattern[str]:
        keys = "|".join(self.arguments_keys)
        return re.compile(rf'\s*\{{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:{keys})"\s*:\s*')


_NOTHING = re.compile("")
SPECS = {
    ToolSyntax.HERMES: SyntaxSpec(
        triggers=("<tool_call>",),
        kept=(),
        block_open=_NOTHING,
        arguments_keys=("arguments",),
        tail=re.compile(r"\s*\}\s*</tool_call>"),
        next_call=None,
        block_close=None,
    ),
    ToolSyntax.LLAMA3_JSON: SyntaxSpec(
        triggers=(PYTHON_TAG, '{"name"'),
        kept=('{"name"',),
        block_open=_NOTHING,
        arguments_keys=("parameters", "arguments"),
        tail=re.compile(r"\s*\}"),
        next_call=re.compile(r"\s*;"),
        block_close=None,
    ),
    ToolSyntax.MISTRAL: SyntaxSpec(
        triggers=(MISTRAL_CALLS,),
        kept=(),
        block_open=re.compile(r"\s*\["),
        arguments_keys=("arguments",),
        tail=re.compile(r"\s*\}"),
        next_call=re.compile(r"\s*,"),
        block_close=re.compile(r"\s*\]"),
    ),
}


def tool_grammar(
    request: InferenceRequest, syntax: ToolSyntax = ToolSyntax.HERMES
) -> OutputConstraint | None:
    """The Lark grammar (llguidance's dialect) the answer must match, None without tools.

    `required` and a named tool allow calls only; `auto` allows free text that never spells
    the syntax's trigger, or text up to the trigger and calls only from there (the lazy
    trigger of llama.cpp's grammars); `parallel_tool_calls: false` allows one call."""
    tools, choice = offered(request), choice_of(request)
    if not tools:
        return None
    key = SPECS[syntax].arguments_keys[0]
    rules = []
    for index, tool in enumerate(tools):
        schema = {"x-guidance": {"whitespace_flexible": False}, **call_schema(tool, key)}
        rules.append(f"call_{index}: %json {json.dumps(schema)}")
    alternatives = " | ".join(f"call_{index}" for index in range(len(tools)))
    parallel = request.parallel_tool_calls
    if syntax is ToolSyntax.HERMES:
        opened = 'call "</tool_call>"' + (" block*" if parallel else "")
        trigger = avoid = "<tool_call>"
        required = "block+" if parallel else "block"
    elif syntax is ToolSyntax.LLAMA3_JSON:
        opened = 'call (";" call)*' if parallel else "call"
        trigger, avoid = r"<\|python_tag\|>", r'(\{"name"|<\|python_tag\|>)'
        required = f'"{PYTHON_TAG}"? {opened}'
    else:
        opened = '"[" call ("," call)* "]"' if parallel else '"[" call "]"'
        trigger = avoid = r"\[TOOL_CALLS\]"
        required = f'"{MISTRAL_CALLS}" {opened}'
    if choice is ToolChoiceMode.AUTO:
        # Free text that never spells the trigger, or text up to the first trigger (a lazy
        # lexeme: it ends there) and calls only after it (llama.cpp's lazy grammars). A
        # greedy text lexeme would swallow the trigger's start and could not give it back.
        lines = [
            "start: TEXT | opened" + (" | named" if syntax is ToolSyntax.LLAMA3_JSON else ""),
            f"opened: prefix {opened}",
            f"prefix[lazy]: /(.|\\n)*{trigger}/",
            f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{avoid}(.|\\n)*/",
        ]
        if syntax is ToolSyntax.LLAMA3_JSON:  # a bare call: its `{"name"` is the trigger
            lines += _llama3_named(tools, parallel)
    else:
        lines = [f"start: {required}"]
    if syntax is ToolSyntax.HERMES:
        lines.append('block: "<tool_call>" call "</tool_call>"')
    lines += [f"call: {alternatives}", *rules]
    grammar = "\n".join(lines) + "\n"
    names = {tool.name: index for index, tool in enumerate(request.tools)}
    parts = tuple(
        (f"tools[{names[tool.name]}].parameters_json_schema", json.dumps(parameters_schema(tool)))
        for tool in tools
    )
    return OutputConstraint(ConstraintKind.LARK_GRAMMAR, grammar, origin="tools", parts=parts)


def _llama3_named(tools: tuple[Tool, ...], parallel: bool) -> list[str]:
    """Llama 3's bare call after text: a lazy prefix up to `{"name"`, then the rest of the
    call, written out (the same compact JSON `%json` writes), then calls."""
    lines = [
        "named: name_prefix rest" + (' (";" call)*' if parallel else ""),
        'name_prefix[lazy]: /(.|\\n)*\\{"name"/',
        "rest: " + " | ".join(f"rest_{index}" for index in range(len(tools))),
    ]
    for index, tool in enumerate(tools):
        head = json.dumps(":" + json.dumps(tool.name) + ',"parameters":')
        schema = {"x-guidance": {"whitespace_flexible": False}, **closed(parameters_schema(tool))}
        lines.append(f'rest_{index}: {head} %json {json.dumps(schema)} "}}"')
    return lines
