"""The embedded ONNX Runtime GenAI backend (the default).

Runs a model directory in ORT GenAI format (`genai_config.json`, `model.onnx`,
`tokenizer.json`) in-process, on the CPU or, with `onnxruntime-genai-cuda`
installed, on a CUDA GPU. Two paths run requests (option `batching`):

- `engine`: one `og.Engine` per model batches concurrent requests, driven by one
  scheduler thread (`engine.py`, which records what the engine can do);
- `per_request`: each request runs its own `og.Generator` in a worker thread
  (`generator.py`).

The default, `auto`, takes the engine only for a model whose engine does continuous
batching (a paged-KV export with `engine.dynamic_batching`; today a CUDA export). On a
CPU model the engine batches statically, and measured on the bundled model that costs
short requests 3x their latency behind long ones and makes greedy output depend on the
batch a request lands in, for no throughput gain on two cores
(docs/ort_genai_batching.md); `batching: engine` still chooses it.

With `engine`, requests the engine cannot serve as asked still take the per-request
path: log-probabilities and output constraints (the generator's features), and a
seed on a static-batching engine (which refuses per-request seeds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import onnxruntime_genai as og
from pydantic import Field

from inferwire.backends.ort_genai.engine import EngineScheduler
from inferwire.backends.ort_genai.generator import ModelDetails, generate
from inferwire.backends.ort_genai.logprobs import TokenTexts
from inferwire.core.backend import Backend, BackendOptions, GenerationEvents, GenerationRecord
from inferwire.core.errors import (
    ConfigurationError,
    FieldViolation,
    InvalidArgumentError,
    ModelNotReadyError,
)
from inferwire.core.generation import check_prompt_fits, coalesce_deltas
from inferwire.core.tracing import TOKENIZE
from inferwire.core.types import (
    BackendHealth,
    Capabilities,
    ChatMessage,
    GenerationEnd,
    GenerationParams,
    GenerationRequest,
    ModelLimits,
    TextDelta,
)

log = logging.getLogger(__name__)

BUILTIN_MODEL = "builtin"

# How many deltas the engine may run ahead of the consumer. Bounded so a slow
# or vanished client costs little memory and little wasted compute.
_LOOKAHEAD_DELTAS = 8

# ORT GenAI takes the seed as a signed 32-bit int; folding larger seeds would
# silently make two seeds sample alike, so they are refused instead.
_MAX_SEED = 2**31 - 1


class OrtGenAIOptions(BackendOptions):
    """`options` for a model served by the onnxruntime-genai backend."""

    path: str = Field(
        default=BUILTIN_MODEL,
        description="Model directory in ORT GenAI format, or 'builtin' for the bundled demo model.",
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="cpu, or cuda (needs the onnxruntime-genai-cuda package)."
    )
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Largest max_tokens a request may ask for (default: context length).",
    )
    batching: Literal["auto", "engine", "per_request"] = Field(
        default="auto",
        description="engine: concurrent requests share og.Engine's batched steps; "
        "per_request: each request runs its own og.Generator; auto: engine when the model "
        "does continuous batching (engine.dynamic_batching in genai_config.json), else "
        "per_request.",
    )
    max_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="With batching: engine, the most requests in one batch "
        "(default: the model's max_concurrency).",
    )
    static_batch_steps: int = Field(
        default=32,
        ge=0,
        description="With batching: engine on a static-batching engine (every CPU model), "
        "the steps a batch runs while other requests wait before its rows are preempted "
        "(begun again, prompt plus their tokens so far, together with the waiting ones); "
        "0: a batch always runs to its end.",
    )


def builtin_model_path() -> Path:
    return Path(str(resources.files("inferwire") / "models" / "demo"))


class OrtGenAIBackend(Backend):
    """A model run in-process by ONNX Runtime GenAI."""

    name = "onnxruntime-genai"
    options_type = OrtGenAIOptions
    options: OrtGenAIOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        super().__init__(model_name, options, max_concurrency)
        self._model: og.Model | None = None
        self._tokenizer: og.Tokenizer | None = None
        self._eos_token_ids: frozenset[int] = frozenset()
        self._context_length = 0
        self._vocab_size = 0
        self._search_defaults: dict[str, Any] = {}
        self._chat_template: str | None = None
        self._token_texts: TokenTexts | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._scheduler: EngineScheduler | None = None

    @property
    def model_path(self) -> Path:
        if self.options.path == BUILTIN_MODEL:
            return builtin_model_path()
        return Path(self.options.path).expanduser()

    async def load(self) -> None:
        path = self.model_path
        config_file = path / "genai_config.json"
        if not config_file.is_file():
            raise ConfigurationError(
                f"{config_file} not found; options.path must be "
                "a directory in ONNX Runtime GenAI format"
            )
        if self.options.device == "cuda" and not og.is_cuda_available():
            raise ConfigurationError(
                "options.device is 'cuda', but the installed "
                "onnxruntime-genai has no CUDA support; install it with: "
                "pip install 'inferwire[cuda]' (onnxruntime-genai-cuda)"
            )
        config = json.loads(config_file.read_text())
        genai_config = config["model"]
        self._search_defaults = dict(config.get("search", {}))
        self._chat_template = _chat_template(path)
        # Continuous batching needs a paged-KV model, whose config says dynamic_batching.
        dynamic = "dynamic_batching" in config.get("engine", {})
        self._context_length = int(genai_config["context_length"])
        self._vocab_size = int(genai_config["vocab_size"])
        eos = genai_config.get("eos_token_id", [])
        self._eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        batched = self.options.batching == "engine" or (self.options.batching == "auto" and dynamic)
        model, tokenizer = await asyncio.to_thread(self._load_engine, path, dynamic, batched)
        self._model, self._tokenizer = model, tokenizer
        self._token_texts = TokenTexts(tokenizer.decode)
        if batched:
            do_sample = bool(self._search_defaults.get("do_sample", False))
            self._scheduler = await asyncio.to_thread(
                EngineScheduler,
                self._model,
                self._tokenizer,
                self._eos_token_ids,
                self._vocab_size,
                do_sample,
                self._max_batch_size,
                self.options.static_batch_steps,
                dynamic,
                self.model_name,
            )
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix=f"ortgenai-{self.model_name}"
        )
        log.info(
            "model loaded",
            extra={"model": self.model_name, "path": str(path), "device": self.options.device},
        )

    @property
    def _max_batch_size(self) -> int:
        return self.options.max_batch_size or self.max_concurrency

    def _load_engine(
        self, path: Path, dynamic: bool, batched: bool
    ) -> tuple[og.Model, og.Tokenizer]:
        config = og.Config(str(path))
        config.clear_providers()
        if self.options.device == "cuda":
            config.append_provider("cuda")
        if batched and not dynamic:
            batch = {"max_batch_size": self._max_batch_size}
            config.overlay(json.dumps({"engine": {"static_batching": batch}}))
        model = og.Model(config)
        tokenizer = og.Tokenizer(model)
        # One throwaway token, so the first real request does not pay ORT's
        # first-run initialisation in its time to first token.
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=2, batch_size=1)
        generator = og.Generator(model, params)
        generator.append_tokens([0])
        generator.generate_next_token()
        return model, tokenizer

    async def unload(self) -> None:
        if self._scheduler is not None:
            await asyncio.to_thread(self._scheduler.close)
        self._scheduler = None
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._executor = None
        self._model = None
        self._tokenizer = None
        self._token_texts = None

    async def health(self) -> BackendHealth:
        if self._model is None:
            return BackendHealth(False, "engine not loaded")
        if self._scheduler is not None and not self._scheduler.alive:
            return BackendHealth(False, f"engine scheduler stopped: {self._scheduler.failure}")
        return BackendHealth(True, f"in-process on {self.options.device}, {self._path_description}")

    @property
    def _path_description(self) -> str:
        """Which path serves requests, for operators reading Health and ListModels."""
        if self._scheduler is None:
            return "a generator per request"
        kind = "continuous" if self._scheduler.dynamic else "static"
        return f"og.Engine {kind} batching of up to {self._max_batch_size}"

    def capabilities(self) -> Capabilities:
        limits = self.limits()
        return Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=limits.context_length,
            max_output_tokens=limits.max_output_tokens,
            chat=self._chat_template is not None,
            logprobs=True,
            constrained_output=True,
        )

    def limits(self) -> ModelLimits:
        max_output = self.options.max_output_tokens or self._context_length
        return ModelLimits(
            self._context_length, min(max_output, self._context_length), max_seed=_MAX_SEED
        )

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        if self._chat_template is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no chat template: add a `chat_template` to "
                "tokenizer_config.json in its folder (options.path), or send a prompt"
            )
        # JSON carries any role and content text through to the template unchanged.
        encoded = json.dumps([{"role": m.role, "content": m.content} for m in messages])
        try:
            return str(tokenizer.apply_chat_template(encoded, add_generation_prompt=True))
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
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        return await _encode(tokenizer, text)

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

    def _model_details(self) -> ModelDetails:
        assert self._token_texts is not None
        return ModelDetails(
            self._eos_token_ids, self._vocab_size, self._search_defaults, self._token_texts
        )

    def infer_stream(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> GenerationEvents:
        scheduler = self._scheduler
        if scheduler is not None and self._runs_on_engine(request.params, scheduler):
            return scheduler.stream(self._prepare(request, record), request.params, record)
        return self._stream(request, record)

    @staticmethod
    def _runs_on_engine(params: GenerationParams, scheduler: EngineScheduler) -> bool:
        """Whether the engine serves a request as asked (see the module docstring)."""
        if params.logprobs or params.constraint is not None:
            return False
        return params.seed is None or scheduler.dynamic

    async def _prepare(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> tuple[list[int], int]:
        """The prompt's token ids, checked against the context window, and the tokens to
        generate at most."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        self._refuse_logprobs_with_constraint(request)
        with record.tracer.span(TOKENIZE):
            input_ids = await _encode(tokenizer, request.prompt)
        record.prompt_tokens = len(input_ids)
        check_prompt_fits(request, len(input_ids), self.model_name, self.limits())
        # The context window bounds generation too; reaching it ends with LENGTH.
        return input_ids, min(request.max_tokens, self._context_length - len(input_ids))

    async def _stream(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> GenerationEvents:
        model, tokenizer, executor = self._model, self._tokenizer, self._executor
        if model is None or tokenizer is None or executor is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        input_ids, max_tokens = await self._prepare(request, record)
        details = self._model_details()

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TextDelta | GenerationEnd | BaseException] = asyncio.Queue()
        credits = threading.Semaphore(_LOOKAHEAD_DELTAS)
        stop = threading.Event()

        def emit(event: TextDelta | GenerationEnd | BaseException) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def run() -> None:
            try:
                generate(
                    model,
                    tokenizer,
                    details,
                    input_ids,
                    request.params,
                    max_tokens,
                    record,
                    stop,
                    credits,
                    emit,
                )
            except BaseException as exc:  # surfaced to the consumer, re-raised there
                emit(exc)

        worker = loop.run_in_executor(executor, run)
        finished = False
        held: TextDelta | GenerationEnd | BaseException | None = None
        try:
            while True:
                event = held if held is not None else await events.get()
                held = None
                if isinstance(event, TextDelta):
                    credits.release()
                    # A consumer that is behind takes every ready delta as one message
                    # (not with stop strings: a match reports its own delta's token count).
                    deltas = [event]
                    while not request.params.stop and not events.empty():
                        held = events.get_nowait()
                        if not isinstance(held, TextDelta):
                            break
                        deltas.append(held)
                        held = None
                        credits.release()
                    yield coalesce_deltas(deltas) if len(deltas) > 1 else event
                    continue
                finished = True
                if isinstance(event, BaseException):
                    raise event
                yield event
                return
        finally:
            if not finished:
                # The consumer left early (cancellation, deadline): stop the engine.
                pass
                stop.set()
                credits.release()  # wake the worker if it waits for the consumer
            await asyncio.shield(worker)


# Prompts up to this many characters are tokenized on the event loop: that takes under
# ~150 us (1,024 characters of 4-byte text), less than the hop to a worker thread and back
# costs on a busy machine, and the hop sits in every request's time to first token.
_INLINE_TOKENIZE_MAX_CHARS = 1024


async def _encode(tokenizer: og.Tokenizer, text: str) -> list[int]:
    """The token ids of `text`; a long text is tokenized off the event loop."""
    if len(text) <= _INLINE_TOKENIZE_MAX_CHARS:
        encoded = tokenizer.encode(text)
    else:
        encoded = await asyncio.to_thread(tokenizer.encode, text)
    return [int(t) for t in encoded]


def _chat_template(model_dir: Path) -> str | None:
    """The `chat_template` of the model folder's tokenizer_config.json, if it has one."""
    config_file = model_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    template = json.loads(config_file.read_text()).get("chat_template")
    return template if isinstance(template, str) and template else None
