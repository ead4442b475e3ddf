"""`python -m bench [SCENARIO...] [--quick] [--out DIR]`: run the benchmark scenarios.

Each scenario writes <out>/<scenario>.json, .md and .png; then <out>/README.md is
rewritten from every <scenario>.json in <out> (this run's and earlier ones): the machine,
the targets table with each measured figure, and one line per scenario.

A full (reference) run waits before each scenario for the machine to be quiet (load
average at most 0.5 per CPU, bench/cpu.py) and refuses to write that scenario's result
when it does not get quiet in time; the load before and after is recorded either way.
`--quick` runs check the plumbing only: they record the load but never wait or refuse.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from bench.common import RESULTS, RunOptions, machine, markdown_table, write_json, write_markdown
from bench.cpu import QUIET_LOAD_PER_CPU, load_per_cpu, wait_until_quiet
from bench.guide import guide

# name -> module; in the order the suite runs them.
SCENARIOS = {
    "cpu_per_token": "bench.cpu_per_token",
    "engine_overhead": "bench.engine_overhead",
    "concurrency_scaling": "bench.concurrency_scaling",
    "triton_overhead": "bench.triton_overhead",
    "kserve_overhead": "bench.kserve_overhead",
    "grpc_floor": "bench.grpc_floor",
    "http_overhead": "bench.http_overhead",
    "gateway_capacity": "bench.gateway_capacity",
    "ghz_infer": "bench.ghz_infer",
    "memory": "bench.memory",
    "startup_time": "bench.startup_time",
    "model_swap": "bench.model_swap",
    "tenant_isolation": "bench.tenant_isolation",
    "adapters": "bench.adapters",
    "peers": "bench.peers",
    "peers_smollm2": "bench.peers_smollm2",
    "engines_smollm2": "bench.engines_smollm2",
    "embeddings_minilm": "bench.embeddings_minilm",
    "routing_prefix": "bench.routing_prefix",
}
# A scenario whose tool is not installed is skipped, not failed.
_MISSING_TOOL = ("TritonMissingError", "GhzMissingError")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help=f"any of {', '.join(SCENARIOS)}; default: all",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke sizes: checks the plumbing, not the numbers"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"default: {RESULTS}")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="full runs: how long to wait for a quiet machine before each scenario",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return args


class BusyMachineError(RuntimeError):
    """The machine was not quiet enough for a reference result."""


def run_scenario(module: ModuleType, options: RunOptions, quiet_wait_s: float) -> float:
    if options.quick:
        load_before = load_per_cpu()
    else:
        load_before = wait_until_quiet(quiet_wait_s)
        if load_before > QUIET_LOAD_PER_CPU:
            raise BusyMachineError(
                f"load average {load_before:.2f} per CPU after waiting {quiet_wait_s:.0f} s "
                f"(a reference result needs <= {QUIET_LOAD_PER_CPU}); nothing written"
            )
    started = time.perf_counter()
    result = module.run(options)
    load = {"before_per_cpu": round(load_before, 2), "after_per_cpu": round(load_per_cpu(), 2)}
    write_json(options, result, load)
    markdown = write_markdown(options, result)
    elapsed = time.perf_counter() - started
    ratios = ", ".join(f"{k} {v:.3f}" for k, v in result.ratios.items())
    print(f"{result.name}: {ratios} ({elapsed:.0f} s; {markdown})", flush=True)
    return elapsed


def write_summary(out_dir: Path) -> Path:
    """<out>/README.md from every scenario JSON there."""
    documents = []
    for name in SCENARIOS:
        path = out_dir / f"{name}.json"
        if path.is_file():
            documents.append(json.loads(path.read_text()))
    targets = [
        [
            t["measure"],
            t["goal"],
            f"{t['value']:.3g}",
            "pass" if t["pass"] else "miss",
            d["scenario"],
        ]
        for d in documents
        for t in d["targets"]
    ]
    scenarios = [
        [
            f"[{d['scenario']}]({d['scenario']}.md)",
            guide(d["scenario"]),
            d["baseline"],
            ", ".join(f"{k} {v:.3f}" for k, v in d["ratios"].items()),
            "quick" if d["quick"] else "full",
            "{before_per_cpu} / {after_per_cpu}".format(**d["load"]) if "load" in d else "",
        ]
        for d in documents
    ]
    described = documents[0]["machine"] if documents else machine()
    versions = ", ".join(f"{k} {v}" for k, v in described["versions"].items())
    lines = [
        "# Benchmark results",
        "",
        "Written by `python -m bench` (see bench/__main__.py); each scenario has its own "
        "JSON, Markdown table and plot here. Ratios are inferwire / baseline.",
        "",
        "## Machine",
        "",
        f"- CPU: {described['cpu_model']}, {described['cpus']} logical CPUs "
        f"({described['cpus_usable']} usable)",
        f"- Memory: {described['memory_gib']} GiB",
        f"- Load average when the run started: {described['load_average_at_start']}",
        f"- {described['platform']}, Python {described['python']}",
        f"- {versions}",
        "",
        "## Targets",
        "",
        markdown_table(["measure", "target", "measured", "result", "scenario"], targets),
        "",
        "## Scenarios",
        "",
        markdown_table(
            [
                "scenario",
                "what you learn; which figure first",
                "baseline",
                "ratios",
                "sizes",
                "load per CPU before / after",
            ],
            scenarios,
        ),
        "",
    ]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    options = RunOptions(quick=args.quick, out_dir=args.out)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    total = 0.0
    for name in args.scenarios or list(SCENARIOS):
        module = importlib.import_module(SCENARIOS[name])
        try:
            total += run_scenario(module, options, args.quiet_wait)
        except Exception as error:
            if isinstance(error, BusyMachineError):
                print(f"{name}: refused: {error}", file=sys.stderr, flush=True)
                failed.append(name)
                continue
            if type(error).__name__ in _MISSING_TOOL:
                print(f"{name}: skipped: {error}", flush=True)
                continue
            traceback.print_exc()
            failed.append(name)
    summary = write_summary(options.out_dir)
    print(f"summary: {summary} ({total:.0f} s in scenarios)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
