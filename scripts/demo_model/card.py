"""Stage 6: MODEL_CARD.md, from MODEL_CARD.md.template and the facts of a run.

`facts` is the dict the training script also writes to `<work dir>/facts.json`. The
template is filled with str.format: its fields are the facts, the constants of the
stages, and the few values derived below (table rows and ratios).
"""

from __future__ import annotations

import math
from pathlib import Path

from . import SEED, chat, quality
from .corpus import CORPUS_SDIST, CORPUS_SHA256, CORPUS_SPEC
from .export import REPETITION_PENALTY

TEMPLATE = Path(__file__).with_name("MODEL_CARD.md.template")
_QUANTIZED = (
    "the MatMul weights (attention, MLP, LM head) are {} weight-only "
    "(`MatMulNBits`, block size 32); the embedding table and norms stay fp32. The "
    "held-out perplexity above is measured on this quantized model."
)
# The card's sentence on the exported weights, by the exporter's precision.
PRECISION_NOTES = {
    "int8": _QUANTIZED.format("int8"),
    "int4": _QUANTIZED.format("int4"),
    "fp32": "all weights fp32.",
}


def render_model_card(facts: dict) -> str:
    f = facts
    shape = f["shape"]
    history_rows = "\n".join(
        f"| {step} | {train_loss:.3f} | {held:.3f} | {math.exp(held):.1f} |"
        for step, train_loss, held in f["history"]
    )
    sample_blocks = "\n\n".join(
        f"**{mode}**, prompt `{prompt!r}`:\n\n```text\n{prompt}{text}\n```"
        for mode, prompt, text in f["samples"]
    )
    return TEMPLATE.read_text().format(
        **facts,
        seed=SEED,
        corpus_spec=CORPUS_SPEC,
        corpus_sdist=CORPUS_SDIST,
        corpus_sha256=CORPUS_SHA256,
        repetition_penalty=REPETITION_PENALTY,
        chat_user=chat.USER_SPEAKER,
        chat_assistant=chat.ASSISTANT_SPEAKER,
        chat_template=chat.CHAT_TEMPLATE,
        word_temperature=quality.TEMPERATURE,
        word_top_p=quality.TOP_P,
        word_seeds=quality.SEEDS,
        word_max_tokens=quality.MAX_TOKENS,
        word_threshold=quality.THRESHOLD,
        word_prompts=", ".join(f"`{p}`" for p in quality.PROMPTS),
        pip_install_args=" ".join(f["pins"]),
        params_millions=f["params"] / 1e6,
        head_size=shape["hidden_size"] // shape["num_attention_heads"],
        passes=f["tokens_seen"] / f["train_tokens"],
        perplexity_ratio=f["onnx_ppl"] / f["unigram_ppl"],
        total_megabytes=f["total_bytes"] / 1e6,
        history_rows=history_rows,
        sample_blocks=sample_blocks,
        file_rows="\n".join(f"| `{name}` | {size:,} bytes |" for name, size in f["files"]),
        heldout_works=", ".join(f"{f['titles'][n]} (`{n}`)" for n in f["heldout"]),
    )


def write_model_card(path: Path, facts: dict) -> None:
    path.write_text(render_model_card(facts))
