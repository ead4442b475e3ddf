"""Shared benchmark plumbing: write results and plots.

Servers are started with tests.support.process, as the tests start them."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def write_boxplot(name: str, series: dict[str, list[float]], ylabel: str, title: str) -> Path:
    """Box plot of each named series side by side, saved as bench/results/<name>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot(list(series.values()), tick_labels=list(series))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_results(name: str, results: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")
    return path
