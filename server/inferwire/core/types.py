"""Domain objects passed between the servicer, the core and the backends."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ModelState(enum.Enum):
    """Where a model is in its lifecycle."""

    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


class FinishReason(enum.Enum):
    """Why generation ended."""

    STOP = "STOP"  # end-of-sequence token
    STOP_SEQUENCE = "STOP_SEQUENCE"  # a request stop string matched
    LENGTH = "LENGTH"  # max_tokens or the context window reached


@dataclass(frozen=True)
class GenerationParams:
    """Decoding parameters; None means the model's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class InferenceRequest:
    """One generation request, already validated for shape (not for model limits)."""

    request_id: str
    model: str
    prompt: str
    context: tuple[str, ...] = ()
    params: GenerationParams = field(default_factory=GenerationParams)
    deadline: float | None = None  # time.monotonic() by which the caller needs the result


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Timing:
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float


@dataclass(frozen=True)
class TextDelta:
    """Text generated since the previous delta, with the running token count."""

    text: str
    completion_tokens: int


@dataclass(frozen=True)
class GenerationEnd:
    """The final event of a backend stream."""

    finish_reason: FinishReason
    usage: Usage


@dataclass(frozen=True)
class StreamChunk:
    """What the core yields to the servicer: a delta, and on the last chunk the outcome."""

    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timing: Timing | None = None


@dataclass(frozen=True)
class InferenceResult:
    request_id: str
    model: str
    backend: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    timing: Timing


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model can do; reported in ModelStatus."""

    streaming: bool
    max_concurrency: int
    on_premises: bool
    modalities: tuple[str, ...] = ("text",)
    context_length: int = 0
    max_output_tokens: int = 0


@dataclass(frozen=True)
class ModelLimits:
    """Limits a backend enforces on requests for a loaded model."""

    context_length: int
    max_output_tokens: int


@dataclass(frozen=True)
class BackendHealth:
    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class ModelStatus:
    name: str
    backend: str
    state: ModelState
    detail: str = ""
    capabilities: Capabilities | None = None


@dataclass(frozen=True)
class ModelHealthReport:
    name: str
    backend: str
    state: ModelState
    ready: bool
    detail: str
    inflight: int
    queued: int
    requests_total: int
    generated_tokens_total: int


@dataclass(frozen=True)
class BackendHealthReport:
    name: str
    healthy: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    serving: bool
    models: tuple[ModelHealthReport, ...]
    backends: tuple[BackendHealthReport, ...]
