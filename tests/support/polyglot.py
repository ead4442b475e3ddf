"""Helpers for the polyglot tier: build the generated clients with their real
toolchains and run their examples against a live `inferwire serve` process."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "clients"
TOOLS_BIN = REPO / ".tools" / "bin"


def require_tool(name: str) -> str:
    """Path to a toolchain binary; fail (not skip) when missing: CI installs them all."""
    path = shutil.which(name) or (str(TOOLS_BIN / name) if (TOOLS_BIN / name).exists() else None)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/install_tools.sh or .ci/run")
    return path


def run_checked(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a build or example step; on failure show its whole output."""
    result = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    return result


def assert_example_output(stdout: str, model: str = "demo") -> None:
    """Check what every language's example prints (see clients/*/README.md):
    INFER <text>, one DELTA <text> per streamed message, STREAM_END, HEALTH
    and the INVALID_ARGUMENT field violation."""
    lines = stdout.splitlines()
    infer = [line for line in lines if line.startswith("INFER ")]
    assert len(infer) == 1 and infer[0][len("INFER ") :].strip(" \"'") != "", stdout
    deltas = [line for line in lines if line.startswith("DELTA ")]
    assert len(deltas) > 1, stdout
    assert any(line.startswith("STREAM_END finish_reason=") for line in lines), stdout
    assert f"HEALTH model/{model} SERVING" in lines, stdout
    assert any(
        line.startswith("ERROR code=INVALID_ARGUMENT field=parameters.top_p ") for line in lines
    ), stdout
