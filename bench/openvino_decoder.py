"""`python -m bench.openvino_decoder`: could OpenVINO's kernels run under the continuous
path's scheduler? The decoder alone, one thread of CPU 0, step by step as loop.py drives it:

- `ort_int4`: continuous/decoder.py's Decoder on the int4 import (`make smollm2`: the
  builder's k_quant requantization of the GGUF, MatMulNBits, accuracy_level 4), as served;
- `openvino_bf16` and `openvino_f32`: OpenVINO's paged-attention model of the GGUF itself
  (bench/openvino_paged.py, run by the OpenVINO venv that engines_smollm2 makes), with the
  CPU plugin's default inference precision (bf16 where the CPU has AMX or AVX-512 BF16)
  and with f32.

Cells: a 60-token prefill (OpenVINO's model computes the LM head on every position, ours
on the last two), decode steps of 1, 8 and 32 rows at position 60, and a 32-row step that
also reads a 60-token prompt (one infer for OpenVINO; a decode and a prefill for ONNX
Runtime, as the loop runs them). Wall and CPU (/proc) ms, each cell its best of rounds that
alternate the engines. Quality: the fp32 import (`make realmodel-models`: the GGUF's
weights dequantized) writes 40 greedy tokens for each of 16 chat prompts; each engine is
fed those texts a token a step and its argmax counted against the next token, alone and
8 rows at once. (Free-running greedy texts part at the first few tokens for both int4
engines: SmolLM2's top two logits are often close.)
Writes bench/results/openvino_decoder.{json,md,png}. About 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.closed_loop import machine_busy_s, process_cpu_s
from bench.common import (
    RESULTS,
    RunOptions,
    ScenarioResult,
    Series,
    machine,
    write_json,
    write_markdown,
    write_plot,
)
from bench.engines_smollm2 import openvino_python
from bench.int8_kernels import chat_prompts
from inferwire.backends.ort_genai.continuous.decoder import Decoder
from scripts.smollm2 import GGUF, MODELS

ROWS = (1, 8, 32)
TOKENS = 40
REPEATS = 16
OPENVINO = {
    "openvino_bf16": {},
    "openvino_f32": {"INFERENCE_PRECISION_HINT": "f32"},
}
PROPERTIES = {
    "INFERENCE_NUM_THREADS": 1,
    "NUM_STREAMS": 1,
    "PERFORMANCE_HINT": "LATENCY",
    "ENABLE_HYPER_THREADING": False,
    "ENABLE_CPU_PINNING": True,
}
MIXED = f"step_{max(ROWS)}_with_prefill_60"


def _decoder(folder: Path) -> Decoder:
    config = json.loads((folder / "genai_config.json").read_text())
    return Decoder(folder, config, threads=1, slots=max(ROWS) + 1, slot_tokens=512)


def _timed(run: Any) -> dict[str, float]:
    run()
    wall, cpu = time.perf_counter(), process_cpu_s()
    for _ in range(REPEATS):
        run()
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000 / REPEATS,
        "cpu_ms": (process_cpu_s() - cpu) * 1000 / REPEATS,
    }


def ort_speed(decoder: Decoder) -> dict[str, dict[str, float]]:
    """bench/openvino_paged.py's cells, run by ONNX Runtime."""
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, 60)] for _ in range(max(ROWS) + 1)]
    cells = {"prefill_60": _timed(lambda: decoder.prefill(0, prompts[0], 0))}
    for row, prompt in enumerate(prompts):
        decoder.prefill(row, prompt, 0)
    for rows in ROWS:
        tokens, lengths = np.full(rows, 1234, np.int64), np.full(rows, 60, np.int64)
        cells[f"step_{rows}"] = _timed(lambda t=tokens, n=lengths: decoder.decode(t, n))
    tokens, lengths = np.full(max(ROWS), 1234, np.int64), np.full(max(ROWS), 60, np.int64)

    def mixed() -> None:
        decoder.decode(tokens, lengths)
        decoder.prefill(max(ROWS), prompts[-1], 0)

    cells[MIXED] = _timed(mixed)
    return cells


def ort_argmax(
    decoder: Decoder, prompts: list[list[int]], together: int, texts: list[list[int]] | None = None
) -> list[list[int]]:
    """Each prompt read (`together` rows at once), then a token a step: its own argmax
    (greedy text), or with `texts` the next reference token (bench/openvino_paged.py's
    `forced`); the argmax at each position."""
    argmaxes: list[list[int]] = []
    for start in range(0, len(prompts), together):
        group = prompts[start : start + together]
        given = texts[start : start + together] if texts is not None else None
        out = [[int(decoder.prefill(row, p, 0).argmax())] for row, p in enumerate(group)]
        lengths = np.array([len(p) for p in group], np.int64)
        for step in range(TOKENS - 1):
            fed = [t[step] for t in given] if given is not None else [t[-1] for t in out]
            logits = decoder.decode(np.array(fed, np.int64), lengths)
            lengths += 1
            for made, token in zip(out, logits.argmax(-1), strict=True):
                made.append(int(token))
        argmaxes += out
    return argmaxes


def openvino_run(
    properties: dict[str, Any], prompts: list[list[int]], texts: list[list[int]]
) -> dict[str, Any]:
    job = {
        "gguf": str(GGUF),
        "properties": PROPERTIES | properties,
        "rows": list(ROWS),
        "prompts": prompts,
        "texts": texts,
    }
    done = subprocess.run(
        [str(openvino_python()), "-m", "bench.openvino_paged"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {0})  # the OpenVINO workers inherit it
    prompts = chat_prompts()
    ort = _decoder(MODELS / "smollm2")
    reference = ort_argmax(_decoder(MODELS / "smollm2-fp32"), prompts, 1)
    guesses = {
        "ort_int4": {
            "alone": ort_argmax(ort, prompts, 1, reference),
            "eight": ort_argmax(ort, prompts, 8, reference),
        }
    }
    engines = ["ort_int4", *OPENVINO]
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in engines}
    details: dict[str, dict[str, Any]] = {}
    busy, started = machine_busy_s(), time.monotonic()
    for index in range(args.rounds):
        for name in engines[:: 1 if index % 2 == 0 else -1]:
            if name == "ort_int4":
                rounds[name].append(ort_speed(ort))
                continue
            first = index < 2  # each engine's first round (engines alternate)
            result = openvino_run(OPENVINO[name], prompts, reference if first else [])
            rounds[name].append(result.pop("cells"))
            guesses.setdefault(name, result.pop("guesses", {}))
            details[name] = result
    # This process and its workers held CPU 0; the rest of the machine's busy time is others'.
    other = (machine_busy_s() - busy) / (time.monotonic() - started) - 1
    cells = list(rounds["ort_int4"][0])
    best = {
        name: {
            cell: min((r[cell] for r in rounds[name]), key=lambda c: c["cpu_ms"]) for cell in cells
        }
        for name in engines
    }

    def matching(a: list[list[int]], b: list[list[int]]) -> int:
        return sum(x == y for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True))

    quality = {
        name: {
            "top1_vs_fp32": matching(guesses[name]["alone"], reference),
            "alone_equals_eight": matching(guesses[name]["alone"], guesses[name]["eight"]),
        }
        for name in engines
    }
    rows = [
        [
            name,
            *(f"{best[name][c]['wall_ms']:.1f} / {best[name][c]['cpu_ms']:.1f}" for c in cells),
            *(f"{quality[name][m]}/{16 * TOKENS}" for m in quality[name]),
        ]
        for name in engines
    ]
    ratios = {
        f"{name}_{cell}_cpu_over_ort_int4": best[name][cell]["cpu_ms"]
        / best["ort_int4"][cell]["cpu_ms"]
        for name in OPENVINO
        for cell in cells
    }
    result = ScenarioResult(
        name="openvino_decoder",
        title="SmolLM2's decoder on one thread, step by step: ONNX Runtime int4 vs OpenVINO paged",
        baseline="ort_int4: the continuous path's Decoder on the int4 import, as served",
        data={
            "best": best,
            "rounds": rounds,
            "agreeing": quality,
            "openvino": details,
            "other_cores": other,
            "args": vars(args) | {"out": str(args.out)},
        },
        ratios=ratios,
        table_header=[
            "engine",
            *(f"{c.replace('_', ' ')} (wall / CPU ms)" for c in cells),
            "argmax = fp32's greedy token",
            "argmax alone = 8 rows at once",
        ],
        table_rows=rows,
        targets=[],
        notes=[
            f"reference: the fp32 import's {TOKENS} greedy tokens on 16 chat prompts, fed to"
            " each engine a token a step; its argmax at each position counted against them",
            f"other cores busy {other:.2f} on average; {machine()['cpu_model']}",
        ],
    )
    options = RunOptions(quick=False, out_dir=args.out)
    write_json(options, result, {"other_cores": other})
    write_markdown(options, result)
    steps = [f"step_{n}" for n in ROWS]
    write_plot(
        options,
        "openvino_decoder",
        [
            Series(
                name,
                list(ROWS),
                [best[name][c]["cpu_ms"] / n for c, n in zip(steps, ROWS, strict=True)],
                name == "ort_int4",
            )
            for name in engines
        ],
        "rows in the step",
        "CPU ms per token",
        "Decode steps on one thread: ONNX Runtime int4 vs OpenVINO paged",
    )
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
