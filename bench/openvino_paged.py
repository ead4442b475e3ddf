"""OpenVINO's paged-attention model of a GGUF, driven one step at a time the way the
continuous path's loop drives ONNX Runtime: the worker half of bench/openvino_decoder.py,
run by the OpenVINO venv (`.cache/peers/openvino-venv`, made by engines_smollm2).

OpenVINO GenAI converts the GGUF (its Q4_1 weights stay u4) and saves the IR; the IR's
SDPA becomes PagedAttentionExtension (openvino's paged_attention_transformation, what
ContinuousBatchingPipeline does), whose KV cache is one tensor per layer of blocks of 32
positions. A row owns a fixed run of blocks, as a KV slot owns its positions in
decoder.py. One infer takes any mix of rows, each with its own new tokens and past length:
a prefill chunk can ride in a decode step.

Reads a JSON job on stdin ({"gguf", "properties", "rows", "prompts", "texts"}) and writes a
JSON result on stdout: per-cell wall and CPU ms (this process's utime + stime) and, where
reference texts are given, the argmax at each of their positions, alone and 8 rows at once.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
from openvino._offline_transformations import paged_attention_transformation

BLOCK_TOKENS = 32  # the CPU plugin's paged-attention block
ROW_BLOCKS = 8  # 256 positions a row
REPEATS = 16


def _cpu_s() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PagedModel:
    """One compiled paged model and its KV blocks; rows are runs of ROW_BLOCKS blocks."""

    def __init__(self, gguf: Path, properties: dict[str, Any], rows: int) -> None:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / gguf.name).symlink_to(gguf.resolve())
            ov_genai.LLMPipeline(str(Path(folder) / gguf.name), "CPU", enable_save_ov_model=True)
            model = ov.Core().read_model(str(Path(folder) / "openvino_model.xml"))
        paged_attention_transformation(model)
        self.compiled = ov.Core().compile_model(model, "CPU", properties)
        self.request = self.compiled.create_infer_request()
        for port in self.compiled.inputs:
            if port.get_any_name().startswith(("key_cache.", "value_cache.")):
                shape = [
                    rows * ROW_BLOCKS if d.is_dynamic else d.get_length()
                    for d in port.get_partial_shape()
                ]
                self.request.set_tensor(
                    port.get_any_name(), ov.Tensor(port.get_element_type(), shape)
                )
        self.cache_precision = str(self.compiled.get_property("KV_CACHE_PRECISION"))
        self.inference_precision = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))

    def run(self, work: list[tuple[int, list[int], int]]) -> np.ndarray:
        """`work`: (row, new tokens, past length) each; the logits of each row's last token."""
        counts = [len(tokens) for _, tokens, _ in work]
        feeds = {
            "input_ids": np.concatenate([np.array(t, np.int64) for _, t, _ in work]),
            "position_ids": np.concatenate(
                [np.arange(p, p + len(t), dtype=np.int64) for _, t, p in work]
            ),
            "past_lens": np.array([p for _, _, p in work], np.int32),
            "subsequence_begins": np.cumsum([0, *counts]).astype(np.int32),
            "block_indices": np.concatenate(
                [
                    np.arange(r * ROW_BLOCKS, (r + 1) * ROW_BLOCKS, dtype=np.int32)
                    for r, _, _ in work
                ]
            ),
            "block_indices_begins": np.arange(len(work) + 1, dtype=np.int32) * ROW_BLOCKS,
            "max_context_len": np.array(max(p + len(t) for _, t, p in work), np.int32),
        }
        for name, value in feeds.items():
            self.request.set_tensor(name, ov.Tensor(value))
        self.request.infer()
        logits = self.request.get_tensor("logits").data.reshape(sum(counts), -1)
        return logits[np.cumsum(counts) - 1]


def _timed(run: Any) -> dict[str, float]:
    run()  # warm: the first infer of a shape
    wall, cpu = time.perf_counter(), _cpu_s()
    for _ in range(REPEATS):
        run()
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000 / REPEATS,
        "cpu_ms": (_cpu_s() - cpu) * 1000 / REPEATS,
    }


def speed(model: PagedModel, rows: list[int]) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, 60)] for _ in range(max(rows) + 1)]
    cells = {"prefill_60": _timed(lambda: model.run([(0, prompts[0], 0)]))}
    for row, prompt in enumerate(prompts):
        model.run([(row, prompt, 0)])
    for count in rows:
        step = [(row, [1234], 60) for row in range(count)]
        cells[f"step_{count}"] = _timed(lambda step=step: model.run(step))
    # The largest step with a 60-token prefill riding in it (the prefill row rewrites its
    # own positions 0..59 each time; the decode rows stay at position 60).
    mixed = [*((row, [1234], 60) for row in range(max(rows))), (max(rows), prompts[-1], 0)]
    cells[f"step_{max(rows)}_with_prefill_60"] = _timed(lambda: model.run(mixed))
    return cells


def forced(
    model: PagedModel, prompts: list[list[int]], texts: list[list[int]], together: int
) -> list[list[int]]:
    """Each prompt read, then its reference text fed a token a step: the argmax at each
    position (the engine's guess of the reference's next token)."""
    guesses: list[list[int]] = []
    for start in range(0, len(prompts), together):
        group, given = prompts[start : start + together], texts[start : start + together]
        out = [[int(t)] for t in model.run([(row, p, 0) for row, p in enumerate(group)]).argmax(-1)]
        for step in range(len(given[0]) - 1):
            work = [
                (row, [text[step]], len(p) + step)
                for row, (p, text) in enumerate(zip(group, given, strict=True))
            ]
            for guess, token in zip(out, model.run(work).argmax(-1), strict=True):
                guess.append(int(token))
        guesses += out
    return guesses


def main() -> None:
    job = json.loads(sys.stdin.read())
    rows = job["rows"]
    model = PagedModel(Path(job["gguf"]), job["properties"], max(rows) + 1)
    result: dict[str, Any] = {
        "versions": {"openvino": ov.get_version(), "openvino_genai": ov_genai.__version__},
        "kv_cache_precision": model.cache_precision,
        "inference_precision": model.inference_precision,
        "cells": speed(model, rows),
    }
    if job.get("texts"):
        prompts, texts = job["prompts"], job["texts"]
        result["guesses"] = {
            "alone": forced(model, prompts, texts, 1),
            "eight": forced(model, prompts, texts, 8),
        }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
