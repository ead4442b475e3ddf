"""`python -m bench.int8_kernels`: which ONNX Runtime kernels could batch SmolLM2 faster on
this CPU, and what each costs in quality. Graph variants of the int4 import (`make
smollm2`), the same weights in each:

- `int4`: the import as it is (MatMulNBits, int8 compute: accuracy_level 4; the baseline);
- `int4_fp32`: MatMulNBits with fp32 compute (accuracy_level 1);
- `dequantized`: every int4 weight dequantized into an fp32 MatMul (the int4 weights'
  exact values: the quality reference);
- `int8`: `dequantized` quantized by onnxruntime.quantization.quantize_dynamic (int8
  weights per channel, activations per tensor as each MatMul runs: MLAS's QGEMM, which
  has AMX and VNNI kernels);
- `int8_mixed`: the same with the MLP's down projection and the LM head kept int4.

Each runs in continuous/decoder.py's Decoder on one thread of CPU 0: a 60-token prefill,
then decode steps of 1, 8 and 32 rows at position 60 (ms a step, best of rounds that
alternate the variants); and greedy 40 tokens on 16 chat prompts, alone and 8 at once,
against `dequantized` alone (tokens until the first difference, mean; texts identical).
Writes bench/results/int8_kernels.{json,md}. About 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from tokenizers import Tokenizer

from bench.closed_loop import SENTENCES
from bench.common import (
    RESULTS,
    RunOptions,
    ScenarioResult,
    markdown_table,
    write_json,
    write_markdown,
)
from inferwire.backends.ort_genai.continuous.decoder import Decoder
from scripts.smollm2 import MODELS

ROWS = (1, 8, 32)
TOKENS = 40
KEPT_INT4 = ("down_proj", "lm_head")


def _folder(scratch: Path, name: str, source: Path) -> Path:
    folder = scratch / name
    folder.mkdir()
    for file in source.iterdir():
        if not file.name.startswith("model.onnx"):
            shutil.copy(file, folder)
    return folder


def _with_accuracy(source: Path, folder: Path, level: int) -> None:
    model = onnx.load(str(source / "model.onnx"))
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = level
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True)


def _dequantized(source: Path, folder: Path, keep: tuple[str, ...]) -> None:
    """Every MatMulNBits but those whose name has a `keep` part as an fp32 MatMul of its
    dequantized weight ((q - zero point) x block scale, 4-bit, low nibble first)."""
    model = onnx.load(str(source / "model.onnx"))
    weights = {i.name: i for i in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or any(part in node.name for part in keep):
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
        packed = numpy_helper.to_array(weights[node.input[1]]).reshape(n, -1)
        values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)
        blocks = values.shape[1] // block
        scales = numpy_helper.to_array(weights[node.input[2]]).reshape(n, blocks)
        zero = np.full((n, blocks), 8.0, np.float32)
        if len(node.input) > 3 and node.input[3]:
            zp = numpy_helper.to_array(weights[node.input[3]]).reshape(n, -1)
            zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks]
        grid = values.reshape(n, blocks, block).astype(np.float32) - zero[:, :, None]
        dense = (grid * scales[:, :, None].astype(np.float32)).reshape(n, -1)[:, :k]
        name = f"{node.input[1]}/dequantized"
        model.graph.initializer.append(numpy_helper.from_array(dense.T.copy(), name))
        nodes.append(helper.make_node("MatMul", [node.input[0], name], list(node.output)))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in model.graph.node for name in node.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True)


def _int8(dense: Path, folder: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        dense / "model.onnx",
        folder / "model.onnx",
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        use_external_data_format=True,
        extra_options={"MatMulConstBOnly": True},
    )


def build(scratch: Path, source: Path) -> dict[str, Path]:
    """The variants' folders (see the module's docstring), made under `scratch`."""
    _with_accuracy(source, _folder(scratch, "int4_fp32", source), 1)
    for name, keep in (("dequantized", ()), ("mixed_dense", KEPT_INT4)):
        _dequantized(source, _folder(scratch, name, source), keep)
    for name, dense in (("int8", "dequantized"), ("int8_mixed", "mixed_dense")):
        _int8(scratch / dense, _folder(scratch, name, source))
    variants = ("int4_fp32", "dequantized", "int8", "int8_mixed")
    return {"int4": source, **{name: scratch / name for name in variants}}


def _decoder(folder: Path) -> Decoder:
    config = json.loads((folder / "genai_config.json").read_text())
    return Decoder(folder, config, threads=1, slots=max(ROWS) + 1, slot_tokens=512)


def speed(decoder: Decoder) -> dict[str, float]:
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, 60)] for _ in range(max(ROWS))]
    started = time.perf_counter()
    decoder.prefill(0, prompts[0], 0)
    cell = {"prefill_60_ms": (time.perf_counter() - started) * 1000}
    for row, prompt in enumerate(prompts[1:], 1):
        decoder.prefill(row, prompt, 0)
    for rows in ROWS:
        tokens, lengths = np.full(rows, 1234, np.int64), np.full(rows, 60, np.int64)
        decoder.decode(tokens, lengths)
        started = time.perf_counter()
        for _ in range(16):
            decoder.decode(tokens, lengths)
        cell[f"step_{rows}_ms"] = (time.perf_counter() - started) * 1000 / 16
    return cell


def greedy(decoder: Decoder, prompts: list[list[int]], together: int) -> list[list[int]]:
    texts: list[list[int]] = []
    for start in range(0, len(prompts), together):
        group = prompts[start : start + together]
        tokens = [int(decoder.prefill(row, p, 0).argmax()) for row, p in enumerate(group)]
        lengths = np.array([len(p) for p in group], np.int64)
        out = [[t] for t in tokens]
        for _ in range(TOKENS - 1):
            logits = decoder.decode(np.array(tokens, np.int64), lengths)
            lengths += 1
            tokens = [int(t) for t in logits.argmax(-1)]
            for text, token in zip(out, tokens, strict=True):
                text.append(token)
        texts += out
    return texts


def _agreeing(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def chat_prompts() -> list[list[int]]:
    """16 chat prompts of 4 closed_loop sentences each, as SmolLM2's ids (the same every run)."""
    tokenizer = Tokenizer.from_file(str(MODELS / "smollm2" / "tokenizer.json"))
    pick = random.Random(3)
    return [
        tokenizer.encode(
            f"<|im_start|>user\n{' '.join(pick.sample(SENTENCES, 4))}<|im_end|>\n"
            "<|im_start|>assistant\n"
        ).ids
        for _ in range(16)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {0})
    source = MODELS / "smollm2"
    prompts = chat_prompts()
    with tempfile.TemporaryDirectory() as scratch:
        folders = build(Path(scratch), source)
        decoders = {name: _decoder(folder) for name, folder in folders.items()}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in decoders}
        for index in range(args.rounds):
            for name in list(decoders)[:: 1 if index % 2 == 0 else -1]:
                rounds[name].append(speed(decoders[name]))
        texts = {
            name: {"alone": greedy(d, prompts, 1), "eight": greedy(d, prompts, 8)}
            for name, d in decoders.items()
        }
    reference = texts["dequantized"]["alone"]
    rows: list[list[str]] = []
    data: dict[str, dict[str, Any]] = {}
    for name in decoders:
        best = {key: min(r[key] for r in rounds[name]) for key in rounds[name][0]}
        quality = {
            mode: [_agreeing(t, r) for t, r in zip(texts[name][mode], reference, strict=True)]
            for mode in ("alone", "eight")
        }
        alone_vs_eight = [
            _agreeing(a, b) for a, b in zip(texts[name]["alone"], texts[name]["eight"], strict=True)
        ]
        data[name] = {
            "best": best,
            "rounds": rounds[name],
            "agreeing": quality,
            "alone_vs_eight": alone_vs_eight,
        }
        rows.append(
            [
                name,
                f"{best['prefill_60_ms']:.0f}",
                *(
                    f"{best[f'step_{n}_ms']:.1f} ({n / best[f'step_{n}_ms'] * 1000:.0f}/s)"
                    for n in ROWS
                ),
                *(
                    f"{np.mean(quality[m]):.1f}, {sum(q == TOKENS for q in quality[m])}/16"
                    for m in ("alone", "eight")
                ),
                f"{sum(q == TOKENS for q in alone_vs_eight)}/16",
            ]
        )
    header = [
        "graph",
        "prefill 60 ms",
        *(f"step of {n} ms (tokens/s)" for n in ROWS),
        "greedy alone vs reference (mean agreeing, identical)",
        "greedy 8 at once vs reference",
        "alone = 8 at once",
    ]
    result = ScenarioResult(
        name="int8_kernels",
        title="ONNX Runtime kernels for SmolLM2's decoder on one thread: int4 against int8",
        baseline="the int4 import as it is (MatMulNBits, accuracy_level 4)",
        data=data,
        ratios={
            f"{name}_step_32_over_int4": data[name]["best"]["step_32_ms"]
            / data["int4"]["best"]["step_32_ms"]
            for name in decoders
        },
        table_header=header,
        table_rows=rows,
        targets=[],
        notes=[f"reference: `dequantized` alone, {TOKENS} greedy tokens on 16 chat prompts"],
    )
    options = RunOptions(quick=False, out_dir=args.out)
    write_json(options, result, {})
    write_markdown(options, result)
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
