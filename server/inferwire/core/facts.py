"""What is fixed for a loaded model: its limits and capabilities, as `Backend.load` reports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferwire.core.sampling import BASE_PARAMETERS


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model can do; reported in ModelStatus."""

    streaming: bool
    max_concurrency: int
    on_premises: bool
    modalities: tuple[str, ...] = ("text",)
    context_length: int = 0
    max_output_tokens: int = 0
    chat: bool = False  # takes chat messages (has a chat template)
    logprobs: bool = False  # returns log-probabilities
    constrained_output: bool = False  # takes an output constraint
    tools: bool = False  # takes tools (calls parsed from its output)
    tools_constrained: bool = False  # its calls are constrained: valid by construction
    # The sampling parameters it takes (core/sampling.py); a request setting another one is
    # refused naming it.
    parameters: frozenset[str] = BASE_PARAMETERS
    generation: bool = True  # generates text (Infer); an embedding model does not
    embeddings: bool = False  # makes embeddings (Embed)
    rerank: bool = False  # scores documents against a query (Rerank)
    embedding_dimensions: int = 0  # the length of its embeddings

    @property
    def kind(self) -> str:
        """What the model is, in words, for a refusal of what it does not do."""
        if self.generation:
            return "a generation model"
        if self.embeddings:
            return "an embedding model"
        return "a rerank model" if self.rerank else "a model that serves nothing"


@dataclass(frozen=True)
class PromptCacheStats:
    """What a backend that keeps finished requests' KV for reuse holds (llama-cpp's slots)."""

    cached_conversations: int  # free slots that hold a previous request's tokens
    cached_tokens: int
    cached_bytes: int
    prompt_tokens_total: int  # since load
    reused_tokens_total: int  # prompt tokens read from the cache, not computed

    @property
    def hit_rate(self) -> float:
        """Tokens reused / prompt tokens."""
        total = self.prompt_tokens_total
        return self.reused_tokens_total / total if total else 0.0


@dataclass(frozen=True)
class ModelLimits:
    """Limits a backend enforces on requests for a loaded model."""

    context_length: int  # 0: not known; the model enforces its own
    max_output_tokens: int
    max_seed: int | None = None  # the largest seed the engine takes, if it has a limit
    max_inputs: int = 0  # embedding or rerank inputs one request may hold; 0: no limit


@dataclass(frozen=True)
class ModelFacts:
    """What is fixed for a loaded model. `Backend.load` returns it, the core keeps it on the
    model until the model unloads, and no request asks the backend again (TGI's router
    reads its model's `Info` once, the same way)."""

    limits: ModelLimits
    capabilities: Capabilities  # `chat`: the model has a chat template
    default_max_tokens: int  # for requests that leave max_tokens unset
    context_separator: str  # joins context passages, and separates them from the prompt
    # What an unset sampling parameter means on this model (its generation defaults: ORT
    # GenAI's `search` section; greedy for a GGUF), filled in by the core; a parameter
    # missing here is left to the engine's own default.
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
