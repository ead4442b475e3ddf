"""npm packages installed once under .cache/ for the tests that run them with node (as
tests/support/side_venvs.py builds Python virtualenvs): Anthropic's TypeScript SDK and
Claude Code, each pinned."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANTHROPIC_SDK = ("@anthropic-ai/sdk", "1.17.0")
CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")


def node_modules(package: tuple[str, str]) -> Path:
    """The `node_modules` folder holding `package` (name, version), installed first when
    needed; skips when npm or the registry is out of reach."""
    name, version = package
    folder = ROOT / ".cache" / f"{name.lstrip('@').replace('/', '-')}-{version}"
    stamp = folder / ".installed"
    if stamp.is_file():
        return folder / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    install = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder), f"{name}@{version}"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if install.returncode != 0:
        pytest.skip(f"{name}@{version} could not be installed: {install.stderr[-500:]}")
    stamp.touch()
    return folder / "node_modules"
