"""The call syntaxes end to end over HTTP on a real `inferwire serve`: the demo model's
weights under chat templates written for these tests, one in Llama 3's JSON tool calling
(`<|python_tag|>`, role `ipython`), one in Mistral's (`[TOOL_CALLS]`). Each template
renders the tools and the conversation's calls itself; the server decodes calls under the
syntax's grammar and reads them back with its parser, so a client gets OpenAI's
`tool_calls` (`arguments` as JSON text, whatever the model's key) unary and streamed alike.

The simulator has no chat template (it always gets the Hermes default), so unconstrained
parsing of these syntaxes is covered by the unit tests (tests/unit/core/test_tool_syntax.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from inferwire.backends.ort_genai import builtin_model_path
from tests.support.process import ServerProcess, serving_with_config

_ROLES = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{ 'ROMEO:\\n' + m.content + '\\n\\n' }}"
    "{%- elif m.role == 'assistant' %}{{ 'JULIET:\\n' }}"
    "{%- if m.tool_calls %}CALLS{%- else %}{{ m.content }}{%- endif %}{{ '\\n\\n' }}"
    "{%- elif m.role == 'tool' or m.role == 'ipython' %}RESULT{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ 'JULIET:\\n' }}{%- endif %}"
)
TEMPLATES = {
    "llama3": (
        "{%- if tools %}{{ 'Environment: ipython\\nTools:' }}{%- for tool in tools %}"
        "{{ ' ' + tool.function.name }}{%- endfor %}"
        '{{ \'\\nRespond with {"name": function name, "parameters": arguments}\\n\\n\' }}'
        "{%- endif %}"
        + _ROLES.replace(
            "CALLS",
            '{%- for call in m.tool_calls %}{{ \'<|python_tag|>{"name": "\' + call.function.name'
            " + '\", \"parameters\": ' + (call.function.arguments | tojson) + '}' }}{%- endfor %}",
        ).replace("RESULT", "{{ 'ipython:\\n' + m.content + '\\n\\n' }}")
    ),
    "mistral": (
        "{%- if tools %}{{ '[AVAILABLE_TOOLS]' }}{%- for tool in tools %}"
        "{{ ' ' + tool.function.name }}{%- endfor %}{{ '[/AVAILABLE_TOOLS]\\n\\n' }}{%- endif %}"
        + _ROLES.replace(
            "CALLS",
            "{{ '[TOOL_CALLS][' }}{%- for call in m.tool_calls %}{{ '{\"name\": \"' + "
            'call.function.name + \'", "arguments": \' + (call.function.arguments | tojson) + '
            "', \"id\": \"' + call.id + '\"}' }}{%- endfor %}{{ ']' }}",
        ).replace(
            "RESULT",
            "{{ '[TOOL_RESULTS]' + m.tool_call_id + ' ' + m.content + '[/TOOL_RESULTS]\\n\\n' }}",
        )
    ),
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _model_folder(root: Path, template: str) -> Path:
    """The demo model's files, with `template` as its chat template."""
    root.mkdir()
    for source in builtin_model_path().iterdir():
        if source.name != "tokenizer_config.json":
            (root / source.name).symlink_to(source)
    config = json.loads((builtin_model_path() / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("syntaxes")
    models = [
        {
            "name": name,
            "load_on_startup": True,
            "options": {
                "path": str(_model_folder(directory / name, template)),
                "batching": "per_request",
            },
        }
        for name, template in TEMPLATES.items()
    ]
    config = json.dumps({"server": {"grace_period_s": 1}, "models": models})
    with serving_with_config(directory, config) as server:
        yield server


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.http_url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", list(TEMPLATES))
def test_a_required_call_is_valid_and_streams_as_unary(client: openai.OpenAI, model: str) -> None:
    asked: Any = dict(
        model=model,
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=5,
        max_tokens=160,
    )
    choice = client.chat.completions.create(**asked).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**asked, stream=True):
        assert not chunk.choices[0].delta.content
        for delta in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(delta.index, [delta.function.name or "", ""])
            entry[1] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls.values()) == [[call.function.name, call.function.arguments]]


@pytest.mark.parametrize("model", list(TEMPLATES))
def test_an_agent_turn_renders_the_call_and_its_result(client: openai.OpenAI, model: str) -> None:
    first = client.chat.completions.create(
        model=model,
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
    )
    (call,) = first.choices[0].message.tool_calls or []
    history: Any = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
    ]
    final = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=12
    )
    assert final.choices[0].message.content and final.choices[0].message.tool_calls is None
    # `auto` after the result: text, or calls that are valid (the grammar allows both).
    auto = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, max_tokens=160, seed=3, temperature=1.0
    )
    for later in auto.choices[0].message.tool_calls or ():
        jsonschema.validate(json.loads(later.function.arguments), WEATHER)
