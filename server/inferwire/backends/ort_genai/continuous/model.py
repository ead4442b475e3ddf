"""A model folder in ORT GenAI format loaded for the continuous path: its decoder run by
ONNX Runtime (decoder.py), or the GGUF it was imported from by OpenVINO (paged_decoder.py),
its `tokenizer.json` by Hugging Face's tokenizers (the same ids
as ORT GenAI's tokenizer on the bundled model and SmolLM2, checked in the engine tier),
its chat template by Jinja (backends/chat_template.py), its constraints by llguidance,
and the step loop (loop.py). No `og.Model` is made: the weights load once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from inferwire.backends.chat_template import ChatTemplate
from inferwire.backends.ort_genai.continuous.decoder import Decoder
from inferwire.backends.ort_genai.continuous.guidance import (
    Grammars,
    refuse_minimum_with_constraint,
)
from inferwire.backends.ort_genai.continuous.loop import ContinuousLoop
from inferwire.backends.ort_genai.continuous.paged_decoder import PagedDecoder
from inferwire.backends.ort_genai.continuous.rows import LoopShape, RowSetup
from inferwire.backends.ort_genai.model import check_vocabulary, search_defaults
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.errors import ConfigurationError
from inferwire.core.facts import ModelLimits
from inferwire.core.kv_blocks import BlockLedger
from inferwire.core.prepared import prepare
from inferwire.core.requests import GenerationRequest

# Prompts up to this many characters are tokenized on the event loop (the other path's
# rule: a hop to a thread costs more than tokenizing them).
_INLINE_TOKENIZE_MAX_CHARS = 1024


@dataclass(frozen=True)
class ContinuousSettings:
    """How the path runs a model (the backend's options)."""

    slots: int  # requests decoding at once (the model's max_concurrency)
    slot_tokens: int  # each slot's prompt plus output
    threads: int  # ONNX Runtime's compute threads
    prefill_tokens: int
    stream_interval_s: float
    reuse_prompts: bool
    batch_invariant: bool
    name: str
    kv_blocks: BlockLedger | None = None  # where the slots' caches are reported (KV events)
    gguf: Path | None = None  # what OpenVINO runs with kernels openvino or both
    kernels: str = "onnxruntime"  # the backend option: onnxruntime, openvino or both


class ContinuousModel:
    """What the backend uses of a model loaded for the continuous path."""

    generates = True  # log-probabilities and constraints are its own

    def __init__(self, path: Path, config: dict[str, Any], settings: ContinuousSettings) -> None:
        self.name = settings.name
        model = config["model"]
        eos = model.get("eos_token_id", [])
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.vocab_size = int(model["vocab_size"])
        self.context_length = min(int(model["context_length"]), settings.slot_tokens)
        self.search_defaults: dict[str, Any] = dict(config.get("search", {}))
        tokenizer_file = path / "tokenizer.json"
        try:
            tokenizer_json = tokenizer_file.read_text(encoding="utf-8")
            self.tokenizer = Tokenizer.from_str(tokenizer_json)
        except (OSError, UnicodeDecodeError, Exception) as exc:
            raise ConfigurationError(f"{tokenizer_file}: cannot be read: {exc}") from None
        self.template = _chat_template(path)
        self.chat_template = _template_source(path)
        self.grammars = Grammars(tokenizer_json, self.vocab_size, self.eos_token_ids)
        size = (config, settings.threads, settings.slots, settings.slot_tokens)
        self.decoder: Decoder | PagedDecoder
        batch_decoder = None  # kernels: both: OpenVINO's beside ONNX Runtime's (loop.py)
        if settings.kernels == "openvino":
            assert settings.gguf is not None
            self.decoder = PagedDecoder(settings.gguf, *size)
        else:
            self.decoder = Decoder(path, *size)
            if settings.kernels == "both":
                assert settings.gguf is not None
                batch_decoder = PagedDecoder(settings.gguf, *size)
        shape = LoopShape(
            settings.slots,
            settings.slot_tokens,
            settings.prefill_tokens,
            settings.name,
            settings.stream_interval_s,
            settings.batch_invariant,
        )
        self.loop = ContinuousLoop(
            self.decoder,
            self.tokenizer,
            self.grammars,
            self.eos_token_ids,
            shape,
            settings.reuse_prompts,
            settings.kv_blocks,
            batch_decoder,
        )
        self._kv_blocks = settings.kv_blocks
        self.kernels = {"openvino": "OpenVINO", "both": "ONNX Runtime and OpenVINO"}.get(
            settings.kernels, "ONNX Runtime"
        )

    def sampling_defaults(self) -> dict[str, Any]:
        """What an unset parameter means: the og paths' defaults, and the `search` block's
        repetition penalty, which this path's sampler applies itself."""
        search = self.search_defaults
        repetition = float(search.get("repetition_penalty", 1.0))
        return {**search_defaults(search), "repetition_penalty": repetition}

    def health(self, device: str) -> tuple[bool, str]:
        loop, shape = self.loop, self.loop.shape
        if not loop.alive:
            return False, f"continuous batching loop stopped: {loop.failure}"
        return True, (
            f"in-process on {device}, continuous batching of {shape.slots} slots of "
            f"{shape.slot_tokens} tokens ({self.kernels}, {self.decoder.threads} threads)"
        )

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The template's prompt for Hugging Face's message (and tool) objects."""
        assert self.template is not None  # the backend checks `chat_template` first
        return self.template.render_with(messages, tools)

    async def stream(
        self,
        request: GenerationRequest,
        progress: GenerationProgress,
        limits: ModelLimits,
        adapter: str = "",
    ) -> GenerationEvents:
        """Prepare `request` (its constraint compiled first) and run it on the loop."""
        refuse_minimum_with_constraint(request, self.name)
        constraint, matcher = request.params.constraint, None
        if constraint is not None:
            matcher = await asyncio.to_thread(self.grammars.matcher, constraint)
        setup = RowSetup(matcher, adapter, constraint.field if constraint is not None else "")
        prepared = await prepare(request, progress, self.encode, self.name, limits, setup)
        return self.loop.stream(prepared, progress)

    def add_adapter(self, key: str, file: Path) -> None:
        """Load a LoRA adapter (ONNX Runtime's AdapterFormat) under `key` (blocking), and
        read one token with it, so a file made for another model fails here."""
        self.decoder.add_adapter(key, file)
        try:
            self.decoder.probe(key)
        except BaseException:
            self.decoder.remove_adapter(key)
            raise

    def remove_adapter(self, key: str) -> None:
        """Once no request of the adapter is in flight (the core unloads it then)."""
        self.decoder.remove_adapter(key)
        if self._kv_blocks is not None:
            self._kv_blocks.drop(key)  # its slots' caches are never read again

    async def encode(self, text: str) -> list[int]:
        if len(text) <= _INLINE_TOKENIZE_MAX_CHARS:
            return list(self.tokenizer.encode(text).ids)
        encoding = await asyncio.to_thread(self.tokenizer.encode, text)
        return list(encoding.ids)

    async def decode(self, token_ids: Sequence[int]) -> str:
        check_vocabulary(token_ids, self.vocab_size)
        return str(self.tokenizer.decode(list(token_ids)))

    def close(self) -> None:
        self.loop.close()
        if self._kv_blocks is not None:
            self._kv_blocks.clear()  # the slots' caches went with the loop


def _template_source(path: Path) -> str | None:
    config_file = path / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    template = json.loads(config_file.read_text()).get("chat_template")
    return template if isinstance(template, str) and template else None


def _chat_template(path: Path) -> ChatTemplate | None:
    if _template_source(path) is None:
        return None
    return ChatTemplate.load(str(path / "tokenizer_config.json"))
