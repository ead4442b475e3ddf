"""Figures that reliability tests measure and report rather than assert (codes seen,
request counts, memory, latency); the engine tier prints them in pytest's summary."""

from __future__ import annotations

from collections import Counter

FIGURES: dict[str, list[str]] = {}


def record(title: str, line: str) -> None:
    FIGURES.setdefault(title, []).append(line)


def record_counts(title: str, counts: Counter[str]) -> None:
    record(title, ", ".join(f"{name} {count}" for name, count in sorted(counts.items())))
