"""The interface every backend implements.

A backend serves exactly one configured model. The model manager owns its
lifecycle: it calls `load` once, then `infer_stream` for any number of
concurrent requests (up to the model's `max_concurrency`), `health` from the
health watcher, and finally `unload` once no request is in flight.

Backends must never block the event loop: run blocking engine calls in a
thread, and make `infer_stream` stop generating promptly when the consumer
closes it (that is how cancellation and deadlines reach the engine).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferwire.core.types import (
    BackendHealth,
    Capabilities,
    GenerationEnd,
    InferenceRequest,
    ModelLimits,
    TextDelta,
)
from inferwire.errors import ConfigurationError


class BackendOptions(BaseModel):
    """Base for a backend's `options` block; unknown keys are a start-up error.

    The options here mean the same on every backend.
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

    `tokens_after_cancel` counts tokens the engine produced after it was told
    to stop, which is how we prove cancellation stops generation promptly.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.perf_counter() when the first token was ready
    cancelled: bool = False
    tokens_after_cancel: int = 0


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
        """Make the model ready to serve. Raise a domain error on failure."""

    @abc.abstractmethod
    async def unload(self) -> None:
        """Release the model. Called only when no request is in flight."""

    async def release(self) -> None:
        """Let go of the model at server shutdown; no request is in flight.

        In-process engines unload. A backend whose model lives on a shared server
        overrides this to disconnect without unloading it there.
        """
        await self.unload()

    @abc.abstractmethod
    def infer_stream(
        self, request: InferenceRequest, max_tokens: int, record: GenerationRecord
    ) -> AsyncIterator[TextDelta | GenerationEnd]:
        """Generate text deltas, then exactly one GenerationEnd.

        `max_tokens` is already resolved against the model's defaults and limits.
        Raise InvalidArgumentError before the first delta for a prompt the model
        cannot take (for example, one longer than its context window).
        """

    async def infer(
        self, request: InferenceRequest, max_tokens: int, record: GenerationRecord
    ) -> tuple[str, GenerationEnd]:
        """Unary generation: by default the concatenated stream, so both agree."""
        return await self.join(self.infer_stream(request, max_tokens, record))

    async def join(
        self, events: AsyncIterator[TextDelta | GenerationEnd]
    ) -> tuple[str, GenerationEnd]:
        """The text of a generation's deltas, and its end."""
        pieces: list[str] = []
        end: GenerationEnd | None = None
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
                else:
                    end = event
        if end is None:
            raise RuntimeError(f"backend {self.name!r} ended a stream without a result")
        return "".join(pieces), end

    @abc.abstractmethod
    async def health(self) -> BackendHealth:
        """Whether the loaded model can serve right now."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What the loaded model can do."""

    @abc.abstractmethod
    def limits(self) -> ModelLimits:
        """Request limits of the loaded model."""

    def default_max_tokens(self) -> int:
        """max_tokens for requests that leave it unset."""
        return min(self.options.default_max_tokens, self.limits().max_output_tokens)

    def render_prompt(self, request: InferenceRequest) -> str:
        """The text the model sees: context passages, then the prompt."""
        separator = self.options.context_separator
        return "".join(passage + separator for passage in request.context) + request.prompt
