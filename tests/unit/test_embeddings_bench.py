"""The pure parts of the `embeddings_minilm` benchmark (bench/embeddings_minilm.py): its
texts, the cosine, and its report's ratios and the issue's targets."""

from __future__ import annotations

import numpy as np
import pytest

from bench import embeddings_minilm as bench
from bench.common import RunOptions


def test_the_texts_are_distinct_varied_and_the_same_every_run():
    texts = bench.make_texts(300)
    assert len(texts) == len(set(texts)) == 300
    assert texts == bench.make_texts(300)
    words = [len(t.split()) for t in texts]
    assert min(words) <= 3 and max(words) > 256  # a few words to past the window
    assert any(not t.isascii() for t in texts)


def test_cosines_are_of_directions():
    a = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    b = np.array([[3.0, 0.0], [2.0, 2.0]], dtype=np.float32)
    assert bench.cosines(a, b) == pytest.approx([1.0, 2**-0.5])


def _cell(texts_per_s: float, p50: float) -> dict:
    return {"texts_per_s": texts_per_s, "cpu_ms_per_text": 1000 / texts_per_s,
            "latency_p50_ms": p50, "latency_p99_ms": 2 * p50}  # fmt: skip


def test_the_report_keeps_each_cells_best_round_and_the_targets(tmp_path):
    cells = {
        "inferwire": [_cell(90, 12.0), _cell(100, 14.0)],
        "sentence_transformers": [_cell(110, 10.0), _cell(80, 11.0)],
    }
    cosine = np.array([0.99999, 0.9998, 1.0])
    result = bench.result(RunOptions(out_dir=tmp_path), ["a", "b", "c"], cells, cosine)
    assert result.ratios["throughput"] == pytest.approx(100 / 110)
    assert result.ratios["latency_p50"] == pytest.approx(12.0 / 10.0)
    # The cosine's minimum misses 0.9999; 0.91 >= 0.9 texts/s; 1.2 <= 1.2 latency.
    assert [t.passed for t in result.targets] == [False, True, True]
    assert result.targets[0].value == pytest.approx(0.9998)
    assert (tmp_path / "embeddings_minilm.png").is_file()
