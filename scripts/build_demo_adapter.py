"""Build the Sonnets LoRA adapter of the bundled `demo` model and its adapter-ready base.

Training-only: needs torch and onnx, never installed with inferwire. Run it from a venv
of its own (docs/adapters.md#the-bundled-adapter says which versions):

    .cache/trainenv/bin/python scripts/build_demo_adapter.py --out server/inferwire/models/demo

It reads the shipped model.onnx, trains the adapter (scripts/demo_model/adapter.py),
writes the adapter-ready model.onnx(.data) and sonnets.onnx_adapter into --out, checks
that the base's greedy output is unchanged, and measures the adapter's effect on 50
held-out Sonnets: the share of greedy outputs with a `NAME:` speaker line, base vs
adapter. The numbers go to --out/ADAPTER_RESULTS.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnxruntime_genai as og  # noqa: E402
import torch  # noqa: E402

from scripts.demo_model import adapter as lora  # noqa: E402
from scripts.demo_model.corpus import prepare_corpus  # noqa: E402

SEED = 20261201
HELDOUT = 50
MAX_TOKENS = 64
ADAPTER_FILE = "sonnets.onnx_adapter"
# Prompts whose base greedy output must not change (README and the word test).
FIXED_PROMPTS = ["To be, or not", "ROMEO:", "KING HENRY:", "JULIET:", "First Citizen:", "Hello"]


def sonnets(text: str) -> list[str]:
    """The 154 sonnets, each without its roman-numeral heading."""
    parts = re.split(r"\n\s*[IVXLC]+\s*\n", "\n" + text)
    return [p.strip("\n") for p in parts[1:] if p.strip()]


def greedy(model_dir: Path, prompts: list[str], adapter: Path | None) -> list[str]:
    model = og.Model(str(model_dir))
    tokenizer = og.Tokenizer(model)
    adapters = None
    if adapter is not None:
        adapters = og.Adapters(model)
        adapters.load(str(adapter), "sonnets")
    outputs = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + MAX_TOKENS)
        generator = og.Generator(model, params)
        if adapters is not None:
            generator.set_active_adapter(adapters, "sonnets")
        generator.append_tokens(ids)
        tokens = []
        while not generator.is_done() and len(tokens) < MAX_TOKENS:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token == 0:
                break
            tokens.append(token)
        outputs.append(tokenizer.decode(np.array(tokens, dtype=np.int32)))
    return outputs


def speaker_share(outputs: list[str]) -> float:
    return sum(bool(lora.SPEAKER_LINE.search(o)) for o in outputs) / len(outputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "adapter-work")
    parser.add_argument("--steps", type=int, default=lora.TrainSettings.steps)
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.work.mkdir(parents=True, exist_ok=True)
    source = REPO / "server" / "inferwire" / "models" / "demo"
    base_copy = args.work / "base"
    if not (base_copy / "model.onnx").exists():  # the shipped base, before this script
        shutil.copytree(source, base_copy, dirs_exist_ok=True)
    log = print

    corpus = prepare_corpus(args.work)
    poems = sonnets(corpus.works["sonnets_gut"])
    assert len(poems) == 154, len(poems)
    order = list(range(len(poems)))
    random.Random(SEED).shuffle(order)
    heldout, train_ids_of = sorted(order[:HELDOUT]), sorted(order[HELDOUT:])
    tokenizer = og.Tokenizer(og.Model(str(base_copy)))
    train_text = "\n\n".join(poems[i] for i in train_ids_of)
    heldout_text = "\n\n".join(poems[i] for i in heldout)
    train_ids = [int(t) for t in tokenizer.encode(train_text)]
    heldout_ids = [int(t) for t in tokenizer.encode(heldout_text)]
    log(f"sonnets: {len(train_ids_of)} to train on ({len(train_ids)} tokens), {HELDOUT} held out")

    model = lora.LoraLlama(lora.read_weights(base_copy), SEED)
    settings = lora.TrainSettings(steps=args.steps, seed=SEED)
    before = lora.mean_nll(model, heldout_ids, 256, lora=False)
    started = time.perf_counter()
    losses = lora.train(model, train_ids, settings, log)
    train_s = time.perf_counter() - started
    after = lora.mean_nll(model, heldout_ids, 256, lora=True)
    log(f"held-out Sonnets perplexity: base {np.exp(before):.1f}, adapter {np.exp(after):.1f}")

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "demo"
        shutil.copytree(base_copy, staged, ignore=shutil.ignore_patterns("model.onnx*"))
        inputs = lora.adapter_ready(base_copy, staged)
        adapter_path = staged / ADAPTER_FILE
        lora.write_adapter(model.adapter_arrays(), adapter_path)

        fixed_before = greedy(base_copy, FIXED_PROMPTS, None)
        fixed_after = greedy(staged, FIXED_PROMPTS, None)
        unchanged = fixed_before == fixed_after
        log(f"base greedy output unchanged on {len(FIXED_PROMPTS)} prompts: {unchanged}")
        prompts = [poems[i].split("\n")[0] + "\n" for i in heldout]
        base_out = greedy(staged, prompts, None)
        adapter_out = greedy(staged, prompts, adapter_path)
        shares = speaker_share(base_out), speaker_share(adapter_out)
        log(f"outputs with a NAME: speaker line: base {shares[0]:.0%}, adapter {shares[1]:.0%}")
        if not unchanged:
            for a, b in zip(fixed_before, fixed_after, strict=True):
                if a != b:
                    log(f"changed: {a!r} -> {b!r}")
        for name in ("model.onnx", "model.onnx.data", ADAPTER_FILE):
            shutil.copy2(staged / name, args.out / name)
    results = {
        "rank": lora.RANK,
        "alpha": lora.ALPHA,
        "targets": list(lora.TARGETS),
        "adapter_inputs": len(inputs),
        "train_sonnets": len(train_ids_of),
        "train_tokens": len(train_ids),
        "steps": settings.steps,
        "batch": settings.batch,
        "window": settings.window,
        "train_seconds": round(train_s, 1),
        "final_train_loss": round(float(np.mean(losses[-25:])), 3),
        "heldout_sonnets": HELDOUT,
        "heldout_perplexity": {
            "base": round(float(np.exp(before)), 2),
            "adapter": round(float(np.exp(after)), 2),
        },
        "speaker_line_share": {"base": shares[0], "adapter": shares[1]},
        "base_greedy_unchanged": unchanged,
        "examples": [
            {"prompt": p, "base": b, "adapter": a}
            for p, b, a in list(zip(prompts, base_out, adapter_out, strict=True))[:3]
        ],
    }
    (args.out / "ADAPTER_RESULTS.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if unchanged and shares[1] <= shares[0] / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
