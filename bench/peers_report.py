"""The `peers` scenario's outputs: the table, the three-panel plot, the targets and notes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import RunOptions, ScenarioResult, Target, at_least, at_most, ratio

LABELS = {
    "inferwire": "inferwire (default: per-request)",
    "inferwire_engine": "inferwire, batching: engine",
    "llama_cpp": "llama.cpp llama-server",
}
OURS = ("inferwire", "inferwire_engine")


def _both(points: dict[str, Any], server: str, concurrency: int, endpoints: Sequence[str]):
    """Completions and chat together: tokens over the summed windows, the worse p50."""
    cells = [points[f"{server}/{e}/{concurrency}"] for e in endpoints]
    tokens, wall = sum(c["tokens"] for c in cells), sum(c["wall_s"] for c in cells)
    return {
        "tokens_per_s": tokens / wall if wall else 0.0,
        "ttft_p50_ms": max(c["ttft_p50_ms"] for c in cells),
        "cpu_us_per_token": ratio(
            sum(c["server_cpu_us_per_token"].get("total", 0.0) * c["tokens"] for c in cells),
            tokens,
        ),
    }


def _row(point: dict[str, Any], peer: dict[str, Any] | None) -> list[str]:
    cpu = point["server_cpu_us_per_token"]
    grpc = point["endpoint"] == "grpc"
    loop = f"{cpu['event_loop']:.0f}" if point["server"] in OURS else "—"
    first = "—" if grpc else f"{point['ttft_p50_ms']:.1f} / {point['ttft_p99_ms']:.1f}"
    between = "—" if grpc else f"{point['itl_p50_ms']:.2f} / {point['itl_p99_ms']:.2f}"
    versus = f"{ratio(point['tokens_per_s'], peer['tokens_per_s']):.2f}" if peer else "—"
    return [
        str(point["concurrency"]),
        "gRPC InferStream (ghz)" if grpc else f"/v1/{point['endpoint']}",
        LABELS[point["server"]],
        f"{point['tokens_per_s']:,.0f}",
        versus,
        first,
        between,
        f"{cpu.get('total', 0.0):.0f}",
        loop,
        f"{point['tool_cpu_us_per_token']:.0f}",
        f"{point['other_cpu_share_max']:.0%}",
        " ".join(f"{v:.2f}" for v in point["load_before"]),
    ]


HEADER = [
    "concurrency",
    "API",
    "server",
    "output tokens/s",
    "× llama.cpp",
    "TTFT p50 / p99 ms",
    "ITL p50 / p99 ms",
    "server CPU µs/token",
    "event loop µs/token",
    "load tool CPU µs/token",
    "others' CPU (max)",
    "load avg before",
]


def _plot(
    options: RunOptions,
    name: str,
    points: dict[str, Any],
    levels: Sequence[int],
    weights: str,
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        ("inferwire", "completions", "inferwire (default), /v1/completions", "tab:blue", "o", "-"),
        ("inferwire", "chat", "inferwire (default), /v1/chat/completions", "tab:blue", "s", "-"),
        ("inferwire", "grpc", "inferwire, gRPC InferStream (ghz)", "tab:green", "^", ":"),
        ("inferwire_engine", "chat", "inferwire batching: engine, chat", "tab:purple", "s", "-."),
        ("llama_cpp", "completions", "llama.cpp, /v1/completions", "tab:orange", "o", "--"),
        ("llama_cpp", "chat", "llama.cpp, /v1/chat/completions", "tab:orange", "s", "--"),
    ]
    panels = [
        ("tokens_per_s", "output tokens/s (higher is better)", False),
        ("ttft_p50_ms", "time to first token p50, ms (lower is better)", True),
        ("cpu", "server CPU µs per output token (lower is better)", False),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, (metric, title, log_y) in zip(axes, panels, strict=True):
        for server, endpoint, label, color, marker, style in lines:
            keys = [f"{server}/{endpoint}/{c}" for c in levels]
            if metric == "ttft_p50_ms" and endpoint == "grpc":
                continue
            ys = [
                points[k]["server_cpu_us_per_token"].get("total", 0.0)
                if metric == "cpu"
                else points[k][metric]
                for k in keys
            ]
            ax.plot(levels, ys, color=color, marker=marker, linestyle=style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(levels))
        ax.set_xticklabels([str(c) for c in levels])
        ax.set_xlabel("concurrent requests (aiperf / ghz closed loop)")
        ax.set_title(title, fontsize=10)
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"Same weights ({weights}), same load from aiperf: "
        "64 tokens in, 128 out, greedy, 2 CPU cores shared by server and load tool",
        fontsize=10,
    )
    fig.tight_layout()
    path = options.out_dir / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def result(
    options: RunOptions,
    name: str,
    data: dict[str, Any],
    levels: Sequence[int],
    endpoints: Sequence[str],
) -> ScenarioResult:
    points = data["points"]
    rows = []
    for c in levels:
        for endpoint in (*endpoints, "grpc"):
            for server in LABELS:
                key = f"{server}/{endpoint}/{c}"
                if key in points:
                    peer = points.get(f"llama_cpp/{endpoint}/{c}") if server in OURS else None
                    rows.append(_row(points[key], peer))
    ratios: dict[str, float] = {}
    targets: list[Target] = []
    for c in levels:
        ours, engine, theirs = (_both(points, s, c, endpoints) for s in LABELS)
        ratios[f"tokens_per_s_at_{c}"] = ratio(ours["tokens_per_s"], theirs["tokens_per_s"])
        ratios[f"engine_tokens_per_s_at_{c}"] = ratio(
            engine["tokens_per_s"], theirs["tokens_per_s"]
        )
        ratios[f"engine_ttft_p50_at_{c}"] = ratio(engine["ttft_p50_ms"], theirs["ttft_p50_ms"])
        ratios[f"ttft_p50_at_{c}"] = ratio(ours["ttft_p50_ms"], theirs["ttft_p50_ms"])
        ratios[f"cpu_per_token_at_{c}"] = ratio(
            ours["cpu_us_per_token"], theirs["cpu_us_per_token"]
        )
        http = points[f"inferwire/chat/{c}"]["server_cpu_us_per_token"]["event_loop"]
        grpc = points[f"inferwire/grpc/{c}"]["server_cpu_us_per_token"]["event_loop"]
        ratios[f"http_loop_vs_grpc_loop_at_{c}"] = ratio(http, grpc)
    for c in levels:
        targets.append(
            at_least(
                f"output tokens/s × llama.cpp's, aiperf, concurrency {c} "
                "(default path; completions + chat)",
                ratios[f"tokens_per_s_at_{c}"],
                1.0,
            )
        )
    for c in levels:
        targets.append(
            at_most(
                f"TTFT p50 × llama.cpp's, aiperf, concurrency {c} "
                "(default path; worse endpoint of each)",
                ratios[f"ttft_p50_at_{c}"],
                1.0,
            )
        )
    tokenization, greedy = data["tokenization"], data["greedy"]
    notes = [
        f"Conversion checks: {tokenization['identical_samples']} of {tokenization['samples']} "
        f"corpus samples ({tokenization['chars']:,} characters, {tokenization['tokens']:,} "
        "tokens) tokenize to identical ids in both servers; greedy, the first "
        f"{greedy['tokens_per_prompt']} tokens agree position by position: "
        + ", ".join(
            f"{r['prompt']!r} {r['same_position']} (common prefix {r['common_prefix']})"
            for r in greedy["prompts"]
        )
        + ".",
        f"Both servers: {data['slots']} slots at every concurrency (inferwire max_concurrency, "
        f"llama-server --parallel), {data['threads']} compute thread for llama-server "
        "(ONNX Runtime runs one intra-op thread per generator, and inferwire's per-request "
        "path runs one generator per stream on its worker threads; llama-server's default, "
        "2 here, made 2-6x fewer tokens/s beside aiperf in a check: its threads spin at each "
        "step's barrier when the cores are shared), "
        f"{data['prompt_tokens']} tokens in, {data['output_tokens']} out with ignore_eos; "
        "every request's usage was checked to be the full length.",
        "llama-server: " + " ".join(data["llama_server_command"]),
        "server CPU: the whole process over aiperf's profiling window (ghz: its run), per "
        "output token; event loop: inferwire's main thread, where both doors run. Load tool "
        "CPU: aiperf's process tree (ghz's process) over the same window. Others' CPU: the "
        "machine's busy time less the servers', the load tool's and the bench's, as a share "
        "of all cores: what other users took during the cell (the largest of its rounds).",
        "ITL is aiperf's inter-token latency per request, (latency - TTFT) / (tokens - 1) "
        "with the servers' token counts, so tokens that share an SSE event (inferwire's "
        "stream_interval_ms) are spread over the time between events; p50 / p99 are over "
        "requests.",
        "gRPC rows: ghz reports no TTFT for a stream; its latency p50 / p99 per call (ms): "
        + ", ".join(
            f"{c}: {points[f'inferwire/grpc/{c}']['latency_p50_ms']:.0f} / "
            f"{points[f'inferwire/grpc/{c}']['latency_p99_ms']:.0f}"
            for c in levels
        )
        + ".",
    ]
    short = [
        f"{k.split('/')[0]} {k.split('/')[1]} at {k.split('/')[2]}: "
        f"{p['min_output_tokens']}-{p['max_output_tokens']} tokens, {p['errors']} of "
        f"{p['requests'] + p['errors']} requests failed "
        f"{p.get('error_types') or '(aiperf: the connection closed)'}"
        for k, p in points.items()
        if p["endpoint"] != "grpc"
        and (p.get("min_output_tokens") != data["output_tokens"] or p.get("errors"))
    ]
    if short:
        notes.append(
            "Not the full length, or failed at aiperf (a failed request's tokens are not "
            "counted; llama-server closes a keep-alive connection after 100 requests or 5 s "
            "idle, and aiperf does not retry one it was reusing): " + "; ".join(short)
        )
    plot = _plot(options, name, points, levels, data["model"]["about"])
    return ScenarioResult(
        name=name,
        title="inferwire against llama.cpp's llama-server on the same weights, load from aiperf "
        "over OpenAI HTTP (and ghz over gRPC)",
        baseline="llama.cpp's llama-server (built from the llama-cpp-python sdist) on "
        f"{data['model']['gguf']} ({data['model']['about']}), same aiperf load, same slots "
        "and threads",
        data={**data, "plot": plot},
        ratios=ratios,
        table_header=HEADER,
        table_rows=rows,
        targets=targets,
        notes=notes,
    )
