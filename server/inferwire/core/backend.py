"""The interface every backend implements; the core owns it, backends import it.

A backend serves exactly one configured model. The model manager owns its
lifecycle: it calls `load` once, then `infer` or `infer_stream` for any number
of concurrent requests (up to the model's `max_concurrency`), `health` from the
health watcher, and finally `unload` once no request is in flight.

The core validates each request, renders its prompt, resolves max_tokens and
matches stop strings; a backend only turns a `GenerationRequest` into text.
Backends must never block the event loop: run blocking engine calls in a
thread, and make their event streams stop generating promptly when the
consumer closes them. That is how cancellation, deadlines and a matched stop
string reach the engine. See docs/backends.md for writing one.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.tracing import NoTracer, Tracer
from inferwire.core.types import (
    BackendHealth,
    Capabilities,
    ChatMessage,
    GenerationEnd,
    GenerationRequest,
    ModelLimits,
    TextDelta,
)

GenerationEvents = AsyncGenerator[TextDelta | GenerationEnd, None]


class BackendOptions(BaseModel):
    """Base for a backend's `options` block; unknown keys are a start-up error.

    The options here mean the same on every backend, and the core applies them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_max_tokens: int = Field(
        default=256, ge=1, description="max_tokens for requests that leave it unset."
    )
    context_separator: str = Field(
        default="\n\n", description="Joins context passages, and separates them from the prompt."
    )


@dataclass
class GenerationRecord:
    """Filled in by the backend while a request runs; read by the core for timing and logs.

    `cancelled` means the consumer closed the stream before its end.
    `tokens_after_cancel` counts tokens the engine produced after it was told
    to stop, which is how we prove cancellation stops generation promptly.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.perf_counter() when the first token was ready
    cancelled: bool = False
    tokens_after_cancel: int = 0
    # Times the backend's own stages (`tokenize`) in the request's trace.
    tracer: Tracer = field(default_factory=NoTracer)


class Backend(abc.ABC):
    """One model served by one backend implementation."""

    name: ClassVar[str]
    options_type: ClassVar[type[BackendOptions]] = BackendOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        self.model_name = model_name
        self.max_concurrency = max_concurrency
        self.options = self.parse_options(model_name, options)

    @classmethod
    def parse_options(cls, model_name: str, options: dict[str, Any]) -> BackendOptions:
        try:
            return cls.options_type.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(
                f"options.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigurationError(
                f"model {model_name!r} (backend {cls.name!r}): {problems}"
            ) from None

    @abc.abstractmethod
    async def load(self) -> None:
        """Make the model ready to serve. Raise a domain error on failure.

        The manager reports a failure as `model 'x' failed to load: <message>`, so the
        message says why without naming the model again.
        """

    @abc.abstractmethod
    async def unload(self) -> None:
        """Release the model. Called only when no request is in flight."""

    async def reconcile(self) -> None:
        """Make sure a loaded model is still loaded; LoadModel on a READY model calls this.

        An in-process engine cannot lose its model, so by default nothing. A backend
        whose model lives on a server that may have restarted without it loads it again.
        """
        return None

    async def release(self) -> None:
        """Let go of the model at server shutdown; no request is in flight.

        In-process engines unload. A backend whose model lives on a shared server
        overrides this to disconnect without unloading it there.
        """
        await self.unload()

    @abc.abstractmethod
    def infer_stream(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> GenerationEvents:
        """Generate text deltas, then exactly one GenerationEnd.

        Raise InvalidArgumentError before the first delta for a prompt the model
        cannot take (for example, one longer than its context window). Keep
        `record` current: the core reads it when it closes the stream early.
        """

    def infer(self, request: GenerationRequest, record: GenerationRecord) -> GenerationEvents:
        """Unary generation, as events too, so the core treats both alike.

        By default the stream itself; a backend with a cheaper non-streaming
        call (Triton's ModelInfer) yields its whole text as one delta.
        """
        return self.infer_stream(request, record)

    @abc.abstractmethod
    async def health(self) -> BackendHealth:
        """Whether the loaded model can serve right now."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What the loaded model can do."""

    @abc.abstractmethod
    def limits(self) -> ModelLimits:
        """Request limits of the loaded model."""

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt the model's chat template makes of `messages`, the reply opened.

        Called for chat requests on a loaded model. A model without a chat template
        raises ModelNotReadyError (FAILED_PRECONDITION) naming the option that sets one.
        Must be quick: the core calls it on the event loop.
        """
        raise ModelNotReadyError(
            f"model {self.model_name!r} has no chat template; backend {self.name!r} "
            "does not render chat messages"
        )

    async def tokenize(self, text: str) -> list[int]:
        """The token ids the model sees for `text` (the Tokenize RPC).

        A backend without a tokenizer for the model raises ModelNotReadyError naming
        the option that gives it one.
        """
        raise ModelNotReadyError(
            f"model {self.model_name!r} has no tokenizer in the gateway; backend "
            f"{self.name!r} does not tokenize"
        )

    def default_max_tokens(self) -> int:
        """max_tokens for requests that leave it unset."""
        return min(self.options.default_max_tokens, self.limits().max_output_tokens)
