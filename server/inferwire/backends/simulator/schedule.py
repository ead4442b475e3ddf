"""The simulator's text and timing: pure functions of the request and the options.

Every token is one word from a fixed vocabulary with a leading space (`" word"`), so a
text's token count is its count of spaces, and the prompt's token count is its count of
whitespace-separated words. Words come from a PRNG seeded by the request's seed, or by
a hash of the prompt when it has none; the timing's jitter comes from a second PRNG
seeded alike, so the text does not depend on the timing options.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from dataclasses import dataclass

VOCABULARY = (
    "the", "a", "model", "token", "stream", "gateway", "request", "reply", "server", "client",
    "fast", "slow", "quiet", "steady", "simple", "small", "large", "first", "next", "last",
    "runs", "sends", "reads", "waits", "ends", "starts", "serves", "counts", "keeps", "holds",
    "and", "or", "but", "so", "then", "while", "when", "as", "of", "to",
    "in", "on", "at", "by", "for", "with", "from", "over", "under", "after",
    "time", "load", "queue", "batch", "word", "text", "line", "step", "turn", "note",
    "one", "two", "three", "many",
)  # fmt: skip
_JITTER_STREAM = 0x5EED  # separates the jitter's PRNG from the words' for the same seed


def prompt_tokens(text: str) -> int:
    """The simulator's token count of a prompt: its whitespace-separated words."""
    return len(text.split())


def token_ids(text: str) -> list[int]:
    """Token ids for Tokenize: one per word, a stable hash of the word."""
    return [zlib.crc32(word.encode()) & 0x7FFFFFFF for word in text.split()]


def request_seed(seed: int | None, prompt: str) -> int:
    """The request's seed, or one derived from its prompt (same prompt, same text)."""
    if seed is not None:
        return seed
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big")


class Words:
    """The deterministic word stream of one request."""

    def __init__(self, seed: int) -> None:
        self._choice = random.Random(seed).choice

    def next(self) -> str:
        return " " + self._choice(VOCABULARY)

    def __iter__(self) -> Words:
        return self

    def __next__(self) -> str:
        return self.next()


@dataclass(frozen=True)
class TokenPace:
    """When tokens are due, in seconds after the request started generating."""

    time_to_first_token_s: float
    inter_token_s: float
    jitter_s: float = 0.0


class Schedule:
    """Absolute due times: token i at `start + ttft + i * itl + jitter_i`, never before token
    i - 1. Absolute, so a consumer that is late sees the tokens due meanwhile at once
    instead of the whole schedule shifting by its delay."""

    def __init__(self, pace: TokenPace, start: float, seed: int) -> None:
        self._first = start + pace.time_to_first_token_s
        self._step = pace.inter_token_s
        self._jitter = pace.jitter_s
        self._random = random.Random(seed ^ _JITTER_STREAM).random if pace.jitter_s else None
        self._previous = start

    def due(self, index: int) -> float:
        """When token `index` is due; call with 0, 1, 2, ... in order."""
        due = self._first + index * self._step
        if self._random is not None:
            due = max(due + self._random() * self._jitter, self._previous)
        self._previous = due
        return due


def natural_length(
    output_tokens: int | None, max_tokens: int, min_tokens: int = 0
) -> tuple[int, bool]:
    """How many tokens a request generates, and whether it ends by itself (STOP) rather
    than at max_tokens (LENGTH). It cannot end by itself before `min_tokens` (the
    request's min_tokens, or max_tokens with ignore_eos)."""
    if output_tokens is not None and max(output_tokens, min_tokens) < max_tokens:
        return max(output_tokens, min_tokens), True
    return max_tokens, False
