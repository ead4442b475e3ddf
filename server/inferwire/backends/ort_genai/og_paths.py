"""A model served by ONNX Runtime GenAI's own objects: `og.Model`, and one `og.Generator`
per request (generator.py) or one `og.Engine` batching them (engine.py, in this process or
in its own: engine_process.py). This is the path on CUDA, where og.Engine batches a
paged-KV export continuously; on the CPU the continuous path (continuous/) serves instead
unless `batching` asks for one of these.

With an engine, requests it cannot serve as asked still take a generator:
log-probabilities and output constraints (the generator's features), a seed on a
static-batching engine (which refuses per-request seeds), and a request in a reserved
slot (core/reserve.py) on a static engine, so that it need not wait for the running batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwire.backends.ort_genai.continuous.guidance import refuse_minimum_with_constraint
from inferwire.backends.ort_genai.engine import EngineSettings, EngineStepLoop
from inferwire.backends.ort_genai.engine_process import EngineProcess
from inferwire.backends.ort_genai.generator import GeneratorPath
from inferwire.backends.ort_genai.model import LoadedModel, is_dynamic_batching, load_model
from inferwire.backends.ort_genai.sampling import PathRequest
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.facts import ModelLimits
from inferwire.core.prepared import prepare
from inferwire.core.requests import GenerationRequest


@dataclass(frozen=True)
class OgSettings:
    """How the og paths run a model (the backend's options)."""

    device: str
    batched: bool  # og.Engine (else a generator per request)
    max_batch_size: int
    static_batch_steps: int
    engine_process: bool
    max_concurrency: int
    stream_interval_s: float
    name: str


@dataclass(frozen=True)
class OgServed:
    """An og.Model and its paths."""

    model: LoadedModel
    per_request: GeneratorPath
    # With batching: engine (or auto on a dynamic model), in this process or its own.
    engine: EngineStepLoop | EngineProcess | None
    name: str

    @classmethod
    async def load(cls, path: Path, config: dict[str, Any], settings: OgSettings) -> OgServed:
        dynamic = is_dynamic_batching(config)
        static_batch_size = settings.max_batch_size if settings.batched and not dynamic else None
        model = await asyncio.to_thread(
            load_model, path, config, settings.device, static_batch_size
        )
        engine: EngineStepLoop | EngineProcess | None = None
        if settings.batched:
            engine_settings = EngineSettings(
                settings.max_batch_size,
                settings.static_batch_steps,
                settings.name,
                settings.stream_interval_s,
            )
            if settings.engine_process:
                engine = await asyncio.to_thread(
                    EngineProcess, path, settings.device, static_batch_size, engine_settings
                )
            else:
                engine = await asyncio.to_thread(EngineStepLoop, model, engine_settings)
        per_request = GeneratorPath(
            model,
            settings.max_concurrency,
            settings.name,
            stream_interval_s=settings.stream_interval_s,
        )
        return cls(model, per_request, engine, settings.name)

    @property
    def chat_template(self) -> str | None:
        return self.model.chat_template

    @property
    def context_length(self) -> int:
        return self.model.context_length

    @property
    def generates(self) -> bool:
        """Whether og.Generators run it (their features: logprobs, constraints); a paged-KV
        export runs on og.Engine alone (an og.Generator step fails on it)."""
        return not self.model.dynamic_batching

    def sampling_defaults(self) -> dict[str, Any]:
        return self.model.sampling_defaults()

    def health(self, device: str) -> tuple[bool, str]:
        engine = self.engine
        if engine is not None and not engine.alive:
            return False, f"og.Engine step loop stopped: {engine.failure}"
        where = "engine process" if isinstance(engine, EngineProcess) else "in-process"
        return True, f"{where} on {device}, {_path_description(engine)}"

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The template's prompt for Hugging Face's message (and tool) objects."""
        tokenizer = self.model.tokenizer
        encoded = json.dumps(messages)
        try:
            if tools is None:
                rendered = tokenizer.apply_chat_template(encoded, add_generation_prompt=True)
            else:
                rendered = tokenizer.apply_chat_template(
                    encoded, tools=json.dumps(tools), add_generation_prompt=True
                )
            return str(rendered)
        except RuntimeError as exc:
            raise InvalidArgumentError(
                [
                    FieldViolation(
                        "messages",
                        f"the chat template of model {self.name!r} refused them: {exc}",
                    )
                ]
            ) from None

    async def encode(self, text: str) -> list[int]:
        return await self.model.encode(text)

    async def decode(self, token_ids: Sequence[int]) -> str:
        return await self.model.decode(token_ids)

    async def stream(
        self, request: GenerationRequest, progress: GenerationProgress, limits: ModelLimits
    ) -> GenerationEvents:
        prepared = await self.prepare(request, progress, limits)
        engine = self.engine
        if engine is not None and engine.serves(request.params, request.reserved):
            return engine.stream(prepared, progress)
        return self.per_request.stream(prepared, progress)

    async def prepare(
        self, request: GenerationRequest, progress: GenerationProgress, limits: ModelLimits
    ) -> PathRequest:
        """The request as a path takes it: refused here if the model cannot serve it."""
        _refuse_logprobs_with_constraint(request, self.name)
        refuse_minimum_with_constraint(request, self.name)
        sampling = self.model.sampling(request.params)
        return await prepare(request, progress, self.model.encode, self.name, limits, sampling)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.per_request.close()


def _refuse_logprobs_with_constraint(request: GenerationRequest, model: str) -> None:
    # llguidance masks the logits inside the engine's sampling step and does not expose
    # the mask, so the distribution a constrained token was chosen from is unknown here.
    if request.params.logprobs and request.params.constraint is not None:
        raise InvalidArgumentError(
            [
                FieldViolation(
                    "parameters.logprobs",
                    f"model {model!r} cannot return log-probabilities for a constrained "
                    f"request ({request.params.constraint.field} is set)",
                )
            ]
        )


def _path_description(engine: EngineStepLoop | EngineProcess | None) -> str:
    """Which path serves requests, for operators reading Health and ListModels."""
    if engine is None:
        return "a generator per request"
    kind = "continuous" if engine.dynamic else "static"
    description = f"og.Engine {kind} batching of up to {engine.max_batch_size}"
    if not engine.dynamic and engine.step_width < engine.max_batch_size:
        description += f", {engine.step_width} rows a step"
    return description


def og_chat(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Plain messages as templates take them (JSON carries any role and content through)."""
    return [{"role": m.role, "content": m.content} for m in messages]
