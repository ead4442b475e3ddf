"""A Triton model's tokenizer and chat template, held in inferwire: each is there only
when configured, a request that needs a missing one is refused naming its option, and a
load reads the chat template again."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnxruntime_genai as og
import pytest

pytest.importorskip("jinja2")

from inferwire.backends.ort_genai.backend import builtin_model_path
from inferwire.backends.triton.model_text import ModelText
from inferwire.backends.triton.options import TritonOptions
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ConfigurationError, ModelNotReadyError

TEMPLATES = Path(__file__).resolve().parents[4] / "tests" / "triton" / "chat_templates"
HI = (ChatMessage("user", "Hi"),)


def text(**options: object) -> ModelText:
    return ModelText("m", TritonOptions(url="localhost:8001", **options))  # type: ignore[arg-type]


async def test_without_options_it_holds_neither_and_refuses_naming_the_option():
    unconfigured = text()
    await unconfigured.load()
    assert not unconfigured.has_tokenizer and not unconfigured.has_chat_template
    with pytest.raises(ModelNotReadyError, match=r"options\.chat_template"):
        unconfigured.render_chat(HI)
    with pytest.raises(ModelNotReadyError, match=r"options\.tokenizer"):
        await unconfigured.tokenize("hello")
    with pytest.raises(ModelNotReadyError, match=r"options\.tokenizer"):
        await unconfigured.detokenize([1, 2])


async def test_a_tokenizer_directory_without_genai_config_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match=r"genai_config\.json"):
        await text(tokenizer=str(tmp_path)).load()


async def test_the_tokenizer_tokenizes_detokenizes_and_counts_usage():
    configured = text(tokenizer=str(builtin_model_path()))
    await configured.load()
    assert configured.has_tokenizer
    expected = [int(i) for i in og.Tokenizer(str(builtin_model_path())).encode("Shall I")]
    ids = await configured.tokenize("Shall I")
    assert ids == expected
    assert (await configured.detokenize(ids)).strip() == "Shall I"
    usage = await configured.usage("Shall I", "")
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(expected), 0)


async def test_each_load_reads_the_chat_template_again(tmp_path):
    template = tmp_path / "chat_template.jinja"
    shutil.copy(TEMPLATES / "jinja" / "speaker.jinja", template)
    configured = text(chat_template=str(template))
    await configured.load()
    assert configured.has_chat_template
    assert configured.render_chat(HI).startswith("### User:\nHi")
    template.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert configured.render_chat(HI).startswith("### User:")  # compiled once, at load
    await configured.load()
    assert configured.render_chat(HI) == "[Hi]"
