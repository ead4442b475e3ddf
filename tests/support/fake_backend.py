"""A scriptable fake backend, so the core and the gRPC adapter are tested without an engine.

In the style of MLServer's tests/fixtures.py: each `FakeBackend` is a real `Backend`
subclass whose behaviour a test sets through its attributes; `FakeBackends` is the
factory the model manager (or `InferwireServer`) takes, and keeps every backend it
built by model name. Nothing here waits on wall-clock time unless a test sets `step_s`
(a fixed time per token): a test that needs a request to stay in flight closes a gate and
opens it when it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferwire.config import Settings
from inferwire.core.adapters import AdapterBackend
from inferwire.core.backend import Backend, BackendOptions, GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage
from inferwire.core.embeddings import (
    EmbeddingInput,
    EncodingJob,
    EncodingProgress,
    Vector,
    normalized,
)
from inferwire.core.errors import FieldViolation, InvalidArgumentError, ModelNotReadyError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.manager import ModelSpec
from inferwire.core.memory import Footprint
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import (
    FinishReason,
    GenerationEnd,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from inferwire.core.sampling import BASE_PARAMETERS
from inferwire.core.status import BackendHealth
from inferwire.core.tracing import TOKENIZE
from inferwire.server import InferwireServer

FAKE_BACKEND = "fake"


class Gate:
    """An open/closed switch that generation or a load waits on."""

    def __init__(self, is_open: bool = True) -> None:
        self._event = asyncio.Event()
        if is_open:
            self._event.set()

    def close(self) -> None:
        self._event.clear()

    def open(self) -> None:
        self._event.set()

    async def passed(self) -> None:
        await self._event.wait()


@dataclass
class Calls:
    """What the core asked of a fake backend."""

    loads: int = 0
    reconciles: int = 0
    unloads: int = 0
    releases: int = 0
    requests: list[GenerationRequest] = field(default_factory=list)
    unary: int = 0
    streams_closed_early: int = 0
    embeddings: list[EncodingJob] = field(default_factory=list)


class FakeBackend(Backend):
    """Emits `pieces` one delta per token, then ends as `finish`; every step is scriptable."""

    name = FAKE_BACKEND
    adapter_source_option = "adapter_file"

    def __init__(self, model_name: str, options: dict[str, object], max_concurrency: int) -> None:
        super().__init__(model_name, dict(options), max_concurrency)
        self.pieces: list[str] = ["Hello", ",", " world"]
        self.finish = FinishReason.STOP
        self.prompt_tokens = 3
        self.limits_ = ModelLimits(context_length=64, max_output_tokens=32, max_seed=1000)
        self.load_gate = Gate()
        self.load_error: Exception | None = None
        self.reconcile_error: Exception | None = None
        self.generation_gate = Gate()
        self.step_s = 0.0  # a fixed time per token (0: none)
        self.started = asyncio.Event()  # set once a request reached the backend
        self.infer_error: Exception | None = None
        self.error_after_pieces = 0  # raise infer_error after this many deltas
        self.health_: BackendHealth | Exception = BackendHealth(True, "fake: fine")
        # Generation features, off unless a test turns them on: a chat template renders
        # `role: content` lines, and piece i has log-probability -(i + 1) / 10.
        self.chat_template = False
        self.supports_logprobs = False
        self.supports_constraints = False
        self.parameters = BASE_PARAMETERS  # the sampling parameters it declares it takes
        # An embedding model instead (it does not generate): `embed_vector` per input, one
        # token per UTF-8 byte, a window of `limits_.context_length` tokens.
        self.embeds = False
        self.footprint_: Footprint | None = None  # what footprint() estimates
        self.calls = Calls()

    def footprint(self) -> Footprint | None:
        return self.footprint_

    def adapter(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> Backend:
        return FakeAdapter(model_name, options, max_concurrency, self)

    async def load(self) -> ModelFacts:
        self.calls.loads += 1
        await self.load_gate.passed()
        if self.load_error is not None:
            raise self.load_error
        return self.loaded_facts(self.limits_, self.capabilities())

    async def reconcile(self) -> None:
        self.calls.reconciles += 1
        if self.reconcile_error is not None:
            raise self.reconcile_error

    async def unload(self) -> None:
        self.calls.unloads += 1
        self.facts = None

    async def release(self) -> None:
        self.calls.releases += 1

    def infer(self, request: GenerationRequest, progress: GenerationProgress) -> GenerationEvents:
        self.calls.unary += 1
        return self._generate(request, progress)

    def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        return self._generate(request, progress)

    async def _generate(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        self.calls.requests.append(request)
        with progress.tracer.span(TOKENIZE):
            progress.counted(prompt_tokens=self.prompt_tokens)
        self.started.set()
        finished = False
        generated = 0
        try:
            for index, piece in enumerate(self.pieces[: request.max_tokens]):
                if self.infer_error is not None and index == self.error_after_pieces:
                    raise self.infer_error
                await self.generation_gate.passed()
                if self.step_s:
                    await asyncio.sleep(self.step_s)
                progress.first_token()
                generated += 1
                logprobs = (fake_logprob(index, piece, request),) if request.params.logprobs else ()
                yield TextDelta(piece, generated, logprobs)
            if self.infer_error is not None:
                raise self.infer_error
            finished = True
        finally:
            if not finished:
                self.calls.streams_closed_early += 1
        finish = self.finish
        if len(self.pieces) > request.max_tokens:
            finish = FinishReason.LENGTH
        yield GenerationEnd(finish, Usage(self.prompt_tokens, generated))

    async def health(self) -> BackendHealth:
        if isinstance(self.health_, Exception):
            raise self.health_
        return self.health_

    def capabilities(self) -> Capabilities:
        """What a load reports from this fake's switches (read when it loads)."""
        return Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            context_length=self.limits_.context_length,
            max_output_tokens=self.limits_.max_output_tokens,
            chat=self.chat_template,
            logprobs=self.supports_logprobs,
            constrained_output=self.supports_constraints,
            parameters=self.parameters,
            generation=not self.embeds,
            embeddings=self.embeds,
            rerank=self.embeds,
            embedding_dimensions=EMBEDDING_DIMENSIONS if self.embeds else 0,
        )

    async def embed(self, job: EncodingJob, progress: EncodingProgress) -> list[Vector]:
        if not self.embeds:
            return await super().embed(job, progress)
        self.calls.embeddings.append(job)
        window = self.limits_.context_length
        counts = []
        for name, given in zip(job.fields, job.inputs, strict=True):
            count = len(given.encode()) if isinstance(given, str) else len(given)
            if count > window and not job.truncate:
                why = f"is {count} tokens; the model's window is {window}"
                raise InvalidArgumentError([FieldViolation(name, why)])
            counts.append(min(count, window))
        progress.counted(prompt_tokens=sum(counts))
        self.started.set()
        await self.generation_gate.passed()
        if self.infer_error is not None:
            raise self.infer_error
        progress.batched(len(job.inputs))
        vectors = [embed_vector(given) for given in job.inputs]
        return vectors if job.normalize is False else [normalized(v) for v in vectors]

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        if not self.chat_template:
            return super().render_chat(messages)
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "

    async def tokenize(self, text: str) -> list[int]:
        """One token per UTF-8 byte."""
        return list(text.encode())

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode(errors="replace")


EMBEDDING_DIMENSIONS = 4


def embed_vector(given: EmbeddingInput) -> Vector:
    """A fake input's embedding (before normalizing): its length, its count of `a`s, the
    sum of its bytes (or ids) modulo 97, and 1."""
    data = given.encode() if isinstance(given, str) else bytes(t % 256 for t in given)
    return array("f", [len(data), data.count(b"a"), sum(data) % 97, 1.0])


def fake_logprob(index: int, piece: str, request: GenerationRequest) -> TokenLogprob:
    """Piece `index`'s entry: id `index`, log-probability -(index + 1) / 10; its
    `top_logprobs` alternatives are itself, then ids 1001, 1002, ... each 1 lower."""
    logprob = -(index + 1) / 10
    top = tuple(
        TopLogprob(piece, index, logprob)
        if rank == 0
        else TopLogprob(f"alt{rank}", 1000 + rank, logprob - rank)
        for rank in range(request.params.top_logprobs)
    )
    return TokenLogprob(piece, index, logprob, top)


class FakeBackends:
    """A backend factory that builds FakeBackends and remembers them by model name."""

    def __init__(self) -> None:
        self.by_model: dict[str, FakeBackend] = {}

    def __call__(self, spec: ModelSpec) -> Backend:
        backend = FakeBackend(spec.name, spec.options, spec.max_concurrency)
        self.by_model[spec.name] = backend
        return backend

    def __getitem__(self, model: str) -> FakeBackend:
        return self.by_model[model]


@contextlib.asynccontextmanager
async def switched(
    served: tuple[InferwireServer, FakeBackends], model: str, **switches: bool
) -> AsyncIterator[FakeBackend]:
    """Turn features of a loaded fake on (`chat_template=True`, ...) for the block, and off
    after it: the model is loaded again each time, since what a model is (its facts) is
    read when it loads."""
    server, backends = served
    backend = backends[model]

    async def reload(value: bool | None) -> None:
        await server.manager.unload(model)
        for name, on in switches.items():
            setattr(backend, name, on if value is None else value)
        await server.manager.load(model)

    await reload(None)
    try:
        yield backend
    finally:
        await reload(False)


@contextlib.asynccontextmanager
async def serving_fakes(
    settings: Settings, tracer_provider: object = None
) -> AsyncIterator[tuple[InferwireServer, FakeBackends]]:
    """The real server assembly over FakeBackends, started, and stopped at the end."""
    backends = FakeBackends()
    server = InferwireServer(settings, backend_factory=backends, tracer_provider=tracer_provider)
    await server.start()
    try:
        yield server, backends
    finally:
        await server.stop(grace_s=0)


class FakeAdapterOptions(BackendOptions):
    adapter_file: str


class FakeAdapter(AdapterBackend):
    """An adapter model on a FakeBackend: its file holds `FAKE-ADAPTER <tag>`, and each
    piece of the base's output gets `<tag>:` in front; any other content does not load."""

    name = FAKE_BACKEND
    options_type = FakeAdapterOptions
    options: FakeAdapterOptions
    base: FakeBackend
    tag = ""

    async def load_adapter(self) -> None:
        content = Path(self.options.adapter_file).read_bytes()
        if not content.startswith(b"FAKE-ADAPTER "):
            raise ModelNotReadyError(f"adapter file {self.options.adapter_file!r} is corrupt")
        self.tag = content.removeprefix(b"FAKE-ADAPTER ").decode().strip()

    async def unload(self) -> None:
        self.tag = ""

    def footprint(self) -> Footprint | None:
        """The file's size, on the base's device (as the embedded engine's adapters)."""
        base = self.base.footprint_
        size = Path(self.options.adapter_file).stat().st_size
        return None if base is None else replace(base, amount=size, detail="adapter file")

    async def _tagged(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        async for event in self.base.infer_stream(request, progress):
            if isinstance(event, TextDelta):
                event = replace(event, text=f"{self.tag}:{event.text}")
            yield event

    def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        return self._tagged(request, progress)


FakeBackend.adapter_options_type = FakeAdapterOptions
