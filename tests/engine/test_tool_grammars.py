"""Each syntax's grammar checked by llguidance itself (its own virtualenv, built once:
tests/support/side_venvs.py) on the demo model's tokenizer: a valid call is accepted, a
malformed one (the wrong key, no list, an unknown tool, a second call where only one is
allowed, the trigger spelled in auto's free text before a call) is rejected. Tools whose
schemas refer to their own `$defs` (two tools, each with a `Node` of its own, one
recursive) compile in every syntax and constrain by their definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.core.chat import Tool, ToolChoice, ToolChoiceMode, ToolSyntax
from inferwire.core.requests import InferenceRequest
from inferwire.core.tool_syntax import tool_grammar
from tests.support.side_venvs import LLGUIDANCE, run_side_program

TOKENIZER = builtin_model_path() / "tokenizer.json"
NOTE = Tool(
    "note",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"t": {"type": "string", "maxLength": 8}},
            "required": ["t"],
        }
    ),
)
H, L, M = ToolSyntax.HERMES, ToolSyntax.LLAMA3_JSON, ToolSyntax.MISTRAL
REQUIRED, AUTO = ToolChoiceMode.REQUIRED, ToolChoiceMode.AUTO
HC = '<tool_call>{"name":"note","arguments":{"t":"hi"}}</tool_call>'
LC = '{"name":"note","parameters":{"t":"hi"}}'
MC = '{"name":"note","arguments":{"t":"hi"}}'
# Two tools with a definition of the same name, each its own: SCENE's is recursive.
SCENE = Tool(
    "scene",
    parameters=json.dumps(
        {
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "string"},
                        "kids": {"items": {"$ref": "#/$defs/Node"}},
                    },
                    "required": ["n"],
                }
            },
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}},
            "required": ["root"],
        }
    ),
)
COUNT = Tool(
    "count",
    parameters=json.dumps(
        {
            "definitions": {"Node": {"type": "integer", "minimum": 0}},
            "type": "object",
            "properties": {"k": {"$ref": "#/definitions/Node"}},
            "required": ["k"],
        }
    ),
)
TREE = '{"root":{"n":"a","kids":[{"n":"b","kids":[{"n":"c"}]}]}}'
# (syntax, choice, parallel, text, accepted)
CASES = [
    (H, REQUIRED, True, HC + HC, True),
    (H, REQUIRED, False, HC + HC, False),
    (H, REQUIRED, True, HC.replace("note", "other"), False),
    (H, AUTO, True, "Fine. " + HC, True),
    (L, REQUIRED, True, LC, True),
    (L, REQUIRED, True, "<|python_tag|>" + LC + ";" + LC, True),
    (L, REQUIRED, False, LC + ";" + LC, False),
    (L, REQUIRED, True, MC, False),  # `arguments`: Llama 3's key is `parameters`
    (L, REQUIRED, True, '{"name":"note","parameters":{"t":7}}', False),
    (L, AUTO, True, LC + ";" + LC, True),
    (L, AUTO, True, "Let me see. <|python_tag|>" + LC, True),
    (L, AUTO, True, "Let me see. " + LC + ";" + LC, True),
    (L, AUTO, False, "Let me see. " + LC + ";" + LC, False),
    (L, AUTO, True, 'Let me see. {"name":"other","parameters":{}}', False),
    (H, AUTO, False, "Fine. " + HC + HC, False),
    (H, AUTO, True, "Fine. <tool_call>{}", False),
    (L, AUTO, True, "Just text.", True),
    (L, AUTO, True, 'Text {"name": x} ' + LC, False),  # the trigger in free text
    (M, REQUIRED, True, f"[TOOL_CALLS][{MC},{MC}]", True),
    (M, REQUIRED, False, f"[TOOL_CALLS][{MC},{MC}]", False),
    (M, REQUIRED, True, f"[TOOL_CALLS]{MC}", False),  # not a list
    (M, REQUIRED, True, f"[TOOL_CALLS][{LC}]", False),
    (M, AUTO, True, f"Sure. [TOOL_CALLS][{MC}]", True),
]
# (syntax, text, accepted) with SCENE and COUNT offered, `required`
DEFS_CASES = [
    (H, f'<tool_call>{{"name":"scene","arguments":{TREE}}}</tool_call>', True),
    (H, '<tool_call>{"name":"count","arguments":{"k":3}}</tool_call>', True),
    (H, '<tool_call>{"name":"count","arguments":{"k":-3}}</tool_call>', False),
    (
        H,
        '<tool_call>{"name":"scene","arguments":{"root":{"n":"a","kids":[{}]}}}</tool_call>',
        False,
    ),
    (H, '<tool_call>{"name":"count","arguments":{"k":{"n":"a"}}}</tool_call>', False),
    (L, f'{{"name":"scene","parameters":{TREE}}}', True),
    (L, 'Well. {"name":"count","parameters":{"k":2}}', True),  # auto's bare call, below
    (L, '{"name":"count","parameters":{"k":"2"}}', False),
    (
        M,
        f'[TOOL_CALLS][{{"name":"scene","arguments":{TREE}}},{{"name":"count","arguments":{{"k":1}}}}]',
        True,
    ),
    (M, '[TOOL_CALLS][{"name":"scene","arguments":{"root":{"kids":[]}}}]', False),
]


def _checked(requests: list[tuple[InferenceRequest, ToolSyntax, str]]) -> list[str]:
    """llguidance's verdict on each text under its request's grammar."""
    cases = []
    for request, syntax, text in requests:
        grammar = tool_grammar(request, syntax)
        assert grammar is not None
        cases.append({"grammar": grammar.text, "text": text})
    job = json.dumps({"tokenizer": str(TOKENIZER), "cases": cases})
    program = Path(__file__).resolve().parents[1] / "support" / "llguidance_check.py"
    return list(json.loads(run_side_program(LLGUIDANCE, program, stdin=job)))


def _offering(
    tools: tuple[Tool, ...], choice: ToolChoiceMode, parallel: bool = True
) -> InferenceRequest:
    return InferenceRequest(
        request_id="r",
        model="m",
        prompt="",
        tools=tools,
        tool_choice=ToolChoice(choice),
        parallel_tool_calls=parallel,
    )


@pytest.fixture(scope="module")
def verdicts() -> list[str]:
    return _checked(
        [
            (_offering((NOTE,), choice, parallel), syntax, text)
            for syntax, choice, parallel, text, _ in CASES
        ]
    )


@pytest.fixture(scope="module")
def defs_verdicts() -> list[str]:
    # A Llama 3 call after text is auto's bare call; the rest are `required`.
    return _checked(
        [
            (
                _offering((SCENE, COUNT), AUTO if syntax is L and text[0] != "{" else REQUIRED),
                syntax,
                text,
            )
            for syntax, text, _ in DEFS_CASES
        ]
    )


@pytest.mark.parametrize("index", range(len(DEFS_CASES)))
def test_tools_with_their_own_definitions_compile_and_constrain_in_every_syntax(
    defs_verdicts: list[str], index: int
) -> None:
    syntax, text, accepted = DEFS_CASES[index]
    assert defs_verdicts[index].startswith("accepted") is accepted, (
        syntax,
        text,
        defs_verdicts[index],
    )


@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_grammar_accepts_valid_calls_and_rejects_malformed_ones(
    verdicts: list[str], index: int
) -> None:
    syntax, choice, parallel, text, accepted = CASES[index]
    why = (syntax, choice, parallel, text, verdicts[index])
    assert verdicts[index].startswith("accepted") is accepted, why
