"""The word test: what the bundled model must write, shared by the training script and
tests/engine/test_demo_quality.py.

Ten completions (five greedy, five sampled) of the prompts below; at least THRESHOLD of
their words, normalised by `normalize_words`, must be in WORDS_FILE, the distinct words
of the training works.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from . import REPO

WORDS_FILE = REPO / "tests/data/demo_words.txt"
PROMPTS = ["ROMEO:", "To be, or not", "KING HENRY:", "JULIET:", "First Citizen:"]
SEEDS = [11, 22, 33, 44, 55]
MAX_TOKENS = 64
TEMPERATURE = 0.8
TOP_P = 0.95
THRESHOLD = 0.70
# (prompt, seed): greedy first (seed None), then sampled.
CASES: list[tuple[str, int | None]] = [(prompt, None) for prompt in PROMPTS] + list(
    zip(PROMPTS, SEEDS, strict=True)
)
_PUNCTUATION = string.punctuation + "\u2018\u2019\u201c\u201d"


def normalize_words(text: str) -> list[str]:
    """Whitespace-separated words, lower-cased, stripped of surrounding punctuation."""
    words = []
    for raw in text.replace("--", " ").split():
        word = raw.strip(_PUNCTUATION).lower()
        if word:
            words.append(word)
    return words


def known_share(texts: Iterable[str], vocabulary: set[str]) -> tuple[float, int]:
    """(share of the texts' words that are in `vocabulary`, number of words)."""
    known = total = 0
    for text in texts:
        words = normalize_words(text)
        known += sum(word in vocabulary for word in words)
        total += len(words)
    return known / max(total, 1), total
