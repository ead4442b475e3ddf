"""A request's sampling settings in ORT GenAI's terms, mapped once.

`SearchOptions.of` is the one place that turns `GenerationParams` into ORT GenAI's sampling
options; the generator path takes them as search options, the engine path as turn
options, so the two paths cannot drift apart. What a path is handed, `PathRequest`, is the
core's prepared request (core/prepared.py) with these options.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnxruntime_genai as og

from inferwire.core.prepared import PreparedRequest
from inferwire.core.sampling import GenerationParams

# The engine's setter for each search option (the generator's names).
_TURN_SETTERS: dict[str, Callable[[og.TurnOptions, Any], None]] = {
    "do_sample": og.TurnOptions.set_do_sample,
    "temperature": og.TurnOptions.set_temperature,
    "top_p": og.TurnOptions.set_top_p,
    "top_k": og.TurnOptions.set_top_k,
    "random_seed": og.TurnOptions.set_seed,
}
# Seeds for generators whose request sets none (seeded from the OS at import).
_SEEDS = random.Random()
_SEED_LIMIT = 2**31  # ORT GenAI takes a signed 32-bit seed


@dataclass(frozen=True)
class SearchOptions:
    """How a request samples, in ORT GenAI's terms; None keeps the model's default."""

    do_sample: bool
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # as ORT GenAI takes it: 1 to the vocabulary size
    seed: int | None = None

    @classmethod
    def of(
        cls, params: GenerationParams, do_sample_default: bool, vocab_size: int
    ) -> SearchOptions:
        """The settings for `params` on a model whose configuration samples or not by default."""
        do_sample = do_sample_default if params.temperature is None else params.temperature != 0
        if not do_sample:
            # The engine refuses sampling options on a greedy turn; the generator ignores them.
            return cls(False, seed=params.seed)
        # Our top_k 0 means no limit, and so does one past the vocabulary, which ORT GenAI
        # refuses: both become the vocabulary size.
        top_k = None if params.top_k is None else min(params.top_k, vocab_size) or vocab_size
        return cls(True, params.temperature, params.top_p, top_k, params.seed)

    def options(self) -> dict[str, Any]:
        """The settings that are set, as ORT GenAI's search options."""
        chosen = {
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "random_seed": self.seed,
        }
        return {name: value for name, value in chosen.items() if value is not None}

    def search_options(self, max_length: int, min_length: int = 0) -> dict[str, Any]:
        """For an `og.Generator` of one sequence of at most `max_length` tokens, whose
        end-of-sequence tokens are masked while it is shorter than `min_length` (both count
        the prompt; 0: no minimum)."""
        options = {"max_length": max_length, "batch_size": 1, **self.options()}
        # Unset, ORT GenAI seeds every generator from std::random_device, whose RDSEED loop
        # spins where that instruction is slow (virtual machines): 12 ms a request on the
        # 2-vCPU VM, most of the bundled model's time to first token (docs/performance.md).
        # A seed drawn here samples as randomly; a greedy request never reads it.
        options.setdefault("random_seed", _SEEDS.randrange(_SEED_LIMIT))
        if min_length:
            options["min_length"] = min_length
        return options

    def turn_options(
        self, request: og.Request, max_generated_tokens: int, min_generated_tokens: int = 0
    ) -> og.TurnOptions:
        """For a turn of `request` on the engine, which generates at most
        `max_generated_tokens` and masks its end-of-sequence tokens until it has generated
        `min_generated_tokens` (0: no minimum); neither counts the prompt."""
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(max_generated_tokens)
        if min_generated_tokens > 0:
            turn.set_min_generated_tokens(min_generated_tokens)
        for name, value in self.options().items():
            _TURN_SETTERS[name](turn, value)
        return turn


PathRequest = PreparedRequest[SearchOptions]  # what either path is handed
