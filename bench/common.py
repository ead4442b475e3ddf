"""Shared benchmark plumbing: run options, a closed-loop load generator, statistics, the
machine description, and the three outputs of every scenario (JSON, Markdown, PNG).

Servers are started with tests.support.process and tests.support.triton, as the tests
start them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class RunOptions:
    """How big a run is, and where it writes."""

    quick: bool = False  # smoke sizes: checks the plumbing, not the numbers
    out_dir: Path = RESULTS

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full


# ---- measuring -------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency_summary(wall_s: float, latencies_ms: Sequence[float]) -> dict[str, float]:
    """Requests per second and latency percentiles of one closed-loop run."""
    return {
        "requests": len(latencies_ms),
        "wall_s": wall_s,
        "rps": len(latencies_ms) / wall_s if wall_s else 0.0,
        "p50_ms": percentile(latencies_ms, 0.5),
        "p99_ms": percentile(latencies_ms, 0.99),
        "mean_ms": statistics.fmean(latencies_ms) if latencies_ms else 0.0,
    }


async def closed_loop(
    call: Callable[[], Awaitable[object]], requests: int, concurrency: int
) -> tuple[float, list[float]]:
    """`requests` calls, `concurrency` in flight at all times; (wall seconds, latencies in ms)."""
    latencies: list[float] = []
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            started = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


async def measure_rps(
    call: Callable[[], Awaitable[object]], requests: int, concurrency: int, warmup: int
) -> dict[str, float]:
    """Warm up, then measure; the summary of the measured run."""
    await closed_loop(call, warmup, concurrency)
    wall, latencies = await closed_loop(call, requests, concurrency)
    return latency_summary(wall, latencies)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


# ---- describing the machine --------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            name: _version(name)
            for name in (
                "inferwire",
                "grpcio",
                "protobuf",
                "onnxruntime-genai",
                "tritonclient",
                "nvidia-pytriton",
            )
        },
    }


# ---- writing results ----------------------------------------------------------


@dataclass
class Target:
    """One row of the issue's targets table, with what this run measured."""

    measure: str
    goal: str  # as the issue writes it, e.g. ">= 0.95"
    value: float
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "goal": self.goal,
            "value": self.value,
            "pass": self.passed,
        }


def at_least(measure: str, value: float, goal: float) -> Target:
    return Target(measure, f">= {goal:g}", value, value >= goal)


def at_most(measure: str, value: float, goal: float, unit: str = "") -> Target:
    return Target(measure, f"<= {goal:g}{unit}", value, value <= goal)


def below(measure: str, value: float, goal: float, unit: str = "") -> Target:
    return Target(measure, f"< {goal:g}{unit}", value, value < goal)


@dataclass
class ScenarioResult:
    """What a scenario hands back: its data, its table, its plot and its targets."""

    name: str
    title: str
    baseline: str  # what inferwire is compared with, in words
    data: dict[str, Any]  # everything measured, for the JSON file
    ratios: dict[str, float]  # inferwire / baseline, named
    table_header: list[str]
    table_rows: list[list[str]]
    targets: list[Target]
    notes: list[str]


def write_json(options: RunOptions, result: ScenarioResult, load: dict[str, float]) -> Path:
    """`load`: the load average per CPU before and after the scenario (bench/cpu.py)."""
    path = options.out_dir / f"{result.name}.json"
    document = {
        "scenario": result.name,
        "title": result.title,
        "baseline": result.baseline,
        "quick": options.quick,
        "load": load,
        "machine": machine(),
        "ratios": result.ratios,
        "targets": [t.as_dict() for t in result.targets],
        "data": result.data,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def targets_table(targets: Sequence[Target]) -> str:
    return markdown_table(
        ["measure", "target", "measured", "result"],
        [[t.measure, t.goal, f"{t.value:.3g}", "pass" if t.passed else "miss"] for t in targets],
    )


def write_markdown(options: RunOptions, result: ScenarioResult) -> Path:
    path = options.out_dir / f"{result.name}.md"
    parts = [
        f"# {result.title}",
        "",
        f"Baseline: {result.baseline}." + (" Quick (smoke) sizes." if options.quick else ""),
        "",
        markdown_table(result.table_header, result.table_rows),
        "",
        "Ratios (inferwire / baseline): "
        + ", ".join(f"{name} {value:.3f}" for name, value in result.ratios.items()),
    ]
    if result.targets:
        parts += ["", targets_table(result.targets)]
    if result.notes:
        parts += ["", *[f"- {note}" for note in result.notes]]
    path.write_text("\n".join(parts) + "\n")
    return path


@dataclass
class Series:
    """One line on a plot: y against x."""

    label: str
    x: list[float]
    y: list[float]
    baseline: bool = False  # drawn dashed


def write_plot(
    options: RunOptions,
    name: str,
    series: Sequence[Series],
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
) -> Path:
    """Lines of y against x; baselines dashed. Saved as <out_dir>/<name>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for line in series:
        ax.plot(
            line.x,
            line.y,
            linestyle="--" if line.baseline else "-",
            marker="o",
            label=line.label,
        )
    if log_x:
        ax.set_xscale("log", base=2)
    xs = sorted({x for line in series for x in line.x})
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = options.out_dir / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
