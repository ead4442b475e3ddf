"""The GPU check's SmolLM2 step (scripts/gpu_check/smollm2.py): its text comparisons, the
path it says each `batching` takes, and its part of summary.md."""

from __future__ import annotations

import json
from typing import Any

from scripts.gpu_check.report import summary
from scripts.gpu_check.smollm2 import REFERENCE
from scripts.gpu_check.smollm2_compare import (
    agreeing_prefix,
    compare_with,
    reference_problem,
    repeated,
    served_path,
    summary_lines,
)
from tests.realmodel.corpus import GREEDY_PROMPTS


def test_texts_are_compared_one_by_one_and_where_they_part_is_kept() -> None:
    assert agreeing_prefix("Paris is", "Paris was") == 6
    assert agreeing_prefix("abc", "abc") == 3
    found = compare_with(["The capital", "Once upon a hill"], ["The capital", "Once upon a time"])
    assert (found["same"], found["of"], found["share"]) == (1, 2, 0.5)
    assert found["agreeing_prefix_chars"] == [11, 12]
    assert found["parted"] == [{"index": 1, "at_char": 12, "ours": "hill", "theirs": "time"}]


def test_streams_send_the_prompts_in_turn() -> None:
    assert repeated(["a", "b", "c"], 7) == [0, 1, 2, 0, 1, 2, 0]


def test_the_path_is_the_one_the_backend_takes() -> None:
    assert served_path("cpu", "auto", False) == "continuous"
    assert served_path("cuda", "auto", False) == "per_request"  # the import is not paged
    assert served_path("cuda", "auto", True) == "engine (dynamic)"
    assert served_path("cuda", "engine", False) == "engine (static)"


def test_the_committed_reference_fits_the_prompts_and_a_mismatch_is_named() -> None:
    reference = json.loads(REFERENCE.read_text())
    assert reference_problem(reference, GREEDY_PROMPTS, 48) == ""
    assert len(reference["texts"]) == len(GREEDY_PROMPTS)
    assert "48 tokens a request, this run 32" in reference_problem(reference, GREEDY_PROMPTS, 32)
    assert "GREEDY_PROMPTS" in reference_problem(reference, GREEDY_PROMPTS[:3], 48)


def _run(batching: str, path: str) -> dict[str, Any]:
    one = compare_with(["Paris.", "Blue"], ["Paris.", "Red"])
    return {
        "batching": batching,
        "path": path,
        "one": {"aggregate_tokens_per_s": 310.0},
        "many": {"aggregate_tokens_per_s": 4200.0},
        "one_vs_reference": one,
        "many_vs_one": compare_with(["a", "b", "c", "x"], ["a", "b", "c", "d"]),
        "many_vs_reference": compare_with(["a", "b"], ["a", "b"]),
    }


def test_summary_has_a_row_per_batching_and_says_where_texts_parted() -> None:
    record = {
        "device": "cuda",
        "max_tokens": 48,
        "streams": 64,
        "prompts": ["p1", "p2"],
        "import": {"command": ["inferwire", "models", "import"], "seconds": 41.2},
        "reference": {"what": "the cpu fp32 import's text", "problem": ""},
        "runs": [
            _run("auto", "per_request"),
            _run("engine", "engine (static)"),
            {"batching": "per_request", "error": "error: model 'smollm2' failed to load: x"},
        ],
    }
    lines = summary_lines(record)
    assert "| auto (per_request) | 1/2 | 0.00, 0.50 | 3/4 | 2/2 | 310, 4,200 |" in lines
    assert "| engine (engine (static)) | 1/2 | 0.00, 0.50 | 3/4 | 2/2 | 310, 4,200 |" in lines
    assert '- auto, prompt 1, at char 0: "Blue" against "Red"' in lines
    assert "| per_request | failed: error: model 'smollm2' failed to load: x | | | | |" in lines
    alone = summary({"machine": {"cpus": 16}, "smollm2": record})
    assert alone.startswith("# GPU check (SmolLM2 alone): device cuda")
    skipped = summary_lines({"skipped": "no GGUF"})
    assert "Not run: no GGUF" in skipped
