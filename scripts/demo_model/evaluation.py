"""Stage 5: held-out perplexity (torch and ONNX) and the word test on an exported model."""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import quality


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
