"""`onnxruntime-encoder`: an embedding model in the server's process, on ONNX Runtime.

It serves an encoder folder that `inferwire models import` made of a sentence-transformers
model (`make minilm`: all-MiniLM-L6-v2): Embed and `/v1/embeddings` (mean-pooled, and
normalized unless asked otherwise, as sentence-transformers' own pipeline), Rerank by the
cosine of the query's and each document's embeddings (core/backend.py's default for a
model that embeds), and Tokenize. It does not generate: the core refuses Infer on it,
naming its kind. Its requests' inputs run in padded batches on one step loop
(step_loop.py), whatever request they came from; `max_batch_inputs` and
`max_batch_tokens` bound a batch. Its memory is what the import measured: the load, and
the batch of the largest shape, which the load runs once so that ONNX Runtime's arena holds
it from the start.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from inferwire.backends.encoder.model import EncoderModel, cpus
from inferwire.backends.encoder.step_loop import EncoderStepLoop
from inferwire.core.backend import Backend, BackendOptions, GenerationProgress
from inferwire.core.embeddings import EncodingJob, EncodingProgress, Vector, kind_refusal
from inferwire.core.errors import ModelNotReadyError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.memory import Footprint, format_size
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import GenerationEnd, TextDelta
from inferwire.core.status import BackendHealth
from inferwire.core.tracing import TOKENIZE

IMPORT_PROVENANCE = "inferwire-import.json"  # importer/sentence_transformers.py writes it
# Inputs tokenized on the event loop; more go to a worker thread (the tokenizer takes them
# together there, off the loop).
INLINE_INPUTS = 8


class EncoderOptions(BackendOptions):
    """The `options` of an `onnxruntime-encoder` model."""

    path: str
    """The encoder folder (`inferwire models import` of a sentence-transformers model)."""
    threads: int | None = Field(default=None, ge=1)
    """ONNX Runtime's compute threads (default: the CPUs this process may use)."""
    max_batch_inputs: int = Field(default=32, ge=1)
    """The most inputs one batch runs (of one request or of many)."""
    max_batch_tokens: int = Field(default=4096, ge=16)
    """The most padded tokens (inputs x the longest of them) one batch runs; one input
    longer than that runs alone. The memory a model holds grows with it (a batch of 4096
    tokens of all-MiniLM-L6-v2 at its 256-token window: about 160 MiB)."""
    max_inputs: int = Field(default=2048, ge=1)
    """The most inputs one request may hold (its documents and query, for a rerank)."""


class EncoderBackend(Backend):
    """One encoder model and its step loop."""

    name = "onnxruntime-encoder"
    options_type = EncoderOptions
    options: EncoderOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        super().__init__(model_name, options, max_concurrency)
        self._model: EncoderModel | None = None
        self._loop: EncoderStepLoop | None = None

    @property
    def folder(self) -> Path:
        return Path(self.options.path).expanduser()

    def footprint(self) -> Footprint | None:
        """The import's measurement: the load, and a batch of the largest shape per padded
        token; None when the folder holds none (the load says why)."""
        try:
            measured = json.loads((self.folder / IMPORT_PROVENANCE).read_text())
            at_load = int(measured["load_rss_bytes"])
            per_token = float(measured["batch_rss_bytes_per_token"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        batch = int(per_token * self._batch_tokens())
        detail = (
            f"estimated: at load {format_size(at_load)} + a batch of "
            f"{self._batch_tokens()} tokens {format_size(batch)} (measured by the import)"
        )
        return Footprint("cpu", at_load + batch, detail=detail)

    def _batch_tokens(self) -> int:
        """The padded tokens of the batch that takes the most memory (EncoderModel's
        `largest_batch`: inputs as long as the window, as many as fit)."""
        window = self._model.window if self._model else self._window_on_disk()
        options = self.options
        return max(1, min(options.max_batch_inputs, options.max_batch_tokens // window)) * window

    def _window_on_disk(self) -> int:
        config = json.loads((self.folder / "encoder_config.json").read_text())
        return int(config["max_seq_length"])

    async def load(self) -> ModelFacts:
        options = self.options

        def open_model() -> EncoderModel:
            model = EncoderModel(self.folder, options.threads or cpus())
            model.warm_up(options.max_batch_inputs, options.max_batch_tokens)
            return model

        model = await asyncio.to_thread(open_model)
        loop = EncoderStepLoop(
            model, self.model_name, options.max_batch_inputs, options.max_batch_tokens
        )
        loop.start()
        self._model, self._loop = model, loop
        config = model.config
        capabilities = Capabilities(
            streaming=False,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            context_length=model.window,
            generation=False,
            embeddings=True,
            rerank=True,
            embedding_dimensions=config.hidden_size,
            parameters=frozenset(),
        )
        limits = ModelLimits(model.window, max_output_tokens=0, max_inputs=options.max_inputs)
        return self.loaded_facts(limits, capabilities)

    async def unload(self) -> None:
        loop, self._loop, self._model = self._loop, None, None
        if loop is not None:
            await asyncio.to_thread(loop.close)

    async def embed(self, job: EncodingJob, progress: EncodingProgress) -> list[Vector]:
        model, loop = self._loaded()
        with progress.tracer.span(TOKENIZE):
            if len(job.inputs) <= INLINE_INPUTS:
                inputs = model.prepare(job.inputs, job.fields, job.truncate)
            else:
                inputs = await asyncio.to_thread(
                    model.prepare, job.inputs, job.fields, job.truncate
                )
        progress.counted(prompt_tokens=sum(len(ids) for ids in inputs))
        normalize = model.config.normalize if job.normalize is None else job.normalize
        return await loop.run(inputs, normalize, progress)

    def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> AsyncGenerator[TextDelta | GenerationEnd, None]:
        raise kind_refusal(self.model_name, "an embedding model", "generate text")

    async def tokenize(self, text: str) -> list[int]:
        model, _ = self._loaded()
        return model.tokenize(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        model, _ = self._loaded()
        return str(model.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    async def health(self) -> BackendHealth:
        loop = self._loop
        if loop is None or not loop.alive:
            why = loop.failure if loop is not None else "not loaded"
            return BackendHealth(False, f"the encoder step loop is not running: {why}")
        return BackendHealth(True, "encoder ready")

    def kv_cache_usage(self) -> float | None:
        """An encoder keeps no KV cache between steps."""
        return 0.0

    def _loaded(self) -> tuple[EncoderModel, EncoderStepLoop]:
        if self._model is None or self._loop is None:
            raise ModelNotReadyError(f"model {self.model_name!r} is not loaded")
        return self._model, self._loop
