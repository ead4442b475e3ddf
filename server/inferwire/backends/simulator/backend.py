"""The simulator backend: no engine, a deterministic word stream on a configured schedule.

For load-testing a deployment, its clients and its autoscaling without a model (as
llm-d's inference simulator is used), and for measuring inferwire alone (the bench's
`gateway_capacity`). Everything but the generation is a real backend's: options
checked at start-up, load and unload, health, footprint, limits, chat rendering,
Tokenize, usage and finish reasons. Stop strings are matched by the core, as for every
backend.

Generation is lazy: a token is made only when the consumer asks for the next event,
and every token already due then goes out in one delta (one asyncio timer per token at
most). So a consumer that is behind gets the tokens due meanwhile at once, on the same
absolute schedule, and nothing is generated after the stream is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

from pydantic import ConfigDict, Field

from inferwire.backends.simulator.schedule import (
    Schedule,
    TokenPace,
    Words,
    natural_length,
    request_seed,
    token_ids,
)
from inferwire.core.backend import Backend, BackendOptions, GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.memory import Footprint
from inferwire.core.prepared import prepare
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, Usage
from inferwire.core.status import BackendHealth

log = logging.getLogger(__name__)


class SimulatorOptions(BackendOptions):
    """`options` for a model served by the simulator backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    time_to_first_token_ms: float = Field(default=100.0, ge=0)
    """From the start of generation (after admission) to the first token."""

    inter_token_ms: float = Field(default=20.0, ge=0)
    """Between consecutive tokens (20: 50 tokens/s per stream)."""

    jitter_ms: float = Field(default=0.0, ge=0)
    """Each token comes up to this much later than its slot, drawn from the request's
    seed (the same seed, the same timing)."""

    output_tokens: int | None = Field(default=None, ge=1)
    """Tokens a completion has before it ends by itself (finish reason STOP), unless
    max_tokens comes first; unset: every completion runs to max_tokens (LENGTH). A
    request's min_tokens raises it; with ignore_eos it runs to max_tokens."""

    context_length: int = Field(default=8192, ge=2)
    """The context window in words (prompt plus completion); longer prompts are refused."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Largest max_tokens a request may ask for (default: the context length)."""

    load_ms: float = Field(default=0.0, ge=0)
    """How long loading takes (to exercise readiness probes and on-demand loading)."""

    script: tuple[str, ...] | None = None
    """The tokens of every completion, in order, instead of words: a model's raw output
    scripted (a tool call's syntax, say). It ends by itself after the last (STOP)."""


class SimulatorBackend(Backend):
    """A model that is a schedule: deterministic words, on time, at no engine cost."""

    name = "simulator"
    options_type = SimulatorOptions
    options: SimulatorOptions
    _loaded = False

    def footprint(self) -> Footprint:
        return Footprint("cpu", 0, detail="the simulator holds no weights")

    async def load(self) -> ModelFacts:
        if self.options.load_ms:
            await asyncio.sleep(self.options.load_ms / 1e3)
        self._loaded = True
        log.info("model loaded", extra={"model": self.model_name, "path": "simulator"})
        context_length = self.options.context_length
        max_output = min(self.options.max_output_tokens or context_length, context_length)
        capabilities = Capabilities(
            streaming=True,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=context_length,
            max_output_tokens=max_output,
            chat=True,
            tools=True,  # parsed from the text and checked: the simulator takes no grammar
        )
        return self.loaded_facts(ModelLimits(context_length, max_output), capabilities)

    async def unload(self) -> None:
        self._loaded, self.facts = False, None

    async def health(self) -> BackendHealth:
        if not self._loaded:
            return BackendHealth(False, "simulator not loaded")
        options = self.options
        return BackendHealth(
            True,
            f"simulator: first token after {options.time_to_first_token_ms:g} ms, then one "
            f"every {options.inter_token_ms:g} ms",
        )

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """`role: content` lines, then the assistant's turn opened."""
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"

    async def tokenize(self, text: str) -> list[int]:
        return token_ids(text)

    def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        return self._generate(request, progress)

    async def _generate(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert self.facts is not None  # set by `load`
        prepared = await prepare(
            request, progress, self.tokenize, self.model_name, self.facts.limits, None
        )
        # The context window bounds generation too; reaching it ends with LENGTH.
        prompt, room, minimum = (
            len(prepared.prompt_ids),
            prepared.max_tokens,
            prepared.min_tokens,  # min_tokens; all of it with ignore_eos
        )
        script = self.options.script
        natural = len(script) if script is not None else self.options.output_tokens
        length, ends_by_itself = natural_length(natural, room, minimum)
        seed = request_seed(request.params.seed, request.prompt)
        # A script runs out only past its end, when min_tokens asks for more: spaces then.
        words = Words(seed) if script is None else itertools.chain(script, itertools.repeat(" "))
        schedule = Schedule(self._pace(), start, seed)
        # With stop strings one token per delta: the core reads the count of the delta
        # a stop string matched in as the completion's.
        coalesce = not request.params.stop
        made = 0
        ended = False
        try:
            due = schedule.due(0)
            while made < length:
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if made == 0:
                    progress.first_token()
                text = next(words)
                made += 1
                if coalesce:  # and every further token due by now, in the same delta
                    now = loop.time()
                    while made < length and (due := schedule.due(made)) <= now:
                        text += next(words)
                        made += 1
                elif made < length:
                    due = schedule.due(made)
                yield TextDelta(text, made)
            ended = True
            reason = FinishReason.STOP if ends_by_itself else FinishReason.LENGTH
            yield GenerationEnd(reason, Usage(prompt, made))
        finally:
            if not ended:  # closed early: what it made is final, and nothing comes after
                progress.counted(completion_tokens=made)

    def _pace(self) -> TokenPace:
        options = self.options
        return TokenPace(
            options.time_to_first_token_ms / 1e3,
            options.inter_token_ms / 1e3,
            options.jitter_ms / 1e3,
        )
