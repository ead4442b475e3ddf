"""A chat template that takes `tools` and writes calls in Hermes' tags gets the tools and
the conversation's calls as Hugging Face's templates do (through onnxruntime-genai's
`apply_chat_template`); one that knows no tools gets None, and the core's default."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from inferwire.backends.ort_genai import OrtGenAIBackend, builtin_model_path
from inferwire.core.chat import ChatMessage, Tool, ToolCall

# The demo model's roles, plus tools and calls in the Hermes / Qwen way.
TEMPLATE = (
    "{%- if tools %}{{ '[TOOLS' }}{%- for tool in tools %}{{ ' ' + tool.function.name }}"
    "{%- endfor %}{{ '; call in <tool_call></tool_call>]\\n\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{ 'ROMEO:\\n' + message.content + '\\n\\n' }}"
    "{%- elif message.role == 'assistant' %}{{ 'JULIET:\\n' }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{ '<tool_call>' + call.function.name + ' ' + (call.function.arguments | tojson) + "
    "'</tool_call>' }}{%- endfor %}{%- else %}{{ message.content }}{%- endif %}{{ '\\n\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<tool_response>' + message.content + '</tool_response>\\n\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ 'JULIET:\\n' }}{%- endif %}"
)
WEATHER = Tool("get_weather", "The weather", json.dumps({"type": "object", "properties": {}}))
CONVERSATION = (
    ChatMessage("user", "Weather in Verona?"),
    ChatMessage("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Verona"}'),)),
    ChatMessage("tool", '{"sky": "clear"}', tool_call_id="call_1"),
)


@pytest.fixture(scope="module")
async def hermes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OrtGenAIBackend]:
    folder = tmp_path_factory.mktemp("hermes-demo")
    for source in builtin_model_path().iterdir():
        if source.name != "tokenizer_config.json":
            (folder / source.name).symlink_to(source)
    config = json.loads((builtin_model_path() / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    backend = OrtGenAIBackend("hermes", {"path": str(folder)}, max_concurrency=1)
    await backend.load()
    yield backend
    await backend.unload()


async def test_a_template_with_tools_renders_them_and_the_calls(hermes: OrtGenAIBackend) -> None:
    prompt = hermes.render_chat_with_tools(CONVERSATION, [WEATHER])
    assert prompt == (
        "[TOOLS get_weather; call in <tool_call></tool_call>]\n\n"
        "ROMEO:\nWeather in Verona?\n\n"
        'JULIET:\n<tool_call>get_weather {"city": "Verona"}</tool_call>\n\n'
        '<tool_response>{"sky": "clear"}</tool_response>\n\n'
        "JULIET:\n"
    )


async def test_a_template_without_tools_leaves_them_to_the_core() -> None:
    backend = OrtGenAIBackend("plain", {"path": "builtin"}, max_concurrency=1)
    await backend.load()
    try:
        assert backend.render_chat_with_tools(CONVERSATION, [WEATHER]) is None
    finally:
        await backend.unload()
