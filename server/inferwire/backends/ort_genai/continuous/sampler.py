"""Choosing a row's next token from its logits, with every sampling parameter the core's
record holds, applied in one order (vLLM's, and ORT GenAI's for what it has):

1. `logit_bias` added;
2. the end-of-sequence ids masked while the output is shorter than its minimum
   (min_tokens, or all of max_tokens with ignore_eos);
3. the constraint's mask (guidance.py): what the grammar does not allow next;
4. the repetition penalty (CTRL's: a positive logit divided by it, a negative one
   multiplied, once per distinct id of the prompt and the output);
5. the presence and frequency penalties (OpenAI's: minus presence once per id the output
   holds, minus frequency per occurrence);
6. the temperature (below `GREEDY_BELOW`: greedy, the highest score; vLLM's rule, since
   dividing by a vanishing temperature overflows).
The log-probabilities are those of this distribution (before top-k and top-p truncation,
as most engines report them), so a greedy token is always the most likely alternative.
Then top-k, top-p and a draw from the row's own generator (PCG64, seeded by the request's
seed): a seeded request's tokens depend on its logits alone, and a row's logits do not
depend on its batch-mates (decoder.py), so a seed reproduces beside any other traffic.

A row with none of 1-5, greedy and without log-probabilities is `plain`: the step loop
takes the argmax of all such rows at once, without copying their logits.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from inferwire.core.results import TokenLogprob, TopLogprob
from inferwire.core.sampling import GenerationParams

Scores = npt.NDArray[np.float32]
_LARGEST = np.finfo(np.float32).max
_SEEDS = random.Random()
TOP_P_PREFIX = 1024  # ids sorted first for top-p alone (sampler._draw)
GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's _SAMPLING_EPS)
# An alternative the constraint or the minimum length forbids has no probability; its
# log-probability is reported as this (vLLM's), since JSON has no -Infinity.
IMPOSSIBLE_LOGPROB = -9999.0


class RowSampler:
    """One request's choice of tokens (one choice's, with `n`); used by the step loop only."""

    def __init__(
        self,
        params: GenerationParams,
        prompt_ids: Iterable[int],
        eos_ids: frozenset[int],
        min_tokens: int,
        token_text: Callable[[int], str],
        seed_offset: int = 0,
    ) -> None:
        """`params` with the model's defaults filled in (core/generation.py); `seed_offset`:
        the choice's index, so `n` choices of one seed differ and each reproduces."""
        temperature = params.temperature or 0.0
        self.temperature = temperature if temperature >= GREEDY_BELOW else 0.0
        self.top_k = params.top_k or 0
        self.top_p = params.top_p if params.top_p is not None else 1.0
        seed = params.seed if params.seed is not None else _SEEDS.getrandbits(64)
        self._random = np.random.Generator(np.random.PCG64(seed + seed_offset))
        self._eos = np.fromiter(sorted(eos_ids), dtype=np.int64)
        self.min_tokens = min_tokens
        bias = dict(params.logit_bias)
        self._bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self._bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._repetition = np.float32(params.repetition_penalty or 1.0)
        self._presence = np.float32(params.presence_penalty or 0.0)
        self._frequency = np.float32(params.frequency_penalty or 0.0)
        self._seen: set[int] = set(prompt_ids) if self._repetition != 1 else set()
        self._counts: collections.Counter[int] = collections.Counter()
        self.logprobs, self.top_logprobs = params.logprobs, params.top_logprobs
        self._token_text = token_text
        self.generated = 0
        self.plain = (
            self.temperature == 0
            and not bias
            and self._repetition == 1
            and not self._presence
            and not self._frequency
            and not self.logprobs
        )

    def masks_eos(self) -> bool:
        return self.generated < self.min_tokens

    def scores(self, logits: Scores, constrain: Callable[[Scores], None] | None) -> Scores:
        """Steps 1 to 5 on a copy of the row's logits; `constrain` applies step 3."""
        scores = logits.astype(np.float32, copy=True)
        if len(self._bias_ids):
            scores[self._bias_ids] += self._bias
        if self.masks_eos():
            scores[self._eos] = -np.inf
        if constrain is not None:
            constrain(scores)
        if self._seen:
            ids = np.fromiter(self._seen, dtype=np.int64, count=len(self._seen))
            seen = scores[ids]
            penalized = np.where(seen < 0, seen * self._repetition, seen / self._repetition)
            # A penalty near 0 or huge overflows float32; an infinite score would make the
            # distribution NaN, so it stays the largest finite one.
            scores[ids] = np.clip(penalized, -_LARGEST, _LARGEST)
        if self._counts and (self._presence or self._frequency):
            ids = np.fromiter(self._counts, dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(ids))
            scores[ids] -= self._presence + self._frequency * counts
        return scores

    def choose(self, scores: Scores) -> tuple[int, TokenLogprob | None]:
        """The next token from `scores` (steps 1-5 applied), and its log-probability entry
        when the request asked for them."""
        logprobs = self._log_distribution(scores) if self.logprobs else None
        token = int(np.argmax(scores)) if self.temperature == 0 else self._draw(scores)
        entry = None if logprobs is None else self._entry(logprobs, token)
        return token, entry

    def taken(self, token: int) -> None:
        """`token` is the row's next: the penalties count it."""
        self.generated += 1
        if self._repetition != 1:
            self._seen.add(token)
        if self._presence or self._frequency:
            self._counts[token] += 1

    def _log_distribution(self, scores: Scores) -> npt.NDArray[np.float64]:
        values = scores.astype(np.float64)
        if self.temperature:
            values /= self.temperature
        shifted = values - values.max()
        return shifted - np.log(np.exp(shifted).sum())

    def _draw(self, scores: Scores) -> int:
        """A draw from the tempered distribution, truncated by top-k, then top-p (over what
        top-k kept, renormalised), by inverse transform of one uniform number."""
        values = scores.astype(np.float64) / self.temperature
        weights = np.exp(values - values.max())  # a masked token (-inf) weighs 0
        uniform = self._random.random()
        top_k = self.top_k if self.top_k < len(values) else 0  # past the vocabulary: none
        if not top_k and self.top_p >= 1:  # the whole vocabulary, in id order
            cumulative = np.cumsum(weights)
            return int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
        if top_k:
            order = _highest(values, top_k)
            mass = np.cumsum(weights[order])
            mass /= mass[-1]
        else:
            # top-p alone: the highest TOP_P_PREFIX ids hold the mass almost always; all
            # of them are sorted only when they do not.
            order = _highest(values, TOP_P_PREFIX)
            mass = np.cumsum(weights[order]) / weights.sum()
            if mass[-1] < self.top_p:
                order = np.argsort(-values, kind="stable")
                mass = np.cumsum(weights[order]) / weights.sum()
        if self.top_p < 1:
            keep = min(int(np.searchsorted(mass, self.top_p)) + 1, len(order))
            order, mass = order[:keep], mass[:keep] / mass[keep - 1]
        index = int(np.searchsorted(mass, uniform, side="right"))
        return int(order[min(index, len(order) - 1)])

    def _entry(self, logprobs: npt.NDArray[np.float64], token: int) -> TokenLogprob:
        top: tuple[TopLogprob, ...] = ()
        if self.top_logprobs:
            count = self.top_logprobs
            candidates = np.argpartition(-logprobs, count - 1)[:count]
            ranked = candidates[np.argsort(-logprobs[candidates], kind="stable")]
            top = tuple(
                TopLogprob(self._token_text(int(i)), int(i), _reported(logprobs[i])) for i in ranked
            )
        return TokenLogprob(self._token_text(token), token, _reported(logprobs[token]), top)


def _reported(logprob: np.float64) -> float:
    return max(float(logprob), IMPOSSIBLE_LOGPROB)


def _highest(values: npt.NDArray[np.float64], count: int) -> npt.NDArray[np.int64]:
    """The ids of the `count` highest values, highest first (ties by id)."""
    if count >= len(values):
        return np.argsort(-values, kind="stable")
    ids = np.argpartition(-values, count - 1)[:count]
    order: npt.NDArray[np.int64] = ids[np.lexsort((ids, -values[ids]))]
    return order


def greedy_tokens(logits: Scores) -> npt.NDArray[np.int64]:
    """The argmax of each row of `logits` (the plain rows' choice)."""
    return logits.argmax(axis=1)
