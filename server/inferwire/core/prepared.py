"""A request as an engine takes it, prepared the same way on every embedded backend: its
prompt tokenized (timed as the request's `tokenize` span) and counted at once (a request
cancelled before its end still used its prompt), refused if it does not fit the model's
window, and its output bounded by the room the window leaves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from inferwire.core.backend import GenerationProgress
from inferwire.core.facts import ModelLimits
from inferwire.core.generation import check_prompt_fits
from inferwire.core.requests import GenerationRequest
from inferwire.core.sampling import GenerationParams
from inferwire.core.tracing import TOKENIZE

EngineSampling = TypeVar("EngineSampling")  # an engine's own form of the sampling parameters


@dataclass(frozen=True)
class PreparedRequest(Generic[EngineSampling]):
    """A request ready for an engine: its prompt checked against the window."""

    prompt_ids: list[int]
    max_tokens: int  # to generate at most; the window bounds it too (LENGTH when reached)
    # To generate before an end-of-sequence token may end the output (min_tokens, or all of
    # max_tokens with ignore_eos); at most max_tokens. The engine masks those tokens.
    min_tokens: int
    params: GenerationParams
    sampling: EngineSampling

    @property
    def coalesce(self) -> bool:
        """Whether a consumer that is behind may take ready deltas as one; not with stop
        strings, whose match reports its own delta's token count."""
        return not self.params.stop


async def prepare(
    request: GenerationRequest,
    progress: GenerationProgress,
    tokenize: Callable[[str], Awaitable[list[int]]],
    model: str,
    limits: ModelLimits,
    sampling: EngineSampling,
) -> PreparedRequest[EngineSampling]:
    """`request` for an engine whose sequences hold the model's context length (prompt and
    output; 0: no known bound), with its sampling in the engine's form (`sampling`); raise
    InvalidArgumentError if it cannot fit."""
    with progress.tracer.span(TOKENIZE):
        prompt_ids = await tokenize(request.prompt)
    progress.counted(prompt_tokens=len(prompt_ids))
    check_prompt_fits(request, len(prompt_ids), model, limits)
    max_tokens = request.max_tokens
    if limits.context_length:
        max_tokens = min(max_tokens, limits.context_length - len(prompt_ids))
    return PreparedRequest(
        prompt_ids, max_tokens, min(request.min_tokens, max_tokens), request.params, sampling
    )
