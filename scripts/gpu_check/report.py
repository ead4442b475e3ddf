"""The GPU check's outputs: results.json and a short summary.md (the speed figures, then
SmolLM2's text agreement where scripts/gpu_check/smollm2.py ran)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.streams import STREAM_TABLE_HEADER, stream_table_rows
from scripts.gpu_check.smollm2_compare import summary_lines

CPU_GROUPS = ("total", "event_loop", "engine", "grpc", "other")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def ratios(results: list[dict[str, Any]]) -> list[list[str]]:
    """inferwire against og.Engine in-process, per variant and stream count."""
    direct = {(r["variant"], r["streams"]): r for r in results if r["path"] == "og.Engine"}
    rows = []
    for r in results:
        base = direct.get((r["variant"], r["streams"]))
        if r["path"] == "inferwire" and base:
            rows.append(
                [
                    r["variant"],
                    str(r["streams"]),
                    f"{r['aggregate_tokens_per_s']:,.0f}",
                    f"{base['aggregate_tokens_per_s']:,.0f}",
                    _ratio(r["aggregate_tokens_per_s"], base["aggregate_tokens_per_s"]),
                ]
            )
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def summary(report: dict[str, Any]) -> str:
    lines = _speed_lines(report) if "results" in report else _smollm2_only_header(report)
    if report.get("smollm2"):
        lines += ["", *summary_lines(report["smollm2"])]
    return "\n".join(lines) + "\n"


def _smollm2_only_header(report: dict[str, Any]) -> list[str]:
    return [
        f"# GPU check (SmolLM2 alone): device {report['smollm2']['device']}",
        "",
        f"Machine: {json.dumps(report['machine'])}",
    ]


def _speed_lines(report: dict[str, Any]) -> list[str]:
    options, results = report["options"], report["results"]
    lines = [
        f"# GPU check: {options['shape']}, {options['precision']}, device {options['device']}",
        "",
        f"Machine: {json.dumps(report['machine'])}",
        "",
        f"Greedy, {options['max_tokens']} tokens per request (EOS cannot win), "
        f"{options['repeats']} timed batches per row after a warm-up batch of 8 tokens; "
        "build steps (s): "
        f"{json.dumps({k: round(v, 1) for k, v in report['timings_s'].items()})}.",
        "",
    ]
    labelled = [(f"{r['variant']} {r['path']} x{r['streams']}", r) for r in results]
    lines += _table(STREAM_TABLE_HEADER, stream_table_rows(labelled))
    lines += ["", "inferwire (`batching: auto`) against og.Engine in-process:", ""]
    lines += _table(
        ["variant", "streams", "inferwire tok/s", "og.Engine tok/s", "ratio"], ratios(results)
    )
    lines += [
        "",
        "CPU µs per token: the server's for inferwire; for og.* this process's, whose main"
        " thread (under event_loop) runs the engine:",
        "",
    ]
    cpu_rows = [
        [label, *(f"{r['cpu_us_per_token'].get(g, 0.0):,.0f}" for g in CPU_GROUPS)]
        for label, r in labelled
    ]
    lines += _table(["run", *CPU_GROUPS], cpu_rows)
    bound = report["one_stream_bound_tokens_per_s"]
    if bound:
        lines += [
            "",
            f"One decode step reads {report['decode_step_weight_bytes'] / 1e9:.3f} GB of weights; "
            f"at {options['bandwidth_tbs']} TB/s that bounds one stream at {bound:,.0f} tokens/s.",
            "",
        ]
        one = [r for r in results if r["streams"] == 1]
        lines += _table(
            ["run", "tokens/s", "share of the bound"],
            [
                [
                    f"{r['variant']} {r['path']}",
                    f"{r['aggregate_tokens_per_s']:,.0f}",
                    f"{r['aggregate_tokens_per_s'] / bound:.2f}",
                ]
                for r in one
            ],
        )
    lines += ["", "Tokens per request (min, max) and direct-vs-inferwire text agreement:", ""]
    for r in results:
        lines.append(f"- {r['variant']} {r['path']} x{r['streams']}: {r['tokens_per_request']}")
    for name, variant in report["variants"].items():
        lines.append(
            f"- {name}: dynamic batching {variant['dynamic_batching']}, "
            f"ONNX {variant['onnx_bytes'] / 1e9:.3f} GB, same text "
            f"{json.dumps(variant['text_agreement_direct_vs_inferwire'])}"
        )
    return lines


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "summary.md").write_text(summary(report))
