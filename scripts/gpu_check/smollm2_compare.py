"""The GPU check's SmolLM2 step's pure parts (scripts/gpu_check/smollm2.py runs it): how
its texts compare with the reference and with one another, which path a batching serves,
and its lines in summary.md (tests/unit/test_gpu_check_smollm2.py)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def agreeing_prefix(a: str, b: str) -> int:
    """How many characters the two texts share from their start."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def compare_with(texts: Sequence[str], reference: Sequence[str]) -> dict[str, Any]:
    """Text by text: the same, else how far they agree (characters) and where they part."""
    prefixes = [agreeing_prefix(a, b) for a, b in zip(texts, reference, strict=True)]
    same = [a == b for a, b in zip(texts, reference, strict=True)]
    parted = [
        {"index": i, "at_char": p, "ours": texts[i][p : p + 40], "theirs": reference[i][p : p + 40]}
        for i, p in enumerate(prefixes)
        if not same[i]
    ]
    return {
        "same": sum(same),
        "of": len(same),
        "share": sum(same) / len(same) if same else 0.0,
        "agreeing_prefix_chars": prefixes,
        "reference_chars": [len(t) for t in reference],
        "parted": parted,
    }


def repeated(prompts: Sequence[str], streams: int) -> list[int]:
    """Which prompt each of `streams` streams sends: the prompts in turn, repeated."""
    return [i % len(prompts) for i in range(streams)]


def served_path(device: str, batching: str, dynamic: bool) -> str:
    """The path `inferwire serve` takes (backends/ort_genai/backend.py)."""
    if batching == "continuous" or (batching == "auto" and device == "cpu"):
        return "continuous"
    if batching == "engine" or (batching == "auto" and dynamic):
        return "engine (dynamic)" if dynamic else "engine (static)"
    return "per_request"


def reference_problem(reference: dict[str, Any], prompts: Sequence[str], max_tokens: int) -> str:
    """Why the reference cannot be compared with this run ('' when it can)."""
    if list(reference.get("prompts", [])) != list(prompts):
        return "the reference's prompts are not tests/realmodel/corpus.py's GREEDY_PROMPTS"
    if reference.get("max_tokens") != max_tokens:
        found = reference.get("max_tokens")
        return f"the reference has {found} tokens a request, this run {max_tokens}"
    return ""


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The summary.md section (scripts/gpu_check/report.py)."""
    title = "## Real weights: SmolLM2-135M-Instruct"
    if record.get("skipped"):
        return [title, "", f"Not run: {record['skipped']}", ""]
    imported = record["import"]
    reference = record.get("reference") or {}
    lines = [
        title,
        "",
        f"Imported from the GGUF ({GGUF_NAME}) with `{' '.join(imported['command'])}` "
        f"in {imported['seconds']:.0f} s{' (reused)' if imported.get('reused') else ''}; "
        f"greedy, at most {record['max_tokens']} tokens a request; "
        f"{len(record['prompts'])} prompts (tests/realmodel/corpus.py GREEDY_PROMPTS). "
        f"Reference: {reference.get('what', 'none')}"
        + (f" ({reference['problem']})" if reference.get("problem") else "")
        + ".",
        "",
        "| batching (path) | 1 stream: same as the reference | share of the reference's "
        f"text agreed (min, mean) | x{record['streams']}: same as its 1-stream text | "
        f"x{record['streams']}: same as the reference | tokens/s x1, x{record['streams']} |",
        "|---|---|---|---|---|---|",
    ]
    for run in record["runs"]:
        if "error" in run:
            lines.append(f"| {run['batching']} | failed: {run['error']} | | | | |")
            continue
        one = run.get("one_vs_reference")
        many = run["many_vs_one"]
        many_ref = run.get("many_vs_reference")
        pairs = (
            zip(one["agreeing_prefix_chars"], one["reference_chars"], strict=True) if one else ()
        )
        agreed = [p / max(n, 1) for p, n in pairs]
        lines.append(
            f"| {run['batching']} ({run['path']}) | "
            + (f"{one['same']}/{one['of']}" if one else "-")
            + " | "
            + (f"{min(agreed):.2f}, {statistics.mean(agreed):.2f}" if agreed else "-")
            + f" | {many['same']}/{many['of']} | "
            + (f"{many_ref['same']}/{many_ref['of']}" if many_ref else "-")
            + f" | {run['one']['aggregate_tokens_per_s']:,.0f}, "
            f"{run['many']['aggregate_tokens_per_s']:,.0f} |"
        )
    parted = [
        (run["batching"], p)
        for run in record["runs"]
        if run.get("one_vs_reference")
        for p in run["one_vs_reference"]["parted"]
    ]
    if parted:
        lines += ["", "Where 1-stream texts part from the reference:", ""]
        lines += [
            f"- {b}, prompt {p['index']}, at char {p['at_char']}: "
            f"{json.dumps(p['ours'])} against {json.dumps(p['theirs'])}"
            for b, p in parted
        ]
    return [*lines, ""]


# The steps.
