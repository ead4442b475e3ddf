"""`python -m bench --quick` runs every scenario and writes outputs of the right shape.

Smoke only: the sizes are tiny and nothing here looks at how fast anything was. It lives
in the Triton tier because two scenarios need tritonserver (and one ghz).

`peers`, `peers_smollm2` and `engines_smollm2` are left out: their setup compiles llama.cpp's
server (6-13 minutes on 2 cores) and puts aiperf and OpenVINO GenAI in venvs of their own,
which `make test` never does (docs/benchmarks.md); their pure parts are in
tests/unit/test_peers_bench.py and test_engines_bench.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import SCENARIOS
from bench.cpu import GROUPS

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The fixture's run counts towards the first test's pytest-timeout.
BENCH_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(BENCH_TIMEOUT_S)
# Those that build llama.cpp's server (and, for engines_smollm2, OpenVINO's venv) first.
PEERS = {"peers", "peers_smollm2", "engines_smollm2"}
# Needs `make minilm` and sentence-transformers (the import extra), which this tier has not;
# its pure parts are in tests/unit/test_embeddings_bench.py.
PEERS |= {"embeddings_minilm"}
# Needs the endpoint picker built with Go (scripts/build_epp.sh) and `make smollm2`; it runs
# three replicas and three pickers, minutes even at smoke sizes.
PEERS |= {"routing_prefix"}
SMOKED = [name for name in SCENARIOS if name not in PEERS]
# The issues' targets tables (issue 26: cpu_per_token 5, triton_overhead 2, gateway_capacity 2;
# issue 33: http_overhead 3, with the 16-stream floor).
TARGET_COUNT = 19


@pytest.fixture(scope="module")
def results(triton_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    # Its own session: on a timeout the scenarios' servers and tritonserver go with it.
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out), *SMOKED],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "server"), str(REPO)])},
    )
    try:
        printed, _ = bench.communicate(timeout=BENCH_TIMEOUT_S - 30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
        bench.wait()
    assert bench.returncode == 0, printed
    assert "skipped" not in printed, printed
    return out


@pytest.mark.parametrize("scenario", SMOKED)
def test_scenario_writes_json_markdown_and_png(results: Path, scenario: str) -> None:
    document = json.loads((results / f"{scenario}.json").read_text())
    assert document["scenario"] == scenario
    assert document["quick"] is True
    assert document["baseline"]
    assert {"cpu_model", "cpus", "memory_gib", "versions"} <= document["machine"].keys()
    assert document["ratios"]
    for name, value in document["ratios"].items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, name
    for target in document["targets"]:
        assert target.keys() == {"measure", "goal", "value", "pass"}
        assert isinstance(target["pass"], bool)
    assert (results / document["data"]["plot"]).read_bytes().startswith(PNG_SIGNATURE)
    markdown = (results / f"{scenario}.md").read_text()
    assert markdown.startswith(f"# {document['title']}")
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and set(table[1]) <= set("|-")


def test_scenarios_measure_their_own_work(results: Path) -> None:
    """Greedy prompts give the same text on both paths; the mixed load saw each code."""
    cpu = json.loads((results / "cpu_per_token.json").read_text())["data"]["points"]
    assert set(cpu) == {"1", "16", "64"}
    for point in cpu.values():
        assert set(point) == {"direct", "floor", "engine", "engine_process", "per_request"}
        assert all(side["tokens"] > 0 for side in point.values())
        assert all(set(GROUPS) < side["cpu_us_per_token"].keys() for side in point.values())
    for path in ("engine", "engine_process", "per_request"):
        assert cpu["1"][path]["same_text_share"] == 1, path
    overhead = json.loads((results / "engine_overhead.json").read_text())["data"]
    assert overhead["same_text_share"] == 1.0
    kserve = json.loads((results / "kserve_overhead.json").read_text())["data"]
    assert kserve["same_text_share"] == 1.0
    scaling = json.loads((results / "concurrency_scaling.json").read_text())["data"]
    assert set(scaling["points"]) == {"1", "4", "16", "32"}
    assert all(p["same_text_share"] == 1.0 for p in scaling["points"].values())
    triton = json.loads((results / "triton_overhead.json").read_text())["data"]
    assert set(triton["points"]) == {"1", "8", "32"}
    assert triton["same_text"] is True, triton["answers"]  # the proxy does inferwire's work
    for point in triton["points"].values():
        for gateway in ("bare_proxy", "through_inferwire"):
            assert point[gateway]["cpu_us_per_request"]["total"] > 0
    codes = json.loads((results / "memory.json").read_text())["data"]["status_codes"]
    assert {"infer:OK", "infer_stream:OK", "no_model:INVALID_ARGUMENT"} <= codes.keys()
    assert "unknown_model:NOT_FOUND" in codes
    capacity = json.loads((results / "gateway_capacity.json").read_text())["data"]
    assert set(capacity["points"]) == {"16", "64", "256", "512"}
    # Tokens counted from each message's words add up to every stream's usage.
    assert all(p["token_count_mismatches"] == 0 for p in capacity["points"].values())


def test_summary_has_the_machine_and_every_target(results: Path) -> None:
    summary = (results / "README.md").read_text()
    assert "## Machine" in summary and "CPU:" in summary
    targets = summary.split("## Targets", 1)[1].split("## Scenarios", 1)[0]
    rows = [line for line in targets.splitlines() if line.startswith("|")][2:]
    assert len(rows) == TARGET_COUNT
    listed = sum(len(json.loads((results / f"{s}.json").read_text())["targets"]) for s in SMOKED)
    assert listed == TARGET_COUNT
    assert all(row.split("|")[4].strip() in ("pass", "miss") for row in rows)
    for scenario in SMOKED:
        assert f"[{scenario}]({scenario}.md)" in summary
