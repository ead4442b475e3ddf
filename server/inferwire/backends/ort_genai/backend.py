"""The embedded ONNX Runtime GenAI backend (the default).

Runs a model directory in ORT GenAI format (`genai_config.json`, `model.onnx`,
`tokenizer.json`) in-process. Two kinds of path serve it (option `batching`):

- on the CPU, the continuous path (continuous/): the model's ONNX graph run by ONNX Runtime
  itself, every request in one session's steps, its sampling, log-probabilities and
  constraints (llguidance) in inferwire, a slot's KV kept for a conversation's next turn;
- ONNX Runtime GenAI's own objects (og_paths.py): `og.Engine`, which batches a paged-KV
  export continuously on CUDA, or an `og.Generator` per request.

`auto`, the default, is the continuous path on the CPU, and og.Engine on CUDA for a model
that batches continuously there (else a generator per request). The bench notebook has
the measurements that retired the og paths from the CPU's default (docs/performance.md).

This module loads the model on its path, reports its facts and renders its chat; each
path prepares its requests (core/prepared.py) and runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from inferwire.backends.ort_genai.adapter import OrtGenAIAdapter, OrtGenAIAdapterOptions
from inferwire.backends.ort_genai.continuous.decoder import read_layout
from inferwire.backends.ort_genai.continuous.model import ContinuousModel, ContinuousSettings
from inferwire.backends.ort_genai.continuous.paged_decoder import imported_gguf
from inferwire.backends.ort_genai.model import estimate_footprint, is_dynamic_batching, read_config
from inferwire.backends.ort_genai.og_paths import OgServed, OgSettings, og_chat
from inferwire.backends.ort_genai.options import BUILTIN_MODEL, OrtGenAIOptions
from inferwire.core.backend import Backend, GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage, Tool, ToolSyntax
from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits, PromptCacheStats
from inferwire.core.memory import Footprint, format_size
from inferwire.core.requests import GenerationRequest
from inferwire.core.sampling import BASE_PARAMETERS
from inferwire.core.status import BackendHealth
from inferwire.core.tool_syntax import template_syntax
from inferwire.core.tools import hf_messages, hf_tools

log = logging.getLogger(__name__)

# ORT GenAI takes the seed as a signed 32-bit int; folding larger seeds would
# silently make two seeds sample alike, so they are refused instead.
_MAX_SEED = 2**31 - 1
DEFAULT_SLOT_TOKENS = 2048
# The sampling parameters each kind of path takes (core/sampling.py).
CONTINUOUS_PARAMETERS = BASE_PARAMETERS | {
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "n",  # the core's choices (core/choices.py); the loop reads their prompt once
}

Served = OgServed | ContinuousModel


def builtin_model_path() -> Path:
    return Path(str(resources.files("inferwire") / "models" / "demo"))


class OrtGenAIBackend(Backend):
    """A model run in-process on ONNX Runtime (GenAI)."""

    name = "onnxruntime-genai"
    options_type = OrtGenAIOptions
    adapter_options_type = OrtGenAIAdapterOptions
    adapter_source_option = "adapter_file"
    options: OrtGenAIOptions
    _served: Served | None = None  # set by load(), cleared by unload()

    @property
    def model_path(self) -> Path:
        if self.options.path == BUILTIN_MODEL:
            return builtin_model_path()
        return Path(self.options.path).expanduser()

    @property
    def stream_interval_s(self) -> float:
        return self.options.stream_interval_ms / 1e3

    @property
    def continuous(self) -> bool:
        """Whether the continuous path serves the model (see the module's docstring)."""
        batching = self.options.batching
        return batching == "continuous" or (batching == "auto" and self.options.device == "cpu")

    @property
    def loaded(self) -> Served | None:
        """The model as loaded on its path; None while it is not."""
        return self._served

    @property
    def served(self) -> Served:
        if self._served is None:
            raise ModelNotReadyError(f"model {self.model_name!r} is not loaded")
        return self._served

    def footprint(self) -> Footprint | None:
        """Estimated from the folder; None when it cannot be read, for the load to say why.
        The continuous path's KV cache is its slots, allocated at load."""
        path = self.model_path
        try:
            config = json.loads((path / "genai_config.json").read_text())
            if not self.continuous:
                copies = 2 if self._engine(config) and self.options.engine_process else 1
                return estimate_footprint(
                    path, config, self.options.device, self.max_concurrency, copies
                )
            # With kernels: openvino the import's ONNX Runtime measurement stands: SmolLM2
            # on OpenVINO held 140 MB besides its KV cache, against the measured 254 MB.
            # With both, each decoder holds its weights and a KV cache of every slot.
            base = estimate_footprint(path, config, "cpu", 0, continuous=True)
            slot_tokens = self._slot_tokens(config)
            kv = read_layout(path).kv_bytes_per_token(np.dtype(np.float32)) * slot_tokens
            kv *= self.max_concurrency + 1  # and the decoder's spare row (continuous/loop.py)
            copies = 2 if self.options.kernels == "both" else 1
            detail = (
                f"{base.detail.split(' + ')[0]}{' x 2' * (copies - 1)} + KV cache "
                f"{format_size(kv)}{' x 2' * (copies - 1)} ({self.max_concurrency} slots "
                f"and a spare row x {slot_tokens} tokens)"
            )
            return Footprint("cpu", copies * (base.amount + kv), detail=detail)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def adapter(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> Backend:
        return OrtGenAIAdapter(model_name, options, max_concurrency, self)

    async def load(self) -> ModelFacts:
        path, device = self.model_path, self.options.device
        config = read_config(path, device)
        served: Served
        if self.continuous:
            if device != "cpu" or is_dynamic_batching(config):
                raise ConfigurationError(
                    "options.batching is 'continuous', which runs a CPU export (device: cpu, "
                    f"no engine.dynamic_batching in genai_config.json); {path} is not one"
                )
            settings = self._settings(path, config)
            served = await asyncio.to_thread(ContinuousModel, path, config, settings)
        else:
            if self.options.kernels != "onnxruntime":
                raise ConfigurationError(
                    f"options.kernels is {self.options.kernels!r}, which runs the continuous "
                    f"path, and options.batching is {self.options.batching!r} on {device}"
                )
            served = await self._load_og(path, config)
        self._served = served
        log.info(
            "model loaded", extra={"model": self.model_name, "path": str(path), "device": device}
        )
        return self._facts_of(served)

    def _settings(self, path: Path, config: dict[str, Any]) -> ContinuousSettings:
        gguf, kernels = None, self.options.kernels
        if kernels != "onnxruntime":
            try:
                import openvino_genai  # noqa: F401
            except ImportError:
                raise ConfigurationError(
                    f"options.kernels is {kernels!r}, and OpenVINO is not installed: "
                    "pip install 'inferwire[openvino]'"
                ) from None
            gguf = Path(self.options.gguf).expanduser() if self.options.gguf else None
            gguf = gguf or imported_gguf(path)
            if not gguf.is_file():
                raise ConfigurationError(f"options.gguf: {gguf} is not a file")
        return ContinuousSettings(
            gguf=gguf,
            kernels=kernels,
            slots=self.max_concurrency,
            slot_tokens=self._slot_tokens(config),
            threads=self.options.threads or len(os.sched_getaffinity(0)),
            prefill_tokens=self.options.prefill_tokens,
            stream_interval_s=self.stream_interval_s,
            reuse_prompts=self.options.prompt_cache,
            batch_invariant=self.options.batch_invariant,
            name=self.model_name,
            kv_blocks=self.kv_blocks,
        )

    def _slot_tokens(self, config: dict[str, Any]) -> int:
        context = int(config["model"]["context_length"])
        return min(self.options.slot_tokens or min(context, DEFAULT_SLOT_TOKENS), context)

    async def _load_og(self, path: Path, config: dict[str, Any]) -> OgServed:
        batched, dynamic = self._engine(config), is_dynamic_batching(config)
        if dynamic and not batched:
            # Seen on an H200 (docs/performance.md, "On a GPU"): og.Generator fails every
            # step of a paged-KV export ("Invalid rank for input: input_ids").
            raise ConfigurationError(
                f"options.batching is {self.options.batching!r}, but {path} is a paged-KV "
                "export (engine.dynamic_batching in genai_config.json), which only og.Engine "
                "runs: use batching 'auto' or 'engine'"
            )
        settings = OgSettings(
            device=self.options.device,
            batched=batched,
            max_batch_size=self.options.max_batch_size or self.max_concurrency,
            static_batch_steps=self.options.static_batch_steps,
            engine_process=self.options.engine_process,
            max_concurrency=self.max_concurrency,
            stream_interval_s=self.stream_interval_s,
            name=self.model_name,
        )
        return await OgServed.load(path, config, settings)

    def _engine(self, config: dict[str, Any]) -> bool:
        batching = self.options.batching
        return batching == "engine" or (batching == "auto" and is_dynamic_batching(config))

    def _facts_of(self, served: Served) -> ModelFacts:
        context_length = served.context_length
        max_output = min(self.options.max_output_tokens or context_length, context_length)
        continuous = isinstance(served, ContinuousModel)
        limits = ModelLimits(context_length, max_output, max_seed=None if continuous else _MAX_SEED)
        chat = served.chat_template is not None
        # A paged-KV export runs on og.Engine alone, without a generator's logprobs or
        # constraints: the core refuses them naming the field, and tool calls are parsed
        # and checked instead of constrained.
        generates = served.generates
        capabilities = Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=limits.context_length,
            max_output_tokens=limits.max_output_tokens,
            chat=chat,
            logprobs=generates,
            constrained_output=generates,
            tools=chat,
            tools_constrained=chat and generates,  # llguidance decodes calls under their grammar
            parameters=CONTINUOUS_PARAMETERS if continuous else BASE_PARAMETERS,
        )
        return self.loaded_facts(limits, capabilities, served.sampling_defaults())

    async def unload(self) -> None:
        served, self._served, self.facts = self._served, None, None
        if served is not None:
            await asyncio.to_thread(served.close)

    async def health(self) -> BackendHealth:
        if self._served is None:
            return BackendHealth(False, "engine not loaded")
        return BackendHealth(*self._served.health(self.options.device))

    def prompt_cache(self) -> PromptCacheStats | None:
        served = self._served
        return served.loop.cache_stats() if isinstance(served, ContinuousModel) else None

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        served = self.served
        if served.chat_template is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no chat template: add a `chat_template` to "
                "tokenizer_config.json in its folder (options.path), or send a prompt"
            )
        return served.render(og_chat(messages), None)

    def render_chat_with_tools(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> str | None:
        # A template that renders `tools` and asks for calls in a syntax the grammar and
        # the parser know (Hermes / Qwen, Llama 3 JSON, Mistral: core/tool_syntax.py).
        syntax = template_syntax(self.served.chat_template)
        if syntax is None:
            return None
        return self.served.render(hf_messages(messages, syntax), hf_tools(tools))

    def tool_syntax(self) -> ToolSyntax:
        return template_syntax(self.served.chat_template) or ToolSyntax.HERMES

    async def tokenize(self, text: str) -> list[int]:
        return await self.served.encode(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return await self.served.decode(token_ids)

    async def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        assert self.facts is not None  # set with the model by `load`
        events = await self.served.stream(request, progress, self.facts.limits)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
