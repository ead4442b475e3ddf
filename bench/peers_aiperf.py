"""aiperf as the `peers` scenario runs it, what it writes, and CPU over its window.

- `aiperf_command`: one `aiperf profile` call: synthetic prompts of a fixed length from its
  own corpus, counted with the bundled model's tokenizer (`--tokenizer` its folder), a fixed
  output length (`ignore_eos`, which both servers honour), greedy (`temperature: 0`),
  streaming, a closed loop at one concurrency, warm-up requests first; token counts from
  the servers' usage (`--use-server-token-count`), so a short answer shows as one.
- `parse_run`: the profiling phase of one run from aiperf's artifacts: its window (wall
  clock, ns), every request's TTFT, ITL and output tokens (profile_export.jsonl), and
  aiperf's own summary (profile_export_aiperf.json) for the throughput it reports.
- `CpuSampler`: CPU time of processes, read from /proc every `interval_s`, so that a
  window known only afterwards (aiperf's profiling phase) can be cut out of it: a server's
  per thread group (bench/cpu.py), and a process tree's total (aiperf runs as several
  processes).
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import percentile
from bench.cpu import _TICK_NS, GROUPS, group_of, snapshot

ENDPOINTS = {"completions": "completions", "chat": "chat"}


def aiperf_command(
    aiperf: Path,
    url: str,
    endpoint: str,
    concurrency: int,
    requests: int,
    input_tokens: int,
    output_tokens: int,
    tokenizer: Path,
    artifact_dir: Path,
    seed: int = 35,
    model: str = "demo",
) -> list[str]:
    return [
        str(aiperf), "profile",
        "--model", model,
        "--url", url,
        "--endpoint-type", ENDPOINTS[endpoint],
        "--streaming",
        "--tokenizer", str(tokenizer),
        "--isl", str(input_tokens), "--isl-stddev", "0",
        "--osl", str(output_tokens), "--osl-stddev", "0",
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", "temperature:0",
        "--concurrency", str(concurrency),
        "--request-count", str(requests),
        "--warmup-request-count", str(max(2, concurrency)),
        "--use-server-token-count",
        "--random-seed", str(seed),
        "--ui-type", "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--artifact-dir", str(artifact_dir),
    ]  # fmt: skip


@dataclass
class AiperfRun:
    """The profiling phase of one aiperf run."""

    start_ns: int
    end_ns: int
    ttft_ms: list[float]
    itl_ms: list[float]
    output_tokens: list[int]
    errors: int
    reported_tokens_per_s: float  # aiperf's own output_token_throughput
    error_types: dict[str, int] = field(default_factory=dict)  # e.g. ServerDisconnectedError

    @property
    def wall_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def tokens(self) -> int:
        return sum(self.output_tokens)


def _value(metrics: dict[str, Any], name: str) -> float | None:
    entry = metrics.get(name)
    return None if entry is None else float(entry["value"])


def parse_run(artifact_dir: Path) -> AiperfRun:
    """Read one run's profiling phase; raises if aiperf did not complete it."""
    manifest = json.loads((artifact_dir / "phase_manifest.json").read_text())
    phase = next(p for p in manifest["phases"] if p["phase_kind"] == "profiling")
    summary = json.loads((artifact_dir / "profile_export_aiperf.json").read_text())
    ttft, itl, tokens = [], [], []
    error_types: dict[str, int] = {}
    for line in (artifact_dir / "profile_export.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["metadata"].get("benchmark_phase") != "profiling":
            continue
        if "error" in record:
            kind = str((record["error"] or {}).get("type", "error"))
            error_types[kind] = error_types.get(kind, 0) + 1
            continue
        metrics = record["metrics"]
        if (first := _value(metrics, "time_to_first_token")) is not None:
            ttft.append(first)
        if (between := _value(metrics, "inter_token_latency")) is not None:
            itl.append(between)
        tokens.append(int(_value(metrics, "output_token_count") or 0))
    return AiperfRun(
        start_ns=int(phase["start_ns"]),
        end_ns=int(phase["end_ns"]),
        ttft_ms=ttft,
        itl_ms=itl,
        output_tokens=tokens,
        errors=int(phase["error_request_count"]),
        reported_tokens_per_s=float(summary["output_token_throughput"]["avg"]),
        error_types=error_types,
    )


def summarize_runs(runs: Sequence[AiperfRun]) -> dict[str, Any]:
    """Several runs of one cell as one: tokens over the summed windows, percentiles over
    every request."""
    ttft = [v for run in runs for v in run.ttft_ms]
    itl = [v for run in runs for v in run.itl_ms]
    tokens = [t for run in runs for t in run.output_tokens]
    wall = sum(run.wall_s for run in runs)
    return {
        "requests": len(tokens),
        "errors": sum(run.errors for run in runs),
        "error_types": {
            kind: sum(run.error_types.get(kind, 0) for run in runs)
            for kind in sorted({k for run in runs for k in run.error_types})
        },
        "tokens": sum(tokens),
        "min_output_tokens": min(tokens, default=0),
        "max_output_tokens": max(tokens, default=0),
        "wall_s": wall,
        "tokens_per_s": sum(tokens) / wall if wall else 0.0,
        "aiperf_tokens_per_s": [run.reported_tokens_per_s for run in runs],
        "ttft_p50_ms": percentile(ttft, 0.5),
        "ttft_p99_ms": percentile(ttft, 0.99),
        "itl_p50_ms": percentile(itl, 0.5),
        "itl_p99_ms": percentile(itl, 0.99),
    }


# ---- CPU over a window known afterwards ---------------------------------------------


def _tree(root: int) -> list[int]:
    """`root` and its descendants (/proc/<pid>/task/<tid>/children)."""
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _process_ns(pid: int) -> float:
    """utime + stime of a live process (not cutime: an exited child keeps its last reading)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_NS


@dataclass
class _Series:
    times_ns: list[int] = field(default_factory=list)
    values: list[dict[str, float]] = field(default_factory=list)

    def at(self, when_ns: int) -> dict[str, float]:
        """Linear interpolation between the readings either side of `when_ns`."""
        if not self.times_ns:
            return {}
        i = bisect_left(self.times_ns, when_ns)
        if i <= 0:
            return self.values[0]
        if i >= len(self.times_ns):
            return self.values[-1]
        t0, t1 = self.times_ns[i - 1], self.times_ns[i]
        share = (when_ns - t0) / (t1 - t0) if t1 > t0 else 1.0
        before, after = self.values[i - 1], self.values[i]
        return {k: before.get(k, 0.0) + share * (after[k] - before.get(k, 0.0)) for k in after}


class CpuSampler:
    """`with CpuSampler(servers={...}, trees={...}) as s:`; then `s.between(a, b)`.

    Servers are read per thread group (cumulative µs per group, a thread that exits kept
    at its last reading); trees as the total of every process seen in the tree, each at
    its last reading."""

    def __init__(
        self,
        servers: dict[str, int] | None = None,
        trees: dict[str, int] | None = None,
        interval_s: float = 0.1,
    ) -> None:
        self.servers, self.trees = dict(servers or {}), dict(trees or {})
        self.interval_s = interval_s
        self.series: dict[str, _Series] = {n: _Series() for n in (*self.servers, *self.trees)}
        self._threads: dict[str, dict[int, tuple[str, float]]] = {n: {} for n in self.servers}
        self._tree_seen: dict[str, dict[int, float]] = {n: {} for n in self.trees}
        self._machines: dict[str, Callable[[], float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def add_tree(self, name: str, pid: int) -> None:
        """Sample the process tree under `pid` from now on, starting with a reading now:
        for a process just started, its CPU until the next tick is then in the windows
        that tick closes, not in the first reading."""
        with self._lock:
            self._tree_seen[name] = {}
            self.series[name] = _Series()
            self.trees[name] = pid
            self._read_locked()

    def add_machine(self, name: str, read: Callable[[], float]) -> None:
        """Sample `read()` (cumulative µs, e.g. the machine's busy time) from now on."""
        with self._lock:
            self.series[name] = _Series()
            self._machines[name] = read

    def _read_once(self) -> None:
        with self._lock:
            self._read_locked()

    def _read_locked(self) -> None:
        now = time.time_ns()
        for name, read in self._machines.items():
            self.series[name].times_ns.append(now)
            self.series[name].values.append({"total": read()})
        for name, pid in list(self.servers.items()):
            try:
                reading = snapshot(pid)
            except OSError:
                continue
            known = self._threads[name]
            for tid, (comm, ns) in reading.threads.items():
                known[tid] = (comm, ns / 1e3)
            groups = dict.fromkeys(GROUPS, 0.0)
            for tid, (comm, us) in known.items():
                groups[group_of(pid, tid, comm)] += us
            groups["total"] = sum(groups.values())
            self.series[name].times_ns.append(now)
            self.series[name].values.append(groups)
        for name, root in list(self.trees.items()):
            seen = self._tree_seen[name]
            for pid in _tree(root):
                ns = _process_ns(pid)
                if ns:
                    seen[pid] = max(seen.get(pid, 0.0), ns)
            self.series[name].times_ns.append(now)
            self.series[name].values.append({"total": sum(seen.values()) / 1e3})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read_once()

    def __enter__(self) -> CpuSampler:
        self._read_once()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read_once()

    def sample_now(self) -> None:
        """One more reading (e.g. right after a run ends)."""
        self._read_once()

    def between(self, name: str, start_ns: int, end_ns: int) -> dict[str, float]:
        """CPU µs used by `name` from start_ns to end_ns, total and by group."""
        with self._lock:
            series = self.series[name]
            before, after = series.at(start_ns), series.at(end_ns)
        return {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}
