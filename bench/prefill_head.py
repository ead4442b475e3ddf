"""`python -m bench.prefill_head`: the continuous path's decoder (continuous/decoder.py) on
SmolLM2's int4 import (`make smollm2`), driven directly on one thread of CPU 0, with the
LM head on every position (the graph as exported: the baseline) and on the last two only
(continuous/head.py). Prompts of 16, 60 and 250 tokens read into an empty slot, and a
one-row decode step at position 60; rounds alternate which graph goes first. Wall and
CPU (/proc) milliseconds per prefill, each cell its best round; writes
bench/results/prefill_head.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
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
from inferwire.backends.ort_genai.continuous.decoder import Decoder
from scripts.smollm2 import MODELS

PROMPTS = (16, 60, 250)
GRAPHS = ("full", "sliced")


def _decoder(path: Path, sliced: bool) -> Decoder:
    config = json.loads((path / "genai_config.json").read_text())
    return Decoder(path, config, 1, 2, 512, head_on_last_positions=sliced)


def _timed(run: Any, repeats: int) -> tuple[float, float]:
    """Mean wall and CPU ms of `run()`."""
    wall, cpu = time.perf_counter(), process_cpu_s()
    for _ in range(repeats):
        run()
    return (
        (time.perf_counter() - wall) * 1000 / repeats,
        (process_cpu_s() - cpu) * 1000 / repeats,
    )


def _cell(decoder: Decoder, tokens: int, repeats: int) -> dict[str, float]:
    prompt = [int(t) for t in np.random.default_rng(tokens).integers(100, 40000, tokens)]
    cell: dict[str, float] = {}
    for length in PROMPTS:
        wall, cpu = _timed(lambda n=length: decoder.prefill(0, prompt[:n], 0), repeats)
        cell[f"prefill_{length}_wall_ms"], cell[f"prefill_{length}_cpu_ms"] = wall, cpu
    decoder.prefill(0, prompt[:60], 0)
    one, sixty = np.array([1234], np.int64), np.array([60], np.int64)
    wall, cpu = _timed(lambda: decoder.decode(one, sixty), repeats * 8)
    cell["decode_1_wall_ms"], cell["decode_1_cpu_ms"] = wall, cpu
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {0})
    decoders = {graph: _decoder(MODELS / "smollm2", graph == "sliced") for graph in GRAPHS}
    rounds: dict[str, list[dict[str, float]]] = {graph: [] for graph in GRAPHS}
    busy_before = machine_busy_s()
    started = time.perf_counter()
    for index in range(args.rounds):
        order = GRAPHS if index % 2 == 0 else GRAPHS[::-1]
        for graph in order:
            rounds[graph].append(_cell(decoders[graph], max(PROMPTS), args.repeats))
    elapsed = time.perf_counter() - started
    # Cores busy apart from this process, on average over the run (a quiet machine: ~0).
    other_cores = (machine_busy_s() - busy_before - process_cpu_s()) / elapsed
    best = {
        graph: {k: min(r[k] for r in rounds[graph]) for k in rounds[graph][0]} for graph in GRAPHS
    }
    ratios = {
        f"prefill_{n}_cpu_sliced_over_full": best["sliced"][f"prefill_{n}_cpu_ms"]
        / best["full"][f"prefill_{n}_cpu_ms"]
        for n in PROMPTS
    }
    ratios["decode_1_cpu_sliced_over_full"] = (
        best["sliced"]["decode_1_cpu_ms"] / best["full"]["decode_1_cpu_ms"]
    )
    rows = [
        [graph]
        + [
            f"{best[graph][f'prefill_{n}_wall_ms']:.1f} / {best[graph][f'prefill_{n}_cpu_ms']:.1f}"
            for n in PROMPTS
        ]
        + [f"{best[graph]['decode_1_wall_ms']:.2f} / {best[graph]['decode_1_cpu_ms']:.2f}"]
        for graph in GRAPHS
    ]
    result = ScenarioResult(
        name="prefill_head",
        title="The continuous path's decoder: the LM head on every position or the last two",
        baseline="the graph as exported (the head on every position), driven the same way",
        data={
            "rounds": rounds,
            "best": best,
            "other_cores": other_cores,
            "args": vars(args) | {"out": str(args.out)},
        },
        ratios=ratios,
        table_header=["graph", *(f"prefill {n} (wall / CPU ms)" for n in PROMPTS), "decode 1 row"],
        table_rows=rows,
        targets=[],
        notes=[f"other cores busy {other_cores:.2f} on average; {machine()['cpu_model']}"],
    )
    options = RunOptions(quick=False, out_dir=args.out)
    write_json(options, result, {"other_cores": other_cores})
    write_markdown(options, result)
    write_plot(
        options,
        "prefill_head",
        [
            Series(
                graph,
                list(PROMPTS),
                [best[graph][f"prefill_{n}_cpu_ms"] for n in PROMPTS],
                graph == "full",
            )
            for graph in GRAPHS
        ],
        "prompt tokens",
        "CPU ms per prefill",
        "Prefill on one thread: head on every position vs the last two",
    )
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
