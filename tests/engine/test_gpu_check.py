"""scripts/gpu_check: the shell entry points parse, and the measurement runs end to end
on the bundled model (the GPU run measures a random Llama the same way;
docs/performance.md, "On a GPU")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from inferwire.backends.ort_genai import builtin_model_path
from scripts.gpu_check import measure

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    ROOT / "scripts" / "gpu_check.sh",
    ROOT / "scripts" / "gpu_wheels.sh",
    ROOT / "scripts" / "gpu_check" / "smollm2_parts.sh",
]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_explains_itself(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "--part-size" in shown.stdout or "--wheels DIR" in shown.stdout
    wrong = subprocess.run([str(script), "--no-such-flag"], capture_output=True, text=True)
    assert wrong.returncode == 2
    assert "unknown argument: --no-such-flag" in wrong.stderr


def test_measure_compares_direct_paths_and_inferwire(tmp_path: Path) -> None:
    measure.main(
        [
            "--variant",
            f"demo={builtin_model_path()}",
            "--device",
            "cpu",
            "--shape",
            "tiny",
            "--precision",
            "fp32",
            "--streams",
            "1,2",
            "--max-tokens",
            "4",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["path"], r["streams"]) for r in report["results"]}
    assert rows == {
        ("og.Engine", 1),
        ("og.Generator", 1),
        ("og.Engine", 2),
        ("inferwire", 1),
        ("inferwire", 2),
    }
    for row in report["results"]:
        assert row["tokens"] > 0
        assert row["cpu_us_per_token"]["total"] > 0
    assert report["variants"]["demo"]["dynamic_batching"] is False
    assert "| demo | 2 |" in (tmp_path / "summary.md").read_text()
