"""The bundled model writes mostly real words, streamed through the running server.

`tests/data/demo_words.txt` holds every distinct word of the model's training works
(written by scripts/train_demo_model.py from the corpus, never from generated text).
The random-weight model this one replaced scores 18.6% here (the trained one 96.5%); see
server/inferwire/models/demo/MODEL_CARD.md.
"""

from __future__ import annotations

import string
from pathlib import Path

from inferwire.v1 import inference_pb2 as pb

WORDS_FILE = Path(__file__).resolve().parents[1] / "data" / "demo_words.txt"
# Keep these in sync with WORD_TEST_* in scripts/train_demo_model.py.
PROMPTS = ["ROMEO:", "To be, or not", "KING HENRY:", "JULIET:", "First Citizen:"]
SEEDS = [11, 22, 33, 44, 55]
MAX_TOKENS = 64
TEMPERATURE = 0.8
TOP_P = 0.95
THRESHOLD = 0.70
_PUNCTUATION = string.punctuation + "\u2018\u2019\u201c\u201d"


def normalize_words(text: str) -> list[str]:
    """Whitespace-separated words, lower-cased, stripped of surrounding punctuation."""
    words = []
    for raw in text.replace("--", " ").split():
        word = raw.strip(_PUNCTUATION).lower()
        if word:
            words.append(word)
    return words


async def complete(stub, model: str, prompt: str, seed: int | None) -> pb.InferStreamResponse:
    """One streamed completion; returns the last message with the joined text in `text`."""
    if seed is None:
        parameters = pb.GenerationParameters(max_tokens=MAX_TOKENS, temperature=0)
    else:
        parameters = pb.GenerationParameters(
            max_tokens=MAX_TOKENS, temperature=TEMPERATURE, top_p=TOP_P, seed=seed
        )
    request = pb.InferStreamRequest(model=model, prompt=prompt, parameters=parameters)
    messages = [message async for message in stub.InferStream(request)]
    last = pb.InferStreamResponse()
    last.CopyFrom(messages[-1])
    last.text = "".join(message.text for message in messages)
    return last


CASES = [(prompt, None) for prompt in PROMPTS] + list(zip(PROMPTS, SEEDS, strict=True))


async def word_score(stub, model: str = "demo") -> tuple[float, int, list[str], list[int]]:
    """Over the 10 completions: (share of known words, words, completions, token counts)."""
    vocabulary = set(WORDS_FILE.read_text().split())
    known = total = 0
    completions, token_counts = [], []
    for prompt, seed in CASES:
        last = await complete(stub, model, prompt, seed)
        words = normalize_words(last.text)
        known += sum(word in vocabulary for word in words)
        total += len(words)
        completions.append(f"{prompt!r} (seed {seed}): {last.text!r}")
        token_counts.append(last.usage.completion_tokens)
    return known / max(total, 1), total, completions, token_counts


async def test_generated_text_is_mostly_real_words(stub):
    score, total, completions, token_counts = await word_score(stub)
    print(f"demo word test: {score:.1%} of {total} words are in the training word list")
    assert token_counts == [MAX_TOKENS] * len(CASES), "\n".join(completions)
    # 10 completions of 64 tokens hold far more words than this; fewer means the
    # detokenized stream lost its spaces or the model emits mostly punctuation.
    assert total >= 200, f"only {total} words in 10 completions:\n" + "\n".join(completions)
    assert score >= THRESHOLD, (
        f"only {score:.1%} of {total} generated words are in the word list "
        f"(need {THRESHOLD:.0%}):\n" + "\n".join(completions)
    )
