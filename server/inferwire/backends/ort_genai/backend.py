"""The embedded ONNX Runtime GenAI backend (the default).

Runs a model directory in ORT GenAI format (`genai_config.json`, `model.onnx`,
`tokenizer.json`) in-process, on the CPU or, with `onnxruntime-genai-cuda`
installed, on a CUDA GPU. Two paths run requests (option `batching`):

- `engine`: one `og.Engine` per model batches concurrent requests, driven by one
  scheduler thread (`engine.py`, which records what the engine can do), in this process
  or, with `engine_process`, in one of its own (`engine_process.py`);
- `per_request`: each request runs its own `og.Generator` in a worker thread
  (`generator.py`).

This module prepares each request (tokenizes it, checks it fits the context window,
maps its sampling settings) and hands it to one of the two paths.

The default, `auto`, takes the engine only for a model whose engine does continuous
batching (a paged-KV export with `engine.dynamic_batching`; today a CUDA export). On a
CPU model the engine batches statically, and measured on the bundled model that costs
short requests 3x their latency behind long ones and makes greedy output depend on the
batch a request lands in, for no throughput gain on two cores
(docs/ort_genai_batching.md); `batching: engine` still chooses it.

With `engine`, requests the engine cannot serve as asked still take the per-request
path: log-probabilities and output constraints (the generator's features), and a
seed on a static-batching engine (which refuses per-request seeds); and so does a
request in a reserved slot (core/reserve.py) on a static engine, so that it need not
wait for the running batch to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from inferwire.backends.ort_genai.adapter import OrtGenAIAdapter, OrtGenAIAdapterOptions
from inferwire.backends.ort_genai.engine import EngineScheduler, EngineSettings
from inferwire.backends.ort_genai.engine_process import EngineProcess
from inferwire.backends.ort_genai.generator import GeneratorPath
from inferwire.backends.ort_genai.model import (
    LoadedModel,
    estimate_footprint,
    is_dynamic_batching,
    load_model,
    read_config,
)
from inferwire.backends.ort_genai.sampling import PathRequest
from inferwire.core.backend import (
    Backend,
    BackendOptions,
    GenerationEvents,
    GenerationProgress,
)
from inferwire.core.chat import ChatMessage, Tool, ToolSyntax
from inferwire.core.errors import (
    ConfigurationError,
    FieldViolation,
    InvalidArgumentError,
    ModelNotReadyError,
)
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.memory import Footprint
from inferwire.core.prepared import prepare
from inferwire.core.requests import GenerationRequest
from inferwire.core.status import BackendHealth
from inferwire.core.tool_syntax import template_syntax
from inferwire.core.tools import hf_messages, hf_tools

log = logging.getLogger(__name__)

BUILTIN_MODEL = "builtin"

# ORT GenAI takes the seed as a signed 32-bit int; folding larger seeds would
# silently make two seeds sample alike, so they are refused instead.
_MAX_SEED = 2**31 - 1


class OrtGenAIOptions(BackendOptions):
    """`options` for a model served by the onnxruntime-genai backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str = BUILTIN_MODEL
    """Model directory in ORT GenAI format, or 'builtin' for the bundled demo model."""

    device: Literal["cpu", "cuda"] = "cpu"
    """cpu, or cuda (needs the onnxruntime-genai-cuda package)."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Largest max_tokens a request may ask for (default: context length)."""

    batching: Literal["auto", "engine", "per_request"] = "auto"
    """engine: concurrent requests share og.Engine's batched steps; per_request: each
    request runs its own og.Generator; auto: engine when the model does continuous batching
    (engine.dynamic_batching in genai_config.json), else per_request."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """With batching: engine, the most requests in one batch (default: the model's
    max_concurrency)."""

    static_batch_steps: int = Field(default=32, ge=0)
    """With batching: engine on a static-batching engine (every CPU model), the steps a
    batch runs while other requests wait before its rows are preempted (begun again, prompt
    plus their tokens so far, together with the waiting ones). Waiting requests that would
    at least double the batch preempt it at once. 0: a batch always runs to its end."""

    engine_process: bool = False
    """With batching: engine, run the engine's scheduler in a process of its own, so that
    its steps never wait for the event loop's GIL (engine_process.py); the model loads in
    both processes (its weights count twice in the memory estimate)."""

    stream_interval_ms: float = Field(default=2.0, ge=0, le=1000)
    """The least time between two hand-overs of a stream's text from the thread generating
    it to the server's event loop: tokens made meanwhile go out as one message, which spares
    the loop a wake-up, a GIL hand-over and a write per token (docs/performance.md). A
    stream's first token and its end go at once; 0: every token. 2 against 1: 0.90 -> 0.97
    of og.Engine's tokens/s for one stream, 0.73 -> 0.79 at 16 (bench notebook)."""


def builtin_model_path() -> Path:
    return Path(str(resources.files("inferwire") / "models" / "demo"))


@dataclass(frozen=True)
class _Loaded:
    """Everything a loaded model holds; None on the backend while it is not loaded."""

    model: LoadedModel
    per_request: GeneratorPath
    # With batching: engine (or auto on a dynamic model), in this process or its own.
    engine: EngineScheduler | EngineProcess | None


class OrtGenAIBackend(Backend):
    """A model run in-process by ONNX Runtime GenAI."""

    name = "onnxruntime-genai"
    options_type = OrtGenAIOptions
    adapter_options_type = OrtGenAIAdapterOptions
    adapter_source_option = "adapter_file"
    options: OrtGenAIOptions
    _loaded: _Loaded | None = None  # set by load(), cleared by unload()

    @property
    def model_path(self) -> Path:
        if self.options.path == BUILTIN_MODEL:
            return builtin_model_path()
        return Path(self.options.path).expanduser()

    @property
    def stream_interval_s(self) -> float:
        return self.options.stream_interval_ms / 1e3

    @property
    def _state(self) -> _Loaded:
        if self._loaded is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        return self._loaded

    def footprint(self) -> Footprint | None:
        """Estimated from the folder (see estimate_footprint); None when it cannot be read,
        for the load to report why."""
        path = self.model_path
        try:
            config = json.loads((path / "genai_config.json").read_text())
            copies = 2 if self._batched(config) and self.options.engine_process else 1
            return estimate_footprint(
                path, config, self.options.device, self.max_concurrency, copies
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def adapter(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> Backend:
        return OrtGenAIAdapter(model_name, options, max_concurrency, self)

    def loaded_model(self) -> LoadedModel | None:
        return None if self._loaded is None else self._loaded.model

    async def load(self) -> ModelFacts:
        path, device = self.model_path, self.options.device
        config = read_config(path, device)
        batched, dynamic = self._batched(config), is_dynamic_batching(config)
        if dynamic and not batched:
            # Seen on an H200 (docs/performance.md, "On a GPU"): og.Generator fails every
            # step of a paged-KV export ("Invalid rank for input: input_ids").
            raise ConfigurationError(
                f"options.batching is {self.options.batching!r}, but {path} is a paged-KV "
                "export (engine.dynamic_batching in genai_config.json), which only og.Engine "
                "runs: use batching 'auto' or 'engine'"
            )
        max_batch_size = self.options.max_batch_size or self.max_concurrency
        static_batch_size = max_batch_size if batched and not dynamic else None
        model = await asyncio.to_thread(load_model, path, config, device, static_batch_size)
        engine: EngineScheduler | EngineProcess | None = None
        if batched:
            settings = EngineSettings(
                max_batch_size,
                self.options.static_batch_steps,
                self.model_name,
                self.stream_interval_s,
            )
            if self.options.engine_process:
                engine = await asyncio.to_thread(
                    EngineProcess, path, device, static_batch_size, settings
                )
            else:
                engine = await asyncio.to_thread(EngineScheduler, model, settings)
        per_request = GeneratorPath(
            model, self.max_concurrency, self.model_name, stream_interval_s=self.stream_interval_s
        )
        self._loaded = _Loaded(model, per_request, engine)
        log.info(
            "model loaded", extra={"model": self.model_name, "path": str(path), "device": device}
        )
        return self._facts_of(model)

    def _batched(self, config: dict[str, Any]) -> bool:
        batching = self.options.batching
        return batching == "engine" or (batching == "auto" and is_dynamic_batching(config))

    def _facts_of(self, model: LoadedModel) -> ModelFacts:
        context_length = model.context_length
        max_output = min(self.options.max_output_tokens or context_length, context_length)
        limits = ModelLimits(context_length, max_output, max_seed=_MAX_SEED)
        chat = model.chat_template is not None
        # Log-probabilities and constraints are og.Generator's; a paged-KV export runs on
        # og.Engine alone (an og.Generator step fails on it), so the core refuses them
        # naming the field, and tool calls are parsed and checked instead of constrained.
        generator = not model.dynamic_batching
        capabilities = Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=limits.context_length,
            max_output_tokens=limits.max_output_tokens,
            chat=chat,
            logprobs=generator,
            constrained_output=generator,
            tools=chat,
            tools_constrained=chat and generator,  # llguidance decodes calls under their grammar
        )
        return self.loaded_facts(limits, capabilities, model.sampling_defaults())

    async def unload(self) -> None:
        loaded, self._loaded, self.facts = self._loaded, None, None
        if loaded is None:
            return
        if loaded.engine is not None:
            await asyncio.to_thread(loaded.engine.close)
        await asyncio.to_thread(loaded.per_request.close)

    async def health(self) -> BackendHealth:
        loaded = self._loaded
        if loaded is None:
            return BackendHealth(False, "engine not loaded")
        engine = loaded.engine
        if engine is not None and not engine.alive:
            return BackendHealth(False, f"engine scheduler stopped: {engine.failure}")
        where = "engine process" if isinstance(engine, EngineProcess) else "in-process"
        return BackendHealth(True, f"{where} on {self.options.device}, {_path_description(engine)}")

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        model = self._state.model
        if model.chat_template is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no chat template: add a `chat_template` to "
                "tokenizer_config.json in its folder (options.path), or send a prompt"
            )
        # JSON carries any role and content text through to the template unchanged.
        encoded = json.dumps([{"role": m.role, "content": m.content} for m in messages])
        return self._apply_template(encoded, None)

    def render_chat_with_tools(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> str | None:
        # A template that renders `tools` and asks for calls in a syntax the grammar and
        # the parser know (Hermes / Qwen, Llama 3 JSON, Mistral: core/tool_syntax.py).
        syntax = template_syntax(self._state.model.chat_template)
        if syntax is None:
            return None
        encoded = json.dumps(hf_messages(messages, syntax))
        return self._apply_template(encoded, json.dumps(hf_tools(tools)))

    def tool_syntax(self) -> ToolSyntax:
        return template_syntax(self._state.model.chat_template) or ToolSyntax.HERMES

    def _apply_template(self, messages: str, tools: str | None) -> str:
        model = self._state.model
        try:
            if tools is None:
                rendered = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            else:
                rendered = model.tokenizer.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=True
                )
            return str(rendered)
        except RuntimeError as exc:
            raise InvalidArgumentError(
                [
                    FieldViolation(
                        "messages",
                        f"the chat template of model {self.model_name!r} refused them: {exc}",
                    )
                ]
            ) from None

    async def tokenize(self, text: str) -> list[int]:
        return await self._state.model.encode(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return await self._state.model.decode(token_ids)

    async def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        loaded = self._state
        prepared = await self.prepare(loaded.model, request, progress)
        engine = loaded.engine
        served = engine is not None and engine.serves(request.params, request.reserved)
        path = engine if served else None
        events = (path or loaded.per_request).stream(prepared, progress)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def prepare(
        self, model: LoadedModel, request: GenerationRequest, progress: GenerationProgress
    ) -> PathRequest:
        """The request as a path takes it: refused here if the model cannot serve it."""
        self._refuse_logprobs_with_constraint(request)
        self._refuse_minimum_with_constraint(request)
        assert self.facts is not None  # set with the model by `load`
        sampling = model.sampling(request.params)
        return await prepare(
            request, progress, model.encode, self.model_name, self.facts.limits, sampling
        )

    def _refuse_minimum_with_constraint(self, request: GenerationRequest) -> None:
        # llguidance ends a constrained output with the end-of-sequence token once the
        # output is complete, whatever min_length masks (measured on onnxruntime-genai 0.18:
        # a regex output ended after 9 tokens with min_length 20), so a minimum length
        # cannot hold; refused rather than silently not honoured.
        constraint = request.params.constraint
        if constraint is None or (field := _minimum_field(request)) is None:
            return
        raise InvalidArgumentError(
            [
                FieldViolation(
                    field,
                    f"model {self.model_name!r} ends a constrained output when it is "
                    f"complete; it cannot hold a minimum length ({constraint.field} is set)",
                )
            ]
        )

    def _refuse_logprobs_with_constraint(self, request: GenerationRequest) -> None:
        # llguidance masks the logits inside the engine's sampling step and does not expose
        # the mask, so the distribution a constrained token was chosen from is unknown here.
        if request.params.logprobs and request.params.constraint is not None:
            raise InvalidArgumentError(
                [
                    FieldViolation(
                        "parameters.logprobs",
                        f"model {self.model_name!r} cannot return log-probabilities for a "
                        f"constrained request ({request.params.constraint.field} is set)",
                    )
                ]
            )


def _minimum_field(request: GenerationRequest) -> str | None:
    """The field that asks for a minimum length, if any: ignore_eos, else min_tokens."""
    if request.params.ignore_eos:
        return "parameters.ignore_eos"
    if request.params.min_tokens:
        return "parameters.min_tokens"
    return None


def _path_description(engine: EngineScheduler | EngineProcess | None) -> str:
    """Which path serves requests, for operators reading Health and ListModels."""
    if engine is None:
        return "a generator per request"
    kind = "continuous" if engine.dynamic else "static"
    description = f"og.Engine {kind} batching of up to {engine.max_batch_size}"
    if not engine.dynamic and engine.step_width < engine.max_batch_size:
        description += f", {engine.step_width} rows a step"
    return description
