"""Hugging Face chat templates, rendered in inferwire, for backends whose engine takes text.

Triton's vLLM and TensorRT-LLM backends take text, so chat messages become a prompt here,
with the model's own Hugging Face chat template (`options.chat_template`): the
`chat_template` of a `tokenizer_config.json`, or a Jinja file. The llama.cpp backend
renders the template a GGUF file carries the same way (or that option's, when set).
Templates are untrusted input, so they run in Jinja's immutable sandbox; each is
compiled once, at load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ConfigurationError, FieldViolation, InvalidArgumentError

OPTION = "options.chat_template"
# The longest template error passed on to a client: templates may quote whole messages.
MAX_REASON_CHARS = 300


class TemplateRaised(Exception):
    """The template called `raise_exception` (how HF templates refuse a conversation)."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, > and & for HTML; HF's (which templates expect) does not.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _special_token(config: dict[str, Any], name: str) -> str:
    """A special token's text: a string, or an AddedToken dict with `content`."""
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _template_source(config: dict[str, Any], path: Path) -> str:
    """The template of a tokenizer_config.json: a string, or the one named `default`."""
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        raise ConfigurationError(
            f"{OPTION}: {path} has no chat_template (a string, or a list with one named 'default')"
        )
    return source


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"{OPTION}: cannot read {path} as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigurationError(f"{OPTION}: {path} is not a JSON object")
    return config


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    path: Path
    template: Any  # jinja2.Template
    bos_token: str
    eos_token: str

    @classmethod
    def load(cls, option: str) -> ChatTemplate:
        """Read and compile the template `options.chat_template` names.

        A `.json` file is a tokenizer_config.json; anything else is Jinja source, whose
        special tokens come from a tokenizer_config.json beside it, if there is one.
        """
        path = Path(option).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"{OPTION}: {path} is not a file")
        if path.suffix == ".json":
            config = _read_json(path)
            source = _template_source(config, path)
        else:
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(f"{OPTION}: cannot read {path}: {exc}") from None
            beside = path.parent / "tokenizer_config.json"
            config = _read_json(beside) if beside.is_file() else {}
        bos, eos = _special_token(config, "bos_token"), _special_token(config, "eos_token")
        return cls.compile(source, path, bos, eos)

    @classmethod
    def compile(cls, source: str, path: Path, bos_token: str, eos_token: str) -> ChatTemplate:
        """Compile Jinja `source` (read from `path`, named in errors)."""
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigurationError(
                f"{OPTION}: the template in {path} does not parse: {exc.message} "
                f"(template line {exc.lineno})"
            ) from None
        return cls(path, template, bos_token, eos_token)

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for `messages`, with the assistant's reply opened.

        A template that refuses the conversation or fails is INVALID_ARGUMENT on `messages`.
        """
        return self.render_with(
            [{"role": m.role, "content": m.content} for m in messages], tools=None
        )

    def render_with(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        """The prompt for messages as Hugging Face's templates take them (calls, tool
        results), and `tools` (OpenAI's function objects) where the template renders them."""
        extra = {} if tools is None else {"tools": tools}
        try:
            prompt: str = self.template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except Exception as exc:  # a template is code: any failure is the request's
            reason = str(exc) or type(exc).__name__
            if not isinstance(exc, TemplateRaised):
                reason = f"{type(exc).__name__}: {reason}"
            if len(reason) > MAX_REASON_CHARS:
                reason = reason[:MAX_REASON_CHARS] + "…"
            raise InvalidArgumentError(
                [FieldViolation("messages", f"the model's chat template refused them: {reason}")]
            ) from None
        if not prompt:
            raise InvalidArgumentError(
                [FieldViolation("messages", "the model's chat template rendered them as nothing")]
            )
        return prompt
