"""The soak's pass rule at N=2000, through its one command (see soak.py)."""

import json
import subprocess
import sys

import pytest

REQUESTS = 2000


@pytest.mark.timeout(600)
def test_soak_of_2000_mixed_requests_leaks_nothing_and_answers_only_expected_codes(tmp_path):
    output = tmp_path / f"soak-{REQUESTS}.json"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "tests.reliability.soak", "--requests", str(REQUESTS)),
            *("--concurrency", "32", "--output", str(output)),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert output.is_file(), run.stdout + run.stderr
    result = json.loads(output.read_text())
    verdict = result["verdict"]
    assert verdict["unexpected"] == {}
    assert all(verdict["checks"].values()), (verdict, result["process"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert sum(result["codes"].values()) == REQUESTS
