"""The interface every backend implements; the core owns it, backends import it.

A backend serves exactly one configured model. The model manager owns its
lifecycle: it calls `load` once, which returns the loaded model's `ModelFacts`
(limits, capabilities, defaults: what cannot change until it unloads), then
`infer` or `infer_stream` for any number of concurrent requests (up to the model's
`max_concurrency`), `health` from the health watcher, and finally `unload` once no
request is in flight. A request enters the backend once to be generated, and once
more before that only when its chat messages need the model's template
(`render_chat`): everything else the core needs it read from the facts.

The core validates each request, renders its prompt, resolves max_tokens and
matches stop strings; a backend only turns a `GenerationRequest` into text.
Backends must never block the event loop: run blocking engine calls in a
thread, and make their event streams stop generating promptly when the
consumer closes them. That is how cancellation, deadlines and a matched stop
string reach the engine. See docs/backends.md for writing one.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferwire.core.chat import ChatMessage, Tool, ToolSyntax
from inferwire.core.embeddings import (
    EncodingJob,
    EncodingProgress,
    Vector,
    cosine_scores,
    kind_refusal,
)
from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits, PromptCacheStats
from inferwire.core.kv_blocks import BlockLedger
from inferwire.core.memory import Footprint
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import GenerationEnd, TextDelta
from inferwire.core.status import BackendHealth
from inferwire.core.tracing import Tracer

GenerationEvents = AsyncGenerator[TextDelta | GenerationEnd, None]


class BackendOptions(BaseModel):
    """Base for a backend's `options` block; unknown keys are a start-up error.

    The options here mean the same on every backend, and the core applies them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    default_max_tokens: int = Field(default=256, ge=1)
    """max_tokens for requests that leave it unset."""
    context_separator: str = "\n\n"
    """Joins context passages, and separates them from the prompt."""


class GenerationProgress(Protocol):
    """What a backend tells the core about a request besides its events.

    The request's `RequestRecord` (core/record.py) is what implements it. Token counts
    travel in the events; `counted` is for what the events cannot carry: the prompt's
    count as soon as it is known (a request cancelled before its end still used its
    prompt), and the counts of a stream the core closed early.
    """

    tracer: Tracer  # times the backend's own stages (`tokenize`) in the request's trace

    def first_token(self, at: float | None = None) -> None:
        """The first token was ready `at` (time.perf_counter(); default: now)."""

    def counted(
        self, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        """The prompt, or the completion so far, is this many tokens (None: unchanged)."""

    def generated_after_cancel(self, count: int = 1) -> None:
        """The engine made `count` more tokens after its stream was closed (which is how
        tests prove cancellation stops generation promptly)."""


class CountedProgress(GenerationProgress, Protocol):
    """A request's progress with its counts readable: its record, or one of its choices
    (core/choices.py); what the core's stream stages read and write."""

    prompt_tokens: int
    completion_tokens: int


class Backend(abc.ABC):
    """One model served by one backend implementation."""

    name: ClassVar[str]
    options_type: ClassVar[type[BackendOptions]] = BackendOptions
    adapter_options_type: ClassVar[type[BackendOptions] | None] = None
    """The `options` of adapter models on this backend's models; None: it serves none."""
    adapter_source_option: ClassVar[str | None] = None
    """The adapter option a run-time `AdapterSource.path` sets (core/adapters.py)."""
    adapter_source_is_file: ClassVar[bool] = True
    """Whether that option names a file (checked against `server.adapters.allowed_dirs`)."""

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        self.model_name = model_name
        self.max_concurrency = max_concurrency
        self.options = self.parse_options(model_name, options)
        self.facts: ModelFacts | None = None  # what the last load found (`loaded_facts`)
        # Where a backend with a prefix cache reports its blocks (core/kv_blocks.py); set
        # before the first load when `server.kv_events` is on, else None.
        self.kv_blocks: BlockLedger | None = None

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
    async def load(self) -> ModelFacts:
        """Make the model ready to serve; return what is fixed for it while it is loaded
        (`loaded_facts` builds it). Raise a domain error on failure.

        The manager reports a failure as `model 'x' failed to load: <message>`, so the
        message says why without naming the model again.
        """

    def loaded_facts(
        self,
        limits: ModelLimits,
        capabilities: Capabilities,
        sampling_defaults: Mapping[str, Any] | None = None,
    ) -> ModelFacts:
        """The facts of a model just loaded with these limits and capabilities (and what an
        unset sampling parameter means on it), with what the options every backend shares
        (`BackendOptions`) make of them; kept as `facts` too, for the adapter models that
        run on this one."""
        default_max_tokens = min(self.options.default_max_tokens, limits.max_output_tokens)
        self.facts = ModelFacts(
            limits,
            capabilities,
            default_max_tokens,
            self.options.context_separator,
            dict(sampling_defaults or {}),
        )
        return self.facts

    def footprint(self) -> Footprint | None:
        """What the model will hold once loaded, estimated before loading, and on which
        device's budget; None: not accounted (no budget applies). Reads files at most."""
        return None

    def adapter(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> Backend:
        """The backend of an adapter model (`adapter_of`) that runs on this model."""
        raise ConfigurationError(
            f"model {model_name!r}: backend {self.name!r} serves no adapter models"
        )

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
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        """Generate text deltas, then exactly one GenerationEnd.

        Raise InvalidArgumentError before the first delta for a prompt the model
        cannot take (for example, one longer than its context window). Report the
        prompt's token count and the first token's time through `progress` as soon as
        they are known: the core reads them when it closes the stream early.
        """

    def infer(self, request: GenerationRequest, progress: GenerationProgress) -> GenerationEvents:
        """Unary generation, as events too, so the core treats both alike.

        By default the stream itself; a backend with a cheaper non-streaming
        call (Triton's ModelInfer) yields its whole text as one delta.
        """
        return self.infer_stream(request, progress)

    @abc.abstractmethod
    async def health(self) -> BackendHealth:
        """Whether the loaded model can serve right now."""

    def kv_cache_usage(self) -> float | None:
        """The fraction (0 to 1) of the KV cache that serves this model held now, when the
        backend can read it (a Triton server's own gauge); None: the core counts it from
        its live requests (an embedded engine), or nothing is known. Quick: read at every
        metrics scrape."""
        return None

    def prompt_cache(self) -> PromptCacheStats | None:
        """What the backend keeps of finished requests for later prompts that share their
        prefix (a conversation's next turn); None: it keeps nothing. Quick: read at every
        ListModels and metrics scrape."""
        return None

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

    def render_chat_with_tools(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> str | None:
        """The prompt of a conversation with tools where the model's chat template takes
        them (Hugging Face's `tools`, calls in a syntax core/tool_syntax.py knows); None
        where it does not, and the core renders them in its documented default (Hermes')."""
        return None

    def tool_syntax(self) -> ToolSyntax:
        """The syntax the model writes calls in: its template's where
        `render_chat_with_tools` renders them, else the default (Hermes')."""
        return ToolSyntax.HERMES

    async def tokenize(self, text: str) -> list[int]:
        """The token ids the model sees for `text` (the Tokenize RPC).

        A backend without a tokenizer for the model raises ModelNotReadyError naming
        the option that gives it one.
        """
        raise ModelNotReadyError(
            f"model {self.model_name!r} has no tokenizer in inferwire; backend "
            f"{self.name!r} does not tokenize"
        )

    async def embed(self, job: EncodingJob, progress: EncodingProgress) -> list[Vector]:
        """One embedding per input of `job`, in order (Embed; core/embeddings.py).

        Count the inputs' tokens through `progress` as soon as they are known. Raise
        InvalidArgumentError naming the job's field of an input the model cannot take (longer
        than its window without `truncate`, a token id outside its vocabulary). A model that
        makes none refuses, naming its kind: the default.
        """
        raise kind_refusal(self.model_name, self._kind(), "make embeddings")

    async def rerank(self, job: EncodingJob, progress: EncodingProgress) -> list[float]:
        """Each document's relevance to the query (Rerank): `job.inputs[0]` is the query,
        the rest the documents, in order. By default, on a model that makes embeddings, the
        cosine of the query's and each document's embeddings; a cross-encoder scores the
        pairs itself; any other model refuses, naming its kind."""
        if self.facts is not None and self.facts.capabilities.embeddings:
            vectors = await self.embed(job, progress)
            return cosine_scores(vectors[0], vectors[1:])
        raise kind_refusal(self.model_name, self._kind(), "rerank documents")

    def _kind(self) -> str:
        return self.facts.capabilities.kind if self.facts is not None else "a generation model"

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` (vLLM's /detokenize); like `tokenize` without one."""
        raise ModelNotReadyError(
            f"model {self.model_name!r} has no tokenizer in inferwire; backend "
            f"{self.name!r} does not detokenize"
        )
