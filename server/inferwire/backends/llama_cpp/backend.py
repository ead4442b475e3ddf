"""The embedded llama.cpp backend: a GGUF file served in-process with continuous batching.

ONNX Runtime GenAI batches continuously only with a paged-KV export, which its builder
makes for CUDA alone; on the CPU each request gets its own generator (or a static batch).
llama.cpp puts every running request's next token into one forward pass on the CPU, so
this backend is the CPU choice for concurrent traffic and multi-turn chat
(docs/llama_cpp.md has the measurements). The GGUF file is served as it is, no import.

This module prepares each request (tokenizes it, checks it fits a slot, maps its
sampling) and hands it to the step loop thread (`step_loop.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import ConfigDict, Field

from inferwire.backends.chat_template import ChatTemplate
from inferwire.backends.llama_cpp.model import ContextShape, GgufModel
from inferwire.backends.llama_cpp.sampling import MAX_SEED, ChainSettings
from inferwire.backends.llama_cpp.step_loop import LlamaStepLoop
from inferwire.core.backend import Backend, BackendOptions, GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ModelNotReadyError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits, PromptCacheStats
from inferwire.core.memory import Footprint
from inferwire.core.prepared import prepare
from inferwire.core.requests import GenerationRequest
from inferwire.core.status import BackendHealth

log = logging.getLogger(__name__)
MIB = 1024 * 1024


class LlamaCppOptions(BackendOptions):
    """`options` for a model served by the llama-cpp backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str
    """The GGUF file."""

    slot_tokens: int = Field(default=2048, ge=16)
    """Each slot's context (prompt plus output); the KV cache holds max_concurrency of them."""

    threads: int | None = Field(default=None, ge=1)
    """Compute threads (default: the CPUs this process may use)."""

    batch_tokens: int = Field(default=2048, ge=16)
    """The most tokens one decode step takes: every running request's next token, and
    chunks of prompts being read in the room left (llama-server's --batch-size)."""

    prefill_tokens: int = Field(default=256, ge=1)
    """The most prompt tokens one step reads, the earliest request's first: prompts that
    arrive together get their first tokens one after another, not all after the last
    (at most batch_tokens)."""

    repetition_penalty: float = Field(default=1.0, gt=0)
    """Penalty on tokens already in the sequence, prompt included (1: none)."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Largest max_tokens a request may ask for (default: slot_tokens)."""

    prompt_cache: bool = True
    """Whether a request reads the prefix its prompt shares with a slot's cached tokens from
    the cache instead of computing it (llama-server's cache_prompt). Greedy output can
    differ in rare near-ties between the two (docs/llama_cpp.md)."""

    prompt_cache_ram_mib: int = Field(default=1024, ge=0)
    """Host memory for conversations saved from the slots when a slot is given to another
    one, restored when they come back (llama-server's --cache-ram, 8192 there); 0: off.
    Counted in the model's memory footprint."""

    chat_template: str | None = None
    """A chat template to use instead of the GGUF's own (a tokenizer_config.json or a Jinja
    file)."""

    stream_interval_ms: float = Field(default=2.0, ge=0, le=1000)
    """The least time between two hand-overs of text from the step loop thread to the event
    loop (as the onnxruntime-genai backend's option, and its default: at 1 ms a small model
    paid a hand-over per token, docs/llama_cpp.md)."""


class LlamaCppBackend(Backend):
    """A GGUF model run in-process by llama.cpp."""

    name = "llama-cpp"
    options_type = LlamaCppOptions
    options: LlamaCppOptions
    _model: GgufModel | None = None
    _step_loop: LlamaStepLoop | None = None
    _template: ChatTemplate | None = None

    @property
    def model_path(self) -> Path:
        return Path(self.options.path).expanduser()

    def _shape(self) -> ContextShape:
        threads = self.options.threads or len(os.sched_getaffinity(0))
        # Every slot's next token fits in one step, whatever batch_tokens says.
        batch = max(self.options.batch_tokens, self.max_concurrency)
        prefill = min(self.options.prefill_tokens, batch)
        return ContextShape(self.max_concurrency, self.options.slot_tokens, threads, batch, prefill)

    def footprint(self) -> Footprint | None:
        """The file (weights are mapped) and a KV cache of max_concurrency slots, estimated
        at 32 KiB a token until the model is read (SmolLM2-135M's is 23 KiB)."""
        try:
            size = self.model_path.stat().st_size
        except OSError:
            return None
        shape = self._shape()
        kv = shape.slots * shape.slot_tokens * 32 * 1024
        detail = f"GGUF file + KV cache of {shape.slots} x {shape.slot_tokens} tokens"
        saved = self.options.prompt_cache_ram_mib * MIB if self.options.prompt_cache else 0
        if saved:
            detail += f" + {self.options.prompt_cache_ram_mib} MiB of saved conversations"
        return Footprint("cpu", size + kv + saved, detail=detail)

    async def load(self) -> ModelFacts:
        model = await asyncio.to_thread(GgufModel, self.model_path)
        try:
            template = self._chat_template(model)
            shape = self._shape()
            interval = self.options.stream_interval_ms / 1e3
            step_loop = await asyncio.to_thread(
                LlamaStepLoop,
                model,
                shape,
                self.model_name,
                interval,
                self.options.prompt_cache,
                self.options.prompt_cache_ram_mib * MIB,
                self.kv_blocks,
            )
        except BaseException:
            model.close()
            raise
        self._model, self._step_loop, self._template = model, step_loop, template
        log.info(
            "model loaded",
            extra={"model": self.model_name, "path": str(model.path), "slots": shape.slots},
        )
        slot = self.options.slot_tokens
        max_output = min(self.options.max_output_tokens or slot, slot)
        limits = ModelLimits(slot, max_output, max_seed=MAX_SEED)
        capabilities = Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            context_length=slot,
            max_output_tokens=max_output,
            chat=template is not None,
            # Calls parsed from the output and checked against their schemas (core/tools.py):
            # llama.cpp's grammars are not driven from JSON schemas here, so not constrained.
            tools=template is not None,
        )
        # A GGUF carries no generation defaults: unset, a request is greedy, as the ORT
        # GenAI import of the same file is (`do_sample: false`).
        return self.loaded_facts(limits, capabilities, {"temperature": 0.0})

    def _chat_template(self, model: GgufModel) -> ChatTemplate | None:
        if self.options.chat_template is not None:
            return ChatTemplate.load(self.options.chat_template)
        source = model.metadata("tokenizer.chat_template")
        if source is None:
            return None
        bos, eos = model.token_text(model.bos_token), model.token_text(model.eos_token)
        return ChatTemplate.compile(source, model.path, bos, eos)

    async def unload(self) -> None:
        model, step_loop = self._model, self._step_loop
        self._model = self._step_loop = self._template = None
        self.facts = None
        if step_loop is not None:
            await asyncio.to_thread(step_loop.close)
            if self.kv_blocks is not None:
                self.kv_blocks.clear()  # the slots' and saved caches went with the loop
        if model is not None:
            model.close()

    async def health(self) -> BackendHealth:
        step_loop = self._step_loop
        if step_loop is None:
            return BackendHealth(False, "model not loaded")
        if not step_loop.alive:
            return BackendHealth(False, f"llama.cpp step loop stopped: {step_loop.failure}")
        shape = step_loop.shape
        return BackendHealth(
            True,
            f"in-process llama.cpp on the cpu, continuous batching of {shape.slots} slots "
            f"of {shape.slot_tokens} tokens, {shape.threads} threads",
        )

    def prompt_cache(self) -> PromptCacheStats | None:
        step_loop = self._step_loop
        return None if step_loop is None else step_loop.cache_stats()

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        if self._template is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no chat template: its GGUF file carries none; "
                "set options.chat_template, or send a prompt"
            )
        return self._template.render(messages)

    def _loaded(self) -> tuple[GgufModel, LlamaStepLoop]:
        if self._model is None or self._step_loop is None:
            raise ModelNotReadyError(f"model {self.model_name!r} is not loaded")
        return self._model, self._step_loop

    async def tokenize(self, text: str) -> list[int]:
        return self._loaded()[0].tokenize(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._loaded()[0].detokenize(list(token_ids))

    async def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        step_loop = self._loaded()[1]
        assert self.facts is not None
        settings = ChainSettings.of(
            request.params, self.options.repetition_penalty, self.options.slot_tokens
        )
        prepared = await prepare(
            request, progress, self.tokenize, self.model_name, self.facts.limits, settings
        )
        events = step_loop.stream(prepared, progress)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
