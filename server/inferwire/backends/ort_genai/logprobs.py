"""Log-probabilities of generated tokens, from the logits ORT GenAI computes at each step.

They are the log-probabilities of the distribution the sampler chose from, so the
sampler's own processing is repeated here, in its order (`Generator::GenerateNextToken`
in onnxruntime-genai 0.18):

1. The minimum length (min_tokens, ignore_eos): until the sequence has it, every
   end-of-sequence id is masked (its probability is 0).
2. The repetition penalty of the model's configuration: for every token id already in
   the sequence, prompt included, a negative logit is multiplied by the penalty and a
   positive one divided by it (CTRL's rule, applied once per distinct id).
3. When sampling, the temperature divides the logits; greedy decoding uses none.

top_k and top_p truncation are not applied: the log-probabilities are over the whole
vocabulary, as most engines report them. Under greedy decoding the chosen token is
therefore always the most likely one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from inferwire.core.results import TokenLogprob, TopLogprob


@dataclass(frozen=True)
class SamplerSettings:
    """What of the sampler's processing changes the distribution a token is chosen from."""

    repetition_penalty: float
    temperature: float | None  # None: greedy decoding, no temperature

    @classmethod
    def of(cls, search_defaults: dict[str, Any], options: dict[str, Any]) -> SamplerSettings:
        """The effective settings from the model's search defaults and a request's options."""
        settings = {**search_defaults, **options}
        greedy = not settings.get("do_sample", False) or settings.get("top_k", 50) == 1
        return cls(
            repetition_penalty=float(settings.get("repetition_penalty", 1.0)),
            temperature=None if greedy else float(settings.get("temperature", 1.0)),
        )


class TokenLogprobs:
    """Follows one sequence; turns each step's logits into the chosen token's TokenLogprob."""

    def __init__(
        self,
        vocab_size: int,
        prompt_ids: Iterable[int],
        sampler: SamplerSettings,
        top: int,
        token_text: Callable[[int], str],
        masked: Iterable[int] = (),
        masked_steps: int = 0,
    ) -> None:
        """`masked`: the ids (end of sequence) masked for the first `masked_steps` tokens."""
        self._in_sequence = np.zeros(vocab_size, dtype=bool)
        self._in_sequence[np.fromiter(prompt_ids, dtype=np.int64)] = True
        self._masked = np.fromiter(masked, dtype=np.int64)
        self._masked_steps = masked_steps
        self._steps = 0
        self._penalty = np.float32(sampler.repetition_penalty)
        self._temperature = sampler.temperature
        self._top = top
        self._token_text = token_text

    def distribution(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """Log-probabilities over the vocabulary for the next token, from its raw logits."""
        scores = logits.reshape(-1).astype(np.float32, copy=True)
        if self._steps < self._masked_steps:
            scores[self._masked] = -np.inf
        self._steps += 1
        if self._penalty != 1:
            seen = scores[self._in_sequence]
            # In float32, as the engine computes it, so greedy ties break alike.
            scores[self._in_sequence] = np.where(
                seen < 0, seen * self._penalty, seen / self._penalty
            )
        values = scores.astype(np.float64)
        if self._temperature is not None:
            values /= self._temperature
        shifted = values - values.max()
        return shifted - np.log(np.exp(shifted).sum())

    def entry(self, logprobs: npt.NDArray[np.float64], token: int) -> TokenLogprob:
        """The chosen token's entry, with the most likely alternatives, most likely first."""
        self._in_sequence[token] = True
        top: tuple[TopLogprob, ...] = ()
        if self._top:
            candidates = np.argpartition(-logprobs, self._top - 1)[: self._top]
            ranked = candidates[np.argsort(-logprobs[candidates], kind="stable")]
            top = tuple(
                TopLogprob(self._token_text(int(i)), int(i), float(logprobs[i])) for i in ranked
            )
        return TokenLogprob(self._token_text(token), token, float(logprobs[token]), top)


class TokenTexts:
    """Each token id's own text, decoded once per model; partial UTF-8 reads as U+FFFD."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._decode([token])
        return text
