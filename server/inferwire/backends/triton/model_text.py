"""What inferwire itself holds of a Triton model's text: its tokenizer and chat template.

Triton runs the model and takes text; inferwire needs the model's tokenizer only to
tokenize and detokenize for clients and to count usage a model does not report
(`options.tokenizer`), and its chat template only to turn chat messages into a prompt
(`options.chat_template`, chat.py). Both are optional: a request that needs one that is
not configured is refused, naming the option to set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferwire.backends.chat_template import ChatTemplate
from inferwire.backends.triton.options import TritonOptions
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.results import Usage


class ModelText:
    """One Triton model's tokenizer and chat template, each present when configured."""

    def __init__(self, model_name: str, options: TritonOptions) -> None:
        self._model_name = model_name
        self._options = options
        self._tokenizer: Any = None
        self._chat_template: ChatTemplate | None = None

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    async def load(self) -> None:
        """Read the tokenizer once, and the chat template at every load, so that a load
        picks up an edited template."""
        if self._options.tokenizer is not None and self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(_load_tokenizer, self._options.tokenizer)
        if self._options.chat_template is not None:
            self._chat_template = await asyncio.to_thread(
                ChatTemplate.load, self._options.chat_template
            )

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        if self._chat_template is None:
            raise ModelNotReadyError(
                f"model {self._model_name!r} has no chat template; set options.chat_template "
                "to its tokenizer_config.json or a Jinja file"
            )
        return self._chat_template.render(messages)

    async def tokenize(self, text: str) -> list[int]:
        ids = await asyncio.to_thread(self._required_tokenizer().encode, text)
        return [int(i) for i in ids]

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        tokenizer = self._required_tokenizer()
        ids = np.array(token_ids, dtype=np.int32)
        return str(await asyncio.to_thread(tokenizer.decode, ids))

    async def usage(self, prompt: str, text: str) -> Usage:
        """The tokens of a prompt and its generated text, counted by the tokenizer (which
        the model's layout counts on: UsageSource.TOKENIZER)."""
        tokenizer = self._tokenizer
        prompt_ids, text_ids = await asyncio.to_thread(
            lambda: (tokenizer.encode(prompt), tokenizer.encode(text) if text else [])
        )
        return Usage(len(prompt_ids), len(text_ids))

    def _required_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise ModelNotReadyError(
                f"model {self._model_name!r} has no tokenizer in inferwire; set "
                "options.tokenizer to the model's ONNX Runtime GenAI tokenizer directory"
            )
        return self._tokenizer


def _load_tokenizer(path: str) -> Any:
    import onnxruntime_genai as og

    directory = Path(path).expanduser()
    if not (directory / "genai_config.json").is_file():
        raise ConfigurationError(
            f"options.tokenizer: {directory} must be a directory with genai_config.json "
            "and tokenizer.json (ONNX Runtime GenAI layout)"
        )
    return og.Tokenizer(str(directory))
