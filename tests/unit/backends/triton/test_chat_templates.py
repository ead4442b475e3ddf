"""Chat templates of Triton models: loading at load time, rendering per request."""

import json
from pathlib import Path

import pytest

pytest.importorskip("jinja2")

from inferwire.backends.chat_template import MAX_REASON_CHARS, ChatTemplate
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ConfigurationError, InvalidArgumentError

TEMPLATES = Path(__file__).resolve().parents[4] / "tests" / "triton" / "chat_templates"
CHAT = (ChatMessage("system", "Be brief."), ChatMessage("user", 'Hi <there> & "you"'))


def write_config(directory: Path, **config) -> Path:
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    return path


def test_tokenizer_config_template_renders_with_its_special_tokens_and_the_reply_opened():
    template = ChatTemplate.load(str(TEMPLATES / "tokenizer_config.json"))
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")  # AddedToken dict, string
    assert template.render(CHAT) == (
        '<s><|system|>\nBe brief.</s>\n<|user|>\nHi <there> & "you"</s>\n<|assistant|>\n'
    )


def test_jinja_file_renders_without_special_tokens_when_no_config_is_beside_it():
    template = ChatTemplate.load(str(TEMPLATES / "jinja" / "speaker.jinja"))
    assert (template.bos_token, template.eos_token) == ("", "")
    assert template.render(CHAT[1:]) == '### User:\nHi <there> & "you"\n\n### Assistant:\n'


def test_jinja_file_takes_special_tokens_from_a_tokenizer_config_beside_it(tmp_path):
    write_config(tmp_path, bos_token="<bos>", eos_token={"content": "<eos>"})
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    )
    template = ChatTemplate.load(str(tmp_path / "chat_template.jinja"))
    assert template.render(CHAT[1:]) == '<bos>Hi <there> & "you"<eos>'


def test_named_templates_use_the_default_one(tmp_path):
    path = write_config(
        tmp_path,
        chat_template=[
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{% for m in messages %}[{{ m.role }}]{% endfor %}"},
        ],
    )
    assert ChatTemplate.load(str(path)).render(CHAT) == "[system][user]"


def test_tojson_is_plain_json_as_in_hugging_face_templates(tmp_path):
    path = write_config(tmp_path, chat_template="{{ messages | tojson }}")
    rendered = ChatTemplate.load(str(path)).render(CHAT[1:])
    assert json.loads(rendered) == [{"role": "user", "content": 'Hi <there> & "you"'}]
    assert "<there>" in rendered  # not HTML-escaped


@pytest.mark.parametrize(
    ("files", "option", "problem"),
    [
        ({}, "missing.json", "is not a file"),
        ({"bad.json": "{not json"}, "bad.json", "cannot read"),
        ({"list.json": "[]"}, "list.json", "is not a JSON object"),
        ({"none.json": '{"eos_token": "x"}'}, "none.json", "has no chat_template"),
        ({"broken.jinja": "{% for m in messages %}"}, "broken.jinja", "does not parse"),
    ],
)
def test_a_template_that_cannot_be_used_is_a_load_error_naming_the_option(
    tmp_path, files, option, problem
):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigurationError) as raised:
        ChatTemplate.load(str(tmp_path / option))
    assert str(raised.value).startswith("options.chat_template: ")
    assert problem in str(raised.value)


def render_error(tmp_path: Path, source: str) -> InvalidArgumentError:
    template = ChatTemplate.load(str(write_config(tmp_path, chat_template=source)))
    with pytest.raises(InvalidArgumentError) as raised:
        template.render(CHAT)
    assert [v.field for v in raised.value.violations] == ["messages"]
    return raised.value


def test_raise_exception_in_the_template_is_invalid_argument_with_its_message(tmp_path):
    error = render_error(tmp_path, "{{ raise_exception('roles must alternate') }}")
    assert str(error) == "messages: the model's chat template refused them: roles must alternate"


def test_a_template_failing_at_render_time_is_invalid_argument_with_the_reason(tmp_path):
    error = render_error(tmp_path, "{{ messages[0].content + 1 }}")
    assert "TypeError" in str(error)


def test_the_sandbox_refuses_unsafe_operations(tmp_path):
    error = render_error(tmp_path, "{{ messages.__class__.__mro__ }}")
    assert "refused them" in str(error)
    error = render_error(tmp_path, "{% set x = messages.append(1) %}")
    assert "SecurityError" in str(error)


def test_a_long_template_error_is_cut_short(tmp_path):
    error = render_error(tmp_path, "{{ raise_exception('x' * 5000) }}")
    assert len(error.violations[0].description) < MAX_REASON_CHARS + 60


def test_a_template_rendering_nothing_is_invalid_argument(tmp_path):
    error = render_error(tmp_path, "{% if false %}x{% endif %}")
    assert "rendered them as nothing" in str(error)
